// cli_stdout.h — runs the real `accumplan` binary with its standard output sent somewhere chosen,
// for the full-disk cases: /dev/full, where every write fails with ENOSPC.
// (Its own header, beside cli_runner.h, so the test files that do not use it keep their builds.)
#pragma once

#include <string>
#include <vector>

#include "cli_runner.h"

namespace accumplan::test {

// As run_cli, with standard output opened at `stdout_path` (write only); `out` is empty.
CliResult run_cli_with_stdout(const std::string& stdout_path, const std::vector<std::string>& args,
                              int timeout_seconds = 600);

}  // namespace accumplan::test
