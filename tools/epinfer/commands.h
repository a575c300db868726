// Subcommands of the epinfer CLI. Each cmd_<name>.cc defines one add_<name>_command(), which registers
// its options and its callback on the app. A callback that fails prints one line "epinfer: error: ..."
// on stderr and exits non-zero (cli_exit_on_error).
#pragma once

#include <CLI/CLI.hpp>

#include "core/status.h"

namespace epinfer::cli {

void add_generate_command(CLI::App& app);  // cmd_generate.cc
void add_inspect_command(CLI::App& app);   // cmd_inspect.cc
void add_plan_command(CLI::App& app);      // cmd_plan.cc
void add_bench_command(CLI::App& app);     // cmd_bench.cc
void add_bench_moe_command(CLI::App& bench);  // cmd_bench_moe.cc: `bench moe`, registered by add_bench_command
void add_bench_ep_command(CLI::App& bench);   // cmd_bench_ep.cc: `bench ep`, registered by add_bench_command
void add_bench_attention_command(CLI::App& bench);  // cmd_bench_attention.cc: `bench attention`, ditto
void add_bench_serving(CLI::App& bench);  // cmd_bench_serving.cc: `bench` itself, registered by add_bench_command
void add_serve_command(CLI::App& app);     // cmd_serve.cc

// Prints "epinfer: error: <message>" and exits with status 1 when `status` is not OK.
void exit_on_error(const Status& status);

}  // namespace epinfer::cli
