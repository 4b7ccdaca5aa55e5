// accumplan/terms.h — how the planner's messages name the user's options: in the words of the
// front end that asked.
//
// What it is: one process-wide setting, the front end (the `accumplan` command line by default;
// the Python package's accumplan._core sets Python when it loads), and the one table of each
// command-line option's Python argument, so a message says "--target-batch" to a shell user and
// "target_batch" to a Python caller from one source, and advice to plan again says
// "`accumplan plan --target-batch`" or "accumplan.plan(..., target_batch=...)".
// What it is not: a translator of finished text (a message is built in the right words), nor the
// names of options only the command line has (--to, --out, torchrun's flags), which callers write
// as they are; an option with no Python argument keeps its command-line spelling here too.
#pragma once

#include <string>
#include <vector>

namespace accumplan {

enum class FrontEnd { Cli, Python };

// The front end whose words messages use from now on, in this process (Cli until set).
void set_front_end(FrontEnd front_end);
FrontEnd front_end();

// `cli_option` ("--target-batch") as the front end names it: itself for the command line; for
// Python its argument ("target_batch"), or what stands for it ("the optimizer's lr", "the plan"),
// or itself when Python has none ("--batch-file").
std::string option_name(const std::string& cli_option);

// Advice to plan again, with these options named: "`accumplan plan --target-batch`" for the
// command line, "accumplan.plan(..., target_batch=...)" for Python (no options: "`accumplan plan`",
// "accumplan.plan(...)").
std::string plan_command(const std::vector<std::string>& cli_options = {});

}  // namespace accumplan
