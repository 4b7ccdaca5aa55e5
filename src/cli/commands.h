// cli/commands.h — how the `accumplan` executable is put together from command modules.
//
// What it is: each module adds its CLI11 subcommands (or, for the device commands, the root's own
// options: `accumplan --model m.pt --target-batch 256`) and returns what to run once parsing
// succeeded. main.cpp owns error handling and exit codes (errors.h).
// What it is not: torch-aware. This header and the planner commands compile without LibTorch;
// the device commands come from device_commands.cpp (LibTorch) or no_torch_commands.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "accumplan/outputs.h"

namespace CLI {
class App;
}

namespace accumplan::cli {

struct Command {
  CLI::App* app = nullptr;       // the subcommand, or the root app for the root's own job
  std::function<int()> run;      // returns the exit code; throws accumplan::Error on failure
};

// Returns when this executable runs the command line itself. The `accumplan` front of a LibTorch
// build (front_dispatch.cpp) runs only plan, export, report and --version, without loading
// LibTorch, and replaces itself (execv) with accumplan-device for everything else;
// accumplan-device and the planner-only build run everything (in_process.cpp).
void hand_over_device_commands(int argc, char** argv);

// The command line, parsed and run: its exit code, every refusal one line on stderr.
// `add_device_commands`: the root's job and the device commands (add_device_commands below);
// nullptr: the planner's commands only (Python's `python -m accumplan`).
using DeviceCommands = Command (*)(CLI::App& root, std::vector<Command>& commands);
int run_command_line(int argc, char** argv, DeviceCommands add_device_commands);

// `plan`, `export` and `report`: torch-free.
void add_planner_commands(CLI::App& root, std::vector<Command>& commands);

// The root's own job (profile + plan + confirm) and `profile`, `run`, `verify`. Without LibTorch
// these exist too and fail with BackendNotBuiltError explaining how to rebuild. Returns the
// root's job.
Command add_device_commands(CLI::App& root, std::vector<Command>& commands);

// `run` and `verify` (executor_commands.cpp, LibTorch only); called from add_device_commands.
void add_executor_commands(CLI::App& root, std::vector<Command>& commands);

// --threads, declared once for every device command: CPU threads for LibTorch
// (at::set_num_threads), in [1, kMaxThreads]; `threads` stays 0 when the option is not given.
inline constexpr int kMaxThreads = 1024;
void add_threads_option(CLI::App* app, int& threads, const std::string& group);
// at::set_num_threads(threads) when given (threads > 0); LibTorch's default otherwise.
void apply_threads(int threads);

// --seq-len-file, declared once for the commands that take observed sequence lengths (the main
// job and `profile`: the lengths to plan for; `run`: synthetic data drawn from them).
void add_seq_len_file_option(CLI::App* app, std::string& path, const std::string& help, const std::string& group);
// The lengths in `path` (parse_seq_len_list); InputError naming the file.
std::vector<int64_t> read_seq_len_file(const std::string& path);

// Writes `text` to `path` atomically, or to stdout when `path` is empty or "-".
void emit_output(const std::string& path, const std::string& text);
// Several outputs of one command, as (path, text): the files first, then standard output, so a
// file that cannot be written (a full disk) leaves nothing on stdout. Every write is checked.
void emit_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

// The output option `name` of `app` with its value, for check_outputs (accumplan/outputs.h):
// given when it was on the command line; `stdout_when_absent` for an output that then goes to
// standard output.
OutputOption output_option(const CLI::App* app, const std::string& name, const std::string& path,
                           bool stdout_when_absent = false);

}  // namespace accumplan::cli
