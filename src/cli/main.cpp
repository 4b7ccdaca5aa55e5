// cli/main.cpp — the `accumplan` command line: parse, dispatch, map errors to exit codes (the
// executables' entry.cpp and Python's `python -m accumplan` call run_command_line).
//
// Exit codes: 0 ok, 2 bad input or infeasible plan (accumplan::InputError and CLI parse errors),
// 1 internal error. Error messages go to stderr as one line starting with "accumplan: error:".
#include <CLI/CLI.hpp>

#include <exception>
#include <iostream>
#include <string>
#include <vector>

#include "accumplan/build_config.h"
#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "cli/commands.h"
#include "cli/help_formatter.h"

namespace accumplan::cli {

void emit_output(const std::string& path, const std::string& text) {
  write_text_atomic(path.empty() ? "-" : path, text);  // "-": written, flushed and checked (write_stdout)
}

void emit_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  // Files first, standard output last: a file that cannot be written leaves nothing on stdout.
  for (const auto& [path, text] : outputs) {
    if (!path.empty() && path != "-") write_text_atomic(path, text);
  }
  for (const auto& [path, text] : outputs) {
    if (path.empty() || path == "-") write_stdout(text);
  }
}

OutputOption output_option(const CLI::App* app, const std::string& name, const std::string& path,
                           bool stdout_when_absent) {
  return OutputOption{name, path, app->count(name) > 0, stdout_when_absent};
}

