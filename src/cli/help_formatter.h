// cli/help_formatter.h — `--help` that reads well at 100 columns.
//
// What it is: CLI11's formatter with every description (options, subcommands, the app's own)
// wrapped at word boundaries so that no help line runs past kHelpColumns; CLI11 2.1 prints each
// description on one line (22 lines of `accumplan --help` ran past 120 columns). Set on the root
// app before the subcommands are added: each subcommand copies its parent's formatter.
// What it is not: a change of any option's text; a word longer than the room is left whole.
#pragma once

#include <CLI/CLI.hpp>

#include <sstream>
#include <string>

namespace accumplan::cli {

constexpr std::size_t kHelpColumns = 100;

// `text` re-flowed to lines of at most `width` characters, breaking at spaces; existing line
// breaks are kept. Leading spaces of a line (an indented example) are kept as they are.
inline std::string wrap_help_text(const std::string& text, std::size_t width) {
  std::string out;
  std::istringstream lines(text);
  std::string line;
  bool first_line = true;
  while (std::getline(lines, line)) {
    if (!first_line) out += '\n';
    first_line = false;
    const std::size_t indent = line.find_first_not_of(' ');
    if (line.size() <= width || indent == std::string::npos) {
      out += line;
      continue;
    }
    std::size_t col = 0;
    std::istringstream words(line.substr(indent));
    std::string word;
    out += line.substr(0, indent);
    col = indent;
    bool first_word = true;
    while (words >> word) {
      if (!first_word && col + 1 + word.size() > width) {
        out += '\n' + std::string(indent, ' ');
        col = indent;
      } else if (!first_word) {
        out += ' ';
        ++col;
      }
      out += word;
      col += word.size();
      first_word = false;
    }
  }
  if (!text.empty() && text.back() == '\n') out += '\n';
  return out;
}

class HelpFormatter : public CLI::Formatter {
 public:
  HelpFormatter() { column_width(32); }

  std::string make_option_desc(const CLI::Option* opt) const override {
    return wrap_help_text(CLI::Formatter::make_option_desc(opt), description_width());
  }

  std::string make_subcommand(const CLI::App* sub) const override {
    std::stringstream out;
    CLI::detail::format_help(out, sub->get_display_name(true), wrap_help_text(sub->get_description(), description_width()),
                             get_column_width());
    return out.str();
  }

  std::string make_description(const CLI::App* app) const override {
    return wrap_help_text(CLI::Formatter::make_description(app), kHelpColumns);
  }

  std::string make_footer(const CLI::App* app) const override {
    return wrap_help_text(CLI::Formatter::make_footer(app), kHelpColumns);
  }

 private:
  // Descriptions start at the name column's width (format_help pads names to it).
  std::size_t description_width() const { return kHelpColumns - get_column_width(); }
};

}  // namespace accumplan::cli
