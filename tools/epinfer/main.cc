// epinfer: the command-line tool. Usage: epinfer <generate|inspect|plan|bench|serve> --help, epinfer
// --version
#include <cstdio>
#include <cstdlib>
#include <string>

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

namespace {

// One line for a command-line usage error, e.g.
//   epinfer: error: --prompt-ids is required (see 'epinfer generate --help')
//   epinfer: error: --cases: 1 required TEXT missing (see 'epinfer bench attention --help')
int report_usage_error(const CLI::App& app, const CLI::ParseError& error, int argc, char** argv) {
    std::string message = error.what();
    for (char& c : message)
        if (c == '\n' || c == '\r') c = ' ';
    std::string command;
    if (argc > 1 && argv[1][0] != '-') {
        command = argv[1];
        std::string known;
        bool is_known = false;
        for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
            known += (known.empty() ? "" : ", ") + sub->get_name();
            is_known = is_known || sub->get_name() == command;
        }
        if (!is_known) {
            message = "unknown command '" + command + "' (commands: " + known + ")";
            command.clear();
        } else if (argc > 2 && argv[2][0] != '-') {
            // A command's own command (bench moe, bench attention, ...): its help is the one to read.
            const CLI::App* sub = app.get_subcommand(command);  // known: found above
            for (const CLI::App* inner : sub->get_subcommands([](const CLI::App*) { return true; })) {
                if (inner->get_name() == argv[2]) command += " " + inner->get_name();
            }
        }
    }
    std::fprintf(stderr, "epinfer: error: %s (see 'epinfer%s --help')\n", message.c_str(),
                 command.empty() ? "" : (" " + command).c_str());
    return 1;
}

}  // namespace

// Exit status: 0 on success, 1 on any error (a usage error or epinfer::cli::exit_on_error).
int main(int argc, char** argv) {
    CLI::App app{"epinfer: an inference runtime for Mixture-of-Experts models"};
    app.require_subcommand(1);
    app.set_version_flag("--version", std::string("epinfer ") + EPINFER_VERSION);
    epinfer::cli::add_generate_command(app);
    epinfer::cli::add_inspect_command(app);
    epinfer::cli::add_plan_command(app);
    epinfer::cli::add_bench_command(app);
    epinfer::cli::add_serve_command(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::Success& e) {  // --help and the like (CallForHelp and CallForAllHelp derive from it)
        return app.exit(e);
    } catch (const CLI::ParseError& e) {
        return report_usage_error(app, e, argc, argv);
    }
    return 0;
}
