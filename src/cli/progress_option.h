// cli/progress_option.h — the one declaration of `--progress auto|bar|plain|none` (default auto),
// for every command that shows progress (profile and the main job, run, the benchmark harness).
// What it is: the option and its help; `mode` receives the text, parsed with
// parse_progress_mode (observe/progress.h). Here, not in observe/: the progress line does not
// know the command line that configures it (observe sits below the commands).
#pragma once

#include <string>

#include <CLI/CLI.hpp>

#include "cli/choice.h"

namespace accumplan {

inline CLI::Option* add_progress_option(CLI::App* app, std::string& mode) {
  if (mode.empty()) mode = "auto";
  return cli::choice(app->add_option("--progress", mode,
                   "auto | bar | plain | none: auto draws one updating line (elapsed, samples/s, ETA) when stderr is "
                   "a terminal and NO_COLOR is unset, else plain lines (one per 10%); none prints no progress"))
      ->capture_default_str();
}

}  // namespace accumplan
