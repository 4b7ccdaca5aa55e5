// tests/fuzz/fuzz_target.h — what every fuzz target here shares: an input either parses or is
// refused with accumplan's InputError (exit 2, one line); anything else escaping — another
// exception, a crash, a sanitizer report, a hang — is a finding.
//
// What it is: the one rule, `expect_refusal_or_success`, which aborts on any exception that is
// not an InputError (libFuzzer then saves the input) and checks that a refusal is one line.
// What it is not: a fuzzer. Built with clang, each target links libFuzzer (-fsanitize=fuzzer);
// otherwise replay_main.cpp runs the committed corpus through it (ctest, every build).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "accumplan/errors.h"

namespace accumplan::fuzz {

template <class F>
void expect_refusal_or_success(F&& f) {
  try {
    f();
  } catch (const InputError& e) {
    const std::string msg = e.what();
    // One line, and not an echo of a huge input: the contract of every refusal.
    if (msg.find('\n') != std::string::npos || msg.size() > 2000) {
      std::fprintf(stderr, "fuzz: refusal is not one short line (%zu chars): %.300s\n", msg.size(), msg.c_str());
      std::abort();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz: escaped as an internal error: %.500s\n", e.what());
    std::abort();
  }
}

}  // namespace accumplan::fuzz
