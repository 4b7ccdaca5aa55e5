// observe/progress.cpp — the progress line and plain progress lines. See progress.h.
#include "observe/progress.h"

#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include "accumplan/errors.h"

namespace accumplan {
namespace {

double steady_now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The bar is redrawn at most this often (and always for the last step): a window of a small
// model takes milliseconds, and a terminal need not be rewritten a thousand times a second.
constexpr double kRedrawEvery_s = 0.1;
constexpr int kBarCells = 10;

// At most `columns` - 1 bytes, never cutting a UTF-8 sequence, so the line never wraps.
std::string fit_width(const std::string& text, int columns) {
  const size_t max = static_cast<size_t>(std::max(columns - 1, 20));
  if (text.size() <= max) return text;
  size_t cut = max;
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return text.substr(0, cut);
}

}  // namespace

ProgressMode parse_progress_mode(const std::string& text, const std::string& what) {
  if (text == "auto") return ProgressMode::Auto;
  if (text == "bar") return ProgressMode::Bar;
  if (text == "plain") return ProgressMode::Plain;
  if (text == "none") return ProgressMode::None;
  throw InputError(what + " must be auto, bar, plain or none, got '" + cut_for_message(text) +
                   "' (auto: one updating line on a terminal, plain lines in a log)");
}

std::string to_string(ProgressMode mode) {
  switch (mode) {
    case ProgressMode::Auto: return "auto";
    case ProgressMode::Bar: return "bar";
    case ProgressMode::Plain: return "plain";
    case ProgressMode::None: return "none";
  }
  return "auto";
}

Terminal terminal_from_environment() {
  Terminal t;
  t.stderr_is_tty = ::isatty(STDERR_FILENO) == 1;
  const char* no_color = std::getenv("NO_COLOR");
  t.no_color = no_color != nullptr && no_color[0] != '\0';
  struct winsize ws {};
  if (t.stderr_is_tty && ::ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) {
    t.columns = ws.ws_col;
  } else if (const char* cols = std::getenv("COLUMNS")) {
    const int c = std::atoi(cols);
    if (c > 0) t.columns = c;
  }
  return t;
}

ProgressMode resolve_progress_mode(ProgressMode asked, const Terminal& terminal) {
  if (asked != ProgressMode::Auto) return asked;
  return terminal.stderr_is_tty && !terminal.no_color ? ProgressMode::Bar : ProgressMode::Plain;
}

std::string format_clock(double seconds) {
  const int64_t s = seconds > 0 && std::isfinite(seconds) ? static_cast<int64_t>(std::floor(seconds)) : 0;
  char buf[48];
  if (s >= 3600) {
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(s / 60), static_cast<long long>(s % 60));
  }
  return buf;
}

std::string format_rate(double per_second, const std::string& unit) {
  char buf[64];
  const double v = per_second > 0 && std::isfinite(per_second) ? per_second : 0.0;
  if (v >= 100) {
    std::snprintf(buf, sizeof buf, "%.0f", v);
  } else if (v >= 10) {
    std::snprintf(buf, sizeof buf, "%.1f", v);
  } else if (v >= 1) {
    std::snprintf(buf, sizeof buf, "%.2f", v);
  } else {
    std::snprintf(buf, sizeof buf, "%.3g", v);
  }
  return std::string(buf) + " " + unit + "/s";
}

std::optional<double> eta_seconds(int64_t done, int64_t total, double elapsed_s) {
  if (total <= 0 || done < 1) return std::nullopt;
  if (done >= total) return 0.0;
  return elapsed_s / static_cast<double>(done) * static_cast<double>(total - done);
}

bool plain_line_due(int64_t done, int64_t total) {
  if (total <= 0 || done >= total) return true;
  if (done < 1) return false;
  return (10 * done) / total > (10 * (done - 1)) / total;  // crossed a tenth
}

Progress::Progress(std::ostream& out, ProgressMode mode, std::string unit, int64_t total, std::string prefix,
                   int columns)
    : out_(out),
      mode_(mode == ProgressMode::Auto ? ProgressMode::Plain : mode),
      unit_(std::move(unit)),
      total_(total),
      prefix_(std::move(prefix)),
      columns_(columns),
      start_s_(steady_now_s()) {}

Progress::~Progress() { finish(); }

double Progress::elapsed_s() const { return steady_now_s() - start_s_; }

