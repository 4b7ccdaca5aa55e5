// cli/no_torch_commands.cpp — the device commands of an accumplan built without LibTorch.
//
// They parse like the real ones would, then fail with BackendNotBuiltError (exit 2) saying how to
// rebuild, so `accumplan --model m.pt` on a planner-only build is a clear message, not
// "unknown option".
#include <CLI/CLI.hpp>

#include "accumplan/build_config.h"
#include "accumplan/errors.h"
#include "cli/commands.h"

namespace accumplan::cli {

Command add_device_commands(CLI::App& root, std::vector<Command>& commands) {
  auto fail = []() -> int { throw BackendNotBuiltError(reconfigure_hint("torch")); };
  for (const char* name : {"profile", "run", "verify"}) {
    CLI::App* sub = root.add_subcommand(name, std::string(name) + " (needs LibTorch; not in this build)");
    sub->allow_extras();
    commands.push_back({sub, fail});
  }
  root.allow_extras();
  return {&root, [&root]() -> int {
            if (root.remaining_size() == 0) {
              throw InputError("nothing to do; run `accumplan --help` (this build has no LibTorch: " +
                               std::string("only `plan` and `export` work)"));
            }
            throw BackendNotBuiltError(reconfigure_hint("torch"));
          }};
}

}  // namespace accumplan::cli
