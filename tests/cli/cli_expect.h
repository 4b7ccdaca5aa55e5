// tests/cli/cli_expect.h — the one assertion every bad-input CLI case makes: exit code 2, one
// "accumplan: error:" line that mentions what was wrong, nothing on stdout.
//
// Include it after Catch2 (it uses Catch's macros but does not include Catch itself: LibTorch
// tests must include Catch after LibTorch, for glog's CHECK, and cli_runner.h stays Catch-free).
#pragma once

#include <algorithm>
#include <filesystem>
#include <set>
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

inline std::set<std::string> listing(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) names.insert(e.path().filename().string());
  return names;
}

// The hostile-input contract: exit 2, exactly one "accumplan: error:" line holding
// `needle` and under 600 characters (a long bad value is cut to 80), stdout empty, and the scratch
// directory `dir` exactly as it was (no output file, no temp file).
inline void expect_refusal(const std::string& dir, const std::vector<std::string>& args, const std::string& needle) {
  const std::set<std::string> before = listing(dir);
  const CliResult r = run_cli(args, 30);
  INFO("args: " << [&] { std::string s; for (const auto& a : args) s += a.substr(0, 100) + " "; return s; }());
  INFO("stderr: " << r.err.substr(0, 2000));
  CHECK(r.exit_code == 2);
  CHECK(r.out.empty());
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  CHECK(r.err.rfind("accumplan: error: ", 0) == 0);
  CHECK(r.err.find(needle) != std::string::npos);
  CHECK(r.err.size() < 600);
  CHECK(listing(dir) == before);
}

}  // namespace accumplan::test
