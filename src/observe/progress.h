// observe/progress.h — progress a person can read: one updating line on a terminal, plain lines
// in a log.
//
// What it is: `Progress`, used by `accumplan run`, the profiler's probing and the benchmark
// harness. On a terminal (stderr is a tty, NO_COLOR unset, --progress auto or bar) it keeps ONE
// line current — carriage return, clear to end of line — with elapsed time, samples/s and ETA;
// otherwise (a pipe or file, NO_COLOR, --progress plain) it writes plain lines: one per 10% of a
// job of known length, one per step of a job of unknown length (the probes). `--progress none`
// writes nothing. The mode decision and every string are pure functions of their arguments (the
// terminal and the clock are injected), so tests check them without a terminal or a timer.
// What it is not: torch-aware, thread-safe, or a logger: warnings and recovery lines go through
// message(), which keeps them above the bar.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace accumplan {

enum class ProgressMode { Auto, Bar, Plain, None };

// "auto" | "bar" | "plain" | "none"; InputError naming the value and the choices otherwise.
ProgressMode parse_progress_mode(const std::string& text, const std::string& what = "--progress");
std::string to_string(ProgressMode mode);

// What decides "auto", read from the process by terminal_from_environment().
struct Terminal {
  bool stderr_is_tty = false;
  bool no_color = false;  // NO_COLOR is set to a non-empty value (no-color.org)
  int columns = 80;       // the terminal's width; 80 when unknown
};
Terminal terminal_from_environment();

// auto: Bar on a terminal without NO_COLOR, Plain otherwise; bar, plain and none as asked.
ProgressMode resolve_progress_mode(ProgressMode asked, const Terminal& terminal);

// Elapsed time and ETA: "0:07", "12:05", "1:02:03" (seconds rounded down).
std::string format_clock(double seconds);
// "1234 samples/s", "56.7 samples/s", "0.123 samples/s": three significant digits below 1000.
std::string format_rate(double per_second, const std::string& unit = "samples");
// Seconds left if the remaining steps take as long as the done ones; nullopt before the first.
std::optional<double> eta_seconds(int64_t done, int64_t total, double elapsed_s);
// Whether step `done` of `total` gets a plain line: the first step past each 10% and the last.
bool plain_line_due(int64_t done, int64_t total);

class Progress {
 public:
  // `mode` is resolved (not Auto: resolve_progress_mode first; Auto is taken as Plain). `total`
  // steps of `unit` ("window"), 0 when unknown; `prefix` starts every line ("accumplan: ").
  Progress(std::ostream& out, ProgressMode mode, std::string unit, int64_t total, std::string prefix = "accumplan: ",
           int columns = 80);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  // Step `done` (1-based) of a job of known length finished with `samples` samples so far;
  // `detail` follows the figures ("loss 2.31, peak 54.1 MiB"). Reads the clock since construction.
  void update(int64_t done, int64_t samples, const std::string& detail);
  void update_at(double elapsed_s, int64_t done, int64_t samples, const std::string& detail);
  // One step of a job of unknown length, described by a whole line (a probe's result). Bar: it
  // replaces the previous step on the one line, after the elapsed time; plain: a line of its own.
  void step(const std::string& line);
  void step_at(double elapsed_s, const std::string& line);
  // A line that must stay (a warning, an OOM recovery): above the bar, which is then redrawn.
  void message(const std::string& line);
  // Ends the bar's line so later output starts on a fresh one. Idempotent; the destructor calls it.
  void finish();

  ProgressMode mode() const { return mode_; }
  double elapsed_s() const;

  // The bar's whole line, without the carriage return: "window 12/120 [#.........] 0:07 elapsed,
  // ETA 1:03, 412 samples/s, " then `detail`'s comma-separated fields. It never wraps (a wrapped
  // line cannot be rewritten in place): on a narrow terminal the least useful fields are dropped
  // first — the caller's later details, the rate, the elapsed time, the bar, the ETA — so the
  // position and the caller's first detail field (the loss, in `run`) stay longest.
  std::string bar_text(double elapsed_s, int64_t done, int64_t samples, const std::string& detail) const;
  // A plain line (no newline): prefix, "window 12/120: ", detail, "; 0:07 elapsed, ...".
  std::string plain_text(double elapsed_s, int64_t done, int64_t samples, const std::string& detail) const;

 private:
  struct Field {
    std::string text;
    std::string separator;  // before it, when a field precedes it
    int keep = 0;           // the larger, the longer a narrow terminal keeps it
  };
  std::vector<Field> fields(double elapsed_s, int64_t done, int64_t samples, const std::string& detail) const;
  void draw(const std::string& text);

  std::ostream& out_;
  ProgressMode mode_;
  std::string unit_;
  int64_t total_;
  std::string prefix_;
  int columns_;
  double start_s_;
  bool line_open_ = false;       // the bar's line is on screen without a newline
  std::string last_bar_;         // redrawn after a message()
  double last_draw_s_ = -1;
  int64_t last_plain_done_ = 0;
};

// A Progress for this process's stderr: `mode_text` parsed (--progress) and resolved against
// the terminal. InputError for a bad mode.
std::shared_ptr<Progress> make_stderr_progress(const std::string& mode_text, const std::string& unit, int64_t total,
                                               const std::string& prefix = "accumplan: ");

// The ProbeRunnerOptions::progress callback (one whole line per real step) feeding `progress`
// through Progress::step; it shares ownership, so it may outlive the caller's pointer.
std::function<void(const std::string&)> step_callback(std::shared_ptr<Progress> progress);

}  // namespace accumplan
