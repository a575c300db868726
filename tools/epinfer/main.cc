// epinfer: the command-line tool. Usage: epinfer <generate|inspect|plan|bench> --help
#include <cstdio>
#include <cstdlib>

#include <CLI/CLI.hpp>

#include "commands.h"

namespace epinfer::cli {

void exit_on_error(const Status& status) {
    if (status.is_ok()) return;
    std::fprintf(stderr, "epinfer: error: %s\n", status.message().c_str());
    std::fflush(stderr);
    std::exit(1);
}

}  // namespace epinfer::cli

int main(int argc, char** argv) {
    CLI::App app{"epinfer: an inference runtime for Mixture-of-Experts models"};
    app.require_subcommand(1);
    // Subcommands are registered here as they land (each file cmd_<name>.cc).
    epinfer::cli::add_generate_command(app);
    epinfer::cli::add_inspect_command(app);
    epinfer::cli::add_plan_command(app);
    epinfer::cli::add_bench_command(app);
    CLI11_PARSE(app, argc, argv);
    return 0;
}
