// cli/choice.h — options whose value is one of a few words take it in any case.
//
// What it is: `choice(option)` lowers an option's value to ASCII lower case before its parser
// sees it, so `--to DeepSpeed`, `--amp BF16` and `--device CPU` mean what they say. Declared on
// the option itself, once, where the option is declared. Values that are not words (paths, specs,
// sizes) never go through it.
// What it is not: a parser: each value still has its one parser, which names the accepted words.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

namespace accumplan::cli {

inline std::string ascii_lower(std::string s) {
  for (char& c : s) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return s;
}

inline CLI::Option* choice(CLI::Option* option) {
  return option->transform([](std::string value) { return ascii_lower(std::move(value)); }, "", "choice");
}

// Whether `option` was on the command line, its value empty or not: an empty word given is a
// word its parser refuses (naming the words it takes), never taken for the option's absence.
inline bool given(const CLI::Option* option) { return option != nullptr && option->count() > 0; }

}  // namespace accumplan::cli