std::vector<Progress::Field> Progress::fields(double elapsed_s, int64_t done, int64_t samples,
                                              const std::string& detail) const {
  // Display order; `keep` ranks what a narrow terminal keeps longest: the position, then the
  // caller's first detail (the loss, for `run`), the ETA, the bar, the elapsed time, the rate,
  // and the caller's other details last (the last one dropped first).
  std::vector<Field> f;
  f.push_back({unit_ + " " + std::to_string(done) + (total_ > 0 ? "/" + std::to_string(total_) : ""), "", 1000});
  if (total_ > 0) {
    const int64_t shown = std::min(done, total_);
    const int filled = static_cast<int>(kBarCells * shown / total_);
    f.push_back({"[" + std::string(static_cast<size_t>(filled), '#') + std::string(static_cast<size_t>(kBarCells - filled), '.') +
                     "]",
                 " ", 700});
  }
  f.push_back({format_clock(elapsed_s) + " elapsed", " ", 600});
  if (const auto eta = eta_seconds(done, total_, elapsed_s)) {
    f.push_back({done >= total_ ? std::string("done") : "ETA " + format_clock(*eta), ", ", 800});
  }
  if (samples > 0 && elapsed_s > 0) f.push_back({format_rate(static_cast<double>(samples) / elapsed_s), ", ", 500});
  int rank = 900;  // the first detail field; the others below every figure, in their order
  for (size_t start = 0; start <= detail.size() && !detail.empty();) {
    const size_t comma = detail.find(", ", start);
    const std::string part = detail.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!part.empty()) f.push_back({part, ", ", rank});
    rank = rank == 900 ? 400 : rank - 1;
    if (comma == std::string::npos) break;
    start = comma + 2;
  }
  return f;
}

std::string Progress::bar_text(double elapsed_s, int64_t done, int64_t samples, const std::string& detail) const {
  std::vector<Field> f = fields(elapsed_s, done, samples, detail);
  const size_t room = static_cast<size_t>(std::max(columns_ - 1, 20));
  const auto joined = [&]() {
    std::string s = prefix_;
    for (size_t i = 0; i < f.size(); ++i) s += (i == 0 ? "" : f[i].separator) + f[i].text;
    return s;
  };
  std::string line = joined();
  while (line.size() > room && f.size() > 1) {  // drop the least useful field, then try again
    const auto least = std::min_element(f.begin() + 1, f.end(), [](const Field& a, const Field& b) { return a.keep < b.keep; });
    f.erase(least);
    line = joined();
  }
  return fit_width(line, columns_);  // the position alone may still be too wide for a tiny terminal
}

std::string Progress::plain_text(double elapsed_s, int64_t done, int64_t samples, const std::string& detail) const {
  std::string s = prefix_ + unit_ + " " + std::to_string(done) + (total_ > 0 ? "/" + std::to_string(total_) : "") + ": " +
                  detail + "; " + format_clock(elapsed_s) + " elapsed";
  if (samples > 0 && elapsed_s > 0) s += ", " + format_rate(static_cast<double>(samples) / elapsed_s);
  if (const auto eta = eta_seconds(done, total_, elapsed_s); eta && done < total_) s += ", ETA " + format_clock(*eta);
  return s;
}

void Progress::draw(const std::string& text) {
  out_ << "\r\033[K" << text << std::flush;
  line_open_ = true;
  last_bar_ = text;
}

void Progress::update(int64_t done, int64_t samples, const std::string& detail) {
  update_at(elapsed_s(), done, samples, detail);
}

void Progress::update_at(double elapsed_s, int64_t done, int64_t samples, const std::string& detail) {
  if (mode_ == ProgressMode::None) return;
  if (mode_ == ProgressMode::Plain) {
    if (plain_line_due(done, total_) && done > last_plain_done_) {
      out_ << plain_text(elapsed_s, done, samples, detail) << "\n" << std::flush;
      last_plain_done_ = done;
    }
    return;
  }
  const bool last = total_ > 0 && done >= total_;
  if (!last && last_draw_s_ >= 0 && elapsed_s - last_draw_s_ < kRedrawEvery_s) return;
  last_draw_s_ = elapsed_s;
  draw(bar_text(elapsed_s, done, samples, detail));
}

void Progress::step(const std::string& line) { step_at(elapsed_s(), line); }

void Progress::step_at(double elapsed_s, const std::string& line) {
  if (mode_ == ProgressMode::None) return;
  if (mode_ == ProgressMode::Plain) {
    out_ << prefix_ << line << "\n" << std::flush;
    return;
  }
  draw(fit_width(prefix_ + "[" + format_clock(elapsed_s) + "] " + line, columns_));
}

void Progress::message(const std::string& line) {
  if (line_open_) out_ << "\r\033[K";
  out_ << prefix_ << line << "\n";
  if (line_open_) out_ << last_bar_;
  out_ << std::flush;
}

void Progress::finish() {
  if (!line_open_) return;
  out_ << "\n" << std::flush;
  line_open_ = false;
}

std::shared_ptr<Progress> make_stderr_progress(const std::string& mode_text, const std::string& unit, int64_t total,
                                               const std::string& prefix) {
  const Terminal t = terminal_from_environment();
  return std::make_shared<Progress>(std::cerr, resolve_progress_mode(parse_progress_mode(mode_text), t), unit, total,
                                    prefix, t.columns);
}

std::function<void(const std::string&)> step_callback(std::shared_ptr<Progress> progress) {
  return [progress = std::move(progress)](const std::string& line) { progress->step(line); };
}

}  // namespace accumplan
