// tests/cli/cli_expect.h — the one assertion every bad-input CLI case makes: exit code 2, one
// "accumplan: error:" line that mentions what was wrong, nothing on stdout.
//
// Include it after Catch2 (it uses Catch's macros but does not include Catch itself: LibTorch
// tests must include Catch after LibTorch, for glog's CHECK, and cli_runner.h stays Catch-free).
#pragma once

#include <string>
#include <vector>

#include "cli_runner.h"

namespace accumplan::test {

inline void expect_input_error(const std::vector<std::string>& args, const std::string& needle) {
  const CliResult r = run_cli(args);
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("accumplan: error:") != std::string::npos);
  CHECK(r.err.find(needle) != std::string::npos);
  CHECK(r.out.empty());
}

}  // namespace accumplan::test