namespace {

// `accumplan help [COMMAND]` is `accumplan [COMMAND] --help`: the words people type first.
// Returns the arguments to parse; InputError for `help` with anything but one command name.
std::vector<std::string> with_help_command(int argc, char** argv, const CLI::App& app) {
  std::vector<std::string> args(argv, argv + argc);
  if (args.size() < 2 || args[1] != "help") return args;
  if (args.size() == 2) return {args[0], "--help"};
  std::string names;
  for (const CLI::App* sub : app.get_subcommands({})) {
    if (args.size() == 3 && sub->get_name() == args[2]) return {args[0], args[2], "--help"};
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  throw InputError("`accumplan help` takes one command name (" + names + "), got '" +
                   cut_for_message(args.size() == 3 ? args[2] : args[2] + " " + args[3]) + "'");
}

// CLI11's words for an option given twice ("--out: At Most 1 required but received 2") said as
// the product says everything else; other parse errors keep CLI11's text.
std::string parse_error_text(const CLI::ParseError& e) {
  const std::string text = e.what();
  const std::string marker = ": At Most 1 required but received ";
  const std::size_t at = text.find(marker);
  if (at == std::string::npos) return text;
  return text.substr(0, at) + " was given " + text.substr(at + marker.size()) + " times; give it once";
}

// One syntax for every integer option: decimal digits with an optional sign. CLI11 reads integers
// with base 0: `--target-batch 010` planned 8 samples (octal), `0x10` 16 and '' 0 ("must be at least
// 1, got 0"). The validator runs on the text before CLI11 converts it, and drops leading zeros.
void decimal_integers(CLI::App& app) {
  const CLI::Validator decimal(
      [](std::string& text) -> std::string {
        const size_t digits = text.find_first_not_of("+-") == 1 ? 1 : 0;
        if (text.size() <= digits || text.find_first_not_of("0123456789", digits) != std::string::npos) {
          return "'" + cut_for_message(text, 40) + "' is not a decimal integer";
        }
        const size_t first = text.find_first_not_of('0', digits);
        text = text.substr(0, digits) + (first == std::string::npos ? "0" : text.substr(first));
        return "";
      },
      "", "decimal");
  for (CLI::Option* o : app.get_options()) {
    if (o->get_type_name() == "INT" || o->get_type_name() == "UINT") o->transform(decimal);
  }
  for (CLI::App* sub : app.get_subcommands({})) decimal_integers(*sub);
}

// `code`, or kExitInput with one line when standard output could not take what was written to it
// (help or the version on a full disk): CLI11 and the commands' stdout writes end here checked.
int checked_stdout(int code) {
  try {
    write_stdout("");  // flushes; throws when this or an earlier write to stdout failed
  } catch (const InputError& e) {
    std::cerr << "accumplan: error: " << one_line(e.what()) << "\n";
    return kExitInput;
  }
  return code;
}

// Without the device commands (Python's `python -m accumplan`): the root has no job of its own.
Command planner_only_root(CLI::App& app) {
  return {&app, []() -> int {
            throw InputError("this runs the planner's commands only: plan, export and report (measure and train with "
                             "accumplan.plan and plan.train_window, or with the accumplan executable)");
          }};
}

}  // namespace

int run_command_line(int argc, char** argv, DeviceCommands add_device_commands) {
  CLI::App app{
      "accumplan: measure a PyTorch model on its device, plan the largest microbatch that fits and\n"
      "the gradient accumulation that reaches your effective batch, and run that plan with exact\n"
      "weighting and OOM recovery.\n\n"
      "  accumplan --model m.pt --target-batch 256 --input float32[B,3,224,224] --target int64[B]:1000\n"
      "  accumplan plan --profile profile.json --target-batch 512 --memory-budget 12GiB\n"
      "  accumplan export --plan plan.json --to deepspeed\n",
      "accumplan"};
  app.set_version_flag("--version", std::string("accumplan ") + ACCUMPLAN_VERSION + " (" +
                                        build_summary() + ")");
  app.require_subcommand(0, 1);
  app.formatter(std::make_shared<cli::HelpFormatter>());  // before the subcommands: they copy it
  app.footer("Exit codes: 0 ok, 2 bad input or infeasible plan, 1 internal error.\n"
             "Sizes: 512MiB, 12GiB, 1.5GB, 2048 (bytes), or 90% of the device.");

  std::vector<cli::Command> commands;
  cli::add_planner_commands(app, commands);
  const cli::Command root_job = add_device_commands ? add_device_commands(app, commands) : planner_only_root(app);
  // --verbose, declared once here for the root and every command: an error's details (a model's
  // TorchScript traceback) under its one line.
  bool verbose = false;
  const std::string verbose_help = "on an error, also print its details (e.g. the model's TorchScript traceback)";
  app.add_flag("--verbose", verbose, verbose_help);
  for (CLI::App* sub : app.get_subcommands({})) sub->add_flag("--verbose", verbose, verbose_help);
  cli::decimal_integers(app);

  std::vector<std::string> args;
  try {
    args = cli::with_help_command(argc, argv, app);
  } catch (const InputError& e) {
    std::cerr << "accumplan: error: " << one_line(e.what()) << "\n";
    return kExitInput;
  }
  std::vector<char*> arg_pointers;
  for (const std::string& a : args) arg_pointers.push_back(const_cast<char*>(a.c_str()));
  try {
    app.parse(static_cast<int>(arg_pointers.size()), arg_pointers.data());
  } catch (const CLI::CallForHelp& e) {
    return cli::checked_stdout(app.exit(e));
  } catch (const CLI::CallForAllHelp& e) {
    return cli::checked_stdout(app.exit(e));
  } catch (const CLI::CallForVersion& e) {
    return cli::checked_stdout(app.exit(e));
  } catch (const CLI::ExtrasError&) {
    // CLI11 lists the extras back to front ("uniform --split"); say them as typed, and where.
    CLI::App* where = &app;
    for (CLI::App* sub : app.get_subcommands({})) {
      if (sub->parsed()) where = sub;
    }
    std::string extras;
    for (const std::string& arg : where->remaining()) extras += (extras.empty() ? "" : " ") + arg;
    const std::string command = where == &app ? "accumplan" : "accumplan " + where->get_name();
    std::cerr << "accumplan: error: `" << command << "` does not take " << cut_for_message(extras) << " (run `"
              << command << " --help` for its options)\n";
    return kExitInput;
  } catch (const CLI::ParseError& e) {
    // One line, as every other refusal: the contract scripts and tests rely on.
    std::cerr << "accumplan: error: " << cut_for_message(cli::parse_error_text(e), 300) << " (run with --help for usage)\n";
    return kExitInput;
  }

  try {
    for (const auto& c : commands) {
      if (c.app != &app && c.app->parsed()) return cli::checked_stdout(c.run());
    }
    return cli::checked_stdout(root_job.run());
  } catch (const accumplan::Error& e) {
    // One line whatever a value echoed into the message held (a newline in an option's value).
    std::cerr << "accumplan: error: " << one_line(e.what());
    if (!e.detail().empty()) {
      if (verbose) {
        std::cerr << "\n" << e.detail();
      } else {
        std::cerr << " (--verbose shows the details)";
      }
    }
    std::cerr << "\n";
    return e.exit_code();
  } catch (const std::exception& e) {
    std::cerr << "accumplan: internal error: " << e.what()
              << "\nThis is a bug in accumplan; please report it with the command line.\n";
    return kExitInternal;
  }
}

}  // namespace accumplan::cli
