// cli/front_dispatch.cpp — the `accumplan` front of a LibTorch build: the planner's commands run
// here, every other command line is handed to accumplan-device with execv.
//
// Why: linking LibTorch costs every start about 0.8 s of CPU before main() (Debian's 1.13 loads
// 286 shared libraries and registers its operators; measured: an empty main linked to
// libtorch_cpu takes 1.6 s of wall time on a busy 2-core machine, 0.03 s without). `plan`,
// `export`, `report` and `--version` need no LibTorch, and scripts call them in loops; the test
// suite's 28 CLI tests took 141 s against the torch binary and 3.5 s against a torch-free one.
// What it is not: a second CLI. accumplan-device is the whole CLI (main.cpp with the device
// commands); this front is the same main.cpp and planner commands without them, so a planner
// command parses and answers the same from either executable.
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "accumplan/errors.h"
#include "cli/commands.h"

namespace accumplan::cli {
namespace {

bool is_planner_command(const std::string& word) {
  return word == "plan" || word == "export" || word == "report";
}

// Whether this command line runs in the front: the planner's commands (and `help` for one of
// them) and --version; everything else, the root's own job and `help` included, needs the list
// of device commands or LibTorch itself.
bool runs_here(int argc, char** argv) {
  if (argc < 2) return false;
  const std::string first = argv[1];
  if (is_planner_command(first)) return true;
  if (first == "--version") return argc == 2;
  return first == "help" && argc == 3 && is_planner_command(argv[2]);
}

// The folder of this executable (/proc/self/exe), with a trailing '/'; "" when unreadable.
std::string own_folder() {
  std::vector<char> buffer(4096);
  const ssize_t n = readlink("/proc/self/exe", buffer.data(), buffer.size() - 1);
  if (n <= 0) return "";
  const std::string path(buffer.data(), static_cast<size_t>(n));
  return path.substr(0, path.rfind('/') + 1);
}

}  // namespace

void hand_over_device_commands(int argc, char** argv) {
  if (runs_here(argc, argv)) return;
  const std::string folder = own_folder();
  // Beside the front in the build tree (build/accumplan-device); under libexec/ once installed.
  for (const std::string candidate : {folder + "accumplan-device", folder + "../libexec/accumplan/accumplan-device"}) {
    if (access(candidate.c_str(), X_OK) != 0) continue;
    execv(candidate.c_str(), argv);
    std::cerr << "accumplan: internal error: cannot start " << candidate << ": " << std::strerror(errno) << "\n";
    std::exit(kExitInternal);
  }
  std::cerr << "accumplan: error: the device commands' executable accumplan-device is not beside " << folder
            << "accumplan nor in " << folder << "../libexec/accumplan/ (rebuild with cmake --build, or reinstall)\n";
  std::exit(kExitInternal);
}

}  // namespace accumplan::cli
