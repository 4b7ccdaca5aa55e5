// cli_runner.h — runs the real `accumplan` binary for CLI tests and captures what it did.
#pragma once

#include <string>
#include <vector>

namespace accumplan::test {

struct CliResult {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

// Runs ACCUMPLAN_BIN with `args` (no shell), waiting at most `timeout_seconds`.
CliResult run_cli(const std::vector<std::string>& args, int timeout_seconds = 600);
// Runs another executable `bin` the same way (a copy of accumplan somewhere else).
CliResult run_binary(const std::string& bin, const std::vector<std::string>& args);

// A fresh, empty directory under the test binary directory.
std::string scratch_dir(const std::string& name);

std::string source_path(const std::string& rel);

// The golden profile and plan (tests/golden/), the inputs most CLI cases plan and export from.
inline const std::string kProfile = source_path("tests/golden/profile.json");
inline const std::string kPlan = source_path("tests/golden/plan.json");
std::string slurp(const std::string& path);

}  // namespace accumplan::test
