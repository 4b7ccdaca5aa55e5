// accumplan/outputs.h — every output of a command checked before the command does any work.
//
// What it is: one check, run first by every command that writes files, so a mistake in an output
// path costs a second instead of a profile or a training run, and a failure after the work never
// leaves one output written and another refused. An output is refused when it is given as ''
// (use - for standard output), names a directory or a socket, sits in a directory that does not
// exist or cannot be written, is the same file as another output or as an input, or is the second
// output on standard output ('-', or a path that is the process's own standard output).
// What it is not: the writing (write_text_atomic in json_io.h stays the only writer), or a lock:
// a directory removed between the check and the write is still reported, by the writer.
#pragma once

#include <string>
#include <vector>

namespace accumplan {

struct OutputOption {
  std::string option;           // "--report", as messages name it
  std::string path;             // as given; "-" is standard output
  bool given = true;            // false: not on the command line, nothing to check (unless to_stdout_when_absent)
  bool to_stdout_when_absent = false;  // e.g. the main job's --out: absent means standard output
};

struct InputOption {
  std::string option;  // "--profile"
  std::string path;    // a file the command reads; "" or a name that is not a file is skipped
};

// InputError naming the option, the path (path_for_message) and the fix, in one line.
void check_outputs(const std::vector<OutputOption>& outputs, const std::vector<InputOption>& inputs = {});

}  // namespace accumplan
