// test_progress.cpp — the progress line's decisions and strings, with the terminal and the clock
// injected: which mode a terminal, a pipe or NO_COLOR get, the elapsed/rate/ETA strings, the
// 10% rule of plain lines, the bar's carriage return and width.
// What it is not: a timing test. No assertion depends on how long anything takes.
#include <catch2/catch.hpp>

#include <iostream>
#include <sstream>
#include <string>

#include "accumplan/errors.h"
#include "observe/progress.h"

using namespace accumplan;

namespace {

size_t count_of(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

}  // namespace

TEST_CASE("progress: auto draws a bar on a terminal, plain lines in a pipe or with NO_COLOR", "[progress]") {
  CHECK(resolve_progress_mode(ProgressMode::Auto, {true, false, 80}) == ProgressMode::Bar);
  CHECK(resolve_progress_mode(ProgressMode::Auto, {false, false, 80}) == ProgressMode::Plain);
  CHECK(resolve_progress_mode(ProgressMode::Auto, {true, true, 80}) == ProgressMode::Plain);
  // What was asked for wins over the terminal.
  CHECK(resolve_progress_mode(ProgressMode::Plain, {true, false, 80}) == ProgressMode::Plain);
  CHECK(resolve_progress_mode(ProgressMode::Bar, {false, true, 80}) == ProgressMode::Bar);
  CHECK(resolve_progress_mode(ProgressMode::None, {true, false, 80}) == ProgressMode::None);
}

TEST_CASE("progress: --progress values are parsed, a bad one is refused by name", "[progress][errors]") {
  for (const std::string m : {"auto", "bar", "plain", "none"}) CHECK(to_string(parse_progress_mode(m)) == m);
  CHECK_THROWS_AS(parse_progress_mode("fancy"), InputError);
  CHECK_THROWS_WITH(parse_progress_mode("fancy"), Catch::Contains("--progress must be auto, bar, plain or none, got 'fancy'"));
}

TEST_CASE("progress: elapsed time, rate and ETA read as a person writes them", "[progress]") {
  CHECK(format_clock(0) == "0:00");
  CHECK(format_clock(7.9) == "0:07");
  CHECK(format_clock(725) == "12:05");
  CHECK(format_clock(3723) == "1:02:03");
  CHECK(format_clock(-3) == "0:00");
  CHECK(format_rate(1234.4) == "1234 samples/s");
  CHECK(format_rate(56.72) == "56.7 samples/s");
  CHECK(format_rate(3.456) == "3.46 samples/s");
  CHECK(format_rate(0.1234) == "0.123 samples/s");
  CHECK(format_rate(2, "tokens") == "2.00 tokens/s");
  CHECK_FALSE(eta_seconds(0, 10, 5.0));
  CHECK_FALSE(eta_seconds(3, 0, 5.0));     // unknown length: no ETA
  CHECK(*eta_seconds(2, 10, 5.0) == Approx(20.0));  // 2.5 s per step, 8 left
  CHECK(*eta_seconds(10, 10, 5.0) == 0.0);
}

TEST_CASE("progress: plain lines come once per tenth of the job, and for the last step", "[progress]") {
  int lines = 0;
  for (int64_t d = 1; d <= 25; ++d) lines += plain_line_due(d, 25) ? 1 : 0;
  CHECK(lines == 10);
  CHECK(plain_line_due(25, 25));
  for (int64_t d = 1; d <= 4; ++d) CHECK(plain_line_due(d, 4));  // fewer than 10 steps: every one
  lines = 0;
  for (int64_t d = 1; d <= 1000; ++d) lines += plain_line_due(d, 1000) ? 1 : 0;
  CHECK(lines == 10);
}

TEST_CASE("progress: plain mode writes whole lines with elapsed, rate and ETA, never a carriage return", "[progress]") {
  std::ostringstream out;
  {
    Progress p(out, ProgressMode::Plain, "window", 20);
    for (int64_t d = 1; d <= 20; ++d) p.update_at(0.5 * static_cast<double>(d), d, 64 * d, "loss 2.3");
    p.message("out of memory in window 3; re-planned");
  }
  const std::string text = out.str();
  CHECK(text.find('\r') == std::string::npos);
  CHECK(text.find('\033') == std::string::npos);
  CHECK(count_of(text, "\n") == 11);  // 10 progress lines and the message
  // Window 2 of 20 at 1 s, 128 samples: 128 samples/s, 18 windows left at 0.5 s each.
  CHECK(text.find("accumplan: window 2/20: loss 2.3; 0:01 elapsed, 128 samples/s, ETA 0:09\n") != std::string::npos);
  CHECK(text.find("accumplan: window 20/20: loss 2.3; 0:10 elapsed, 128 samples/s\n") != std::string::npos);
  CHECK(text.find("accumplan: out of memory in window 3; re-planned\n") != std::string::npos);
}

TEST_CASE("progress: the bar rewrites one line in place and ends it once", "[progress]") {
  std::ostringstream out;
  Progress p(out, ProgressMode::Bar, "window", 4, "accumplan: ", 200);
  p.update_at(1.0, 1, 100, "loss 2.5");
  p.update_at(2.0, 2, 200, "loss 2.4");
  p.message("a warning");
  p.update_at(4.0, 4, 400, "loss 2.2");
  p.finish();
  p.finish();  // idempotent
  const std::string text = out.str();
  CHECK(count_of(text, "\r\033[K") == 4);  // 3 updates and the message's clear
  CHECK(count_of(text, "\n") == 2);        // the message and the final newline
  CHECK(text.find("\r\033[Kaccumplan: window 1/4 [##........] 0:01 elapsed, ETA 0:03, 100 samples/s, "
                  "loss 2.5") != std::string::npos);
  // The message sits on its own line, and the bar is drawn again under it.
  CHECK(text.find("\r\033[Kaccumplan: a warning\naccumplan: window 2/4 [#####.....] 0:02 elapsed") != std::string::npos);
  CHECK(text.find("window 4/4 [##########] 0:04 elapsed, done, 100 samples/s, loss 2.2\n") != std::string::npos);
}

TEST_CASE("progress: the bar is redrawn at most ten times a second, the last step always", "[progress]") {
  std::ostringstream out;
  Progress p(out, ProgressMode::Bar, "window", 100);
  for (int64_t d = 1; d <= 100; ++d) p.update_at(0.001 * static_cast<double>(d), d, d, "");
  CHECK(count_of(out.str(), "\r\033[K") == 2);  // the first, and the last (0.1 s in)
}

TEST_CASE("progress: the bar never wraps: the least useful fields go first and the loss stays", "[progress]") {
  // What `accumplan run` passes: the loss first, then the window's shape and peak.
  const std::string detail = "loss 2.30214, 256 samples in 2 microbatches, peak 184.4 MiB";
  Progress wide(std::cout, ProgressMode::Bar, "window", 120, "accumplan: ", 200);
  CHECK(wide.bar_text(754, 117, 29952, detail) ==
        "accumplan: window 117/120 [#########.] 12:34 elapsed, ETA 0:19, 39.7 samples/s, loss 2.30214, "
        "256 samples in 2 microbatches, peak 184.4 MiB");
  // 80 columns (what `script` gives, and the usual default): the peak and the shape go, then the
  // rate; the loss and the ETA stay.
  Progress p(std::cout, ProgressMode::Bar, "window", 120, "accumplan: ", 80);
  const std::string usual = p.bar_text(754, 117, 29952, detail);
  INFO(usual);
  CHECK(usual.size() <= 79);
  CHECK(usual == "accumplan: window 117/120 [#########.] 12:34 elapsed, ETA 0:19, loss 2.30214");
  // 40 columns: the position and the loss.
  Progress narrow(std::cout, ProgressMode::Bar, "window", 10, "accumplan: ", 40);
  const std::string line = narrow.bar_text(3.0, 5, 500, detail);
  INFO(line);
  CHECK(line.size() <= 39);
  CHECK(line == "accumplan: window 5/10, loss 2.30214");
  // Narrower than the position itself: cut, never wrapped.
  Progress tiny(std::cout, ProgressMode::Bar, "window", 10, "accumplan: a long prefix for this job: ", 20);
  CHECK(tiny.bar_text(3.0, 5, 500, detail).size() <= 20);
}

TEST_CASE("progress: steps of unknown count replace each other on a terminal, stay lines in a log", "[progress]") {
  std::ostringstream bar_out, plain_out, none_out;
  {
    auto bar = std::make_shared<Progress>(bar_out, ProgressMode::Bar, "step", 0, "accumplan: ", 200);
    auto plain = std::make_shared<Progress>(plain_out, ProgressMode::Plain, "step", 0);
    auto none = std::make_shared<Progress>(none_out, ProgressMode::None, "step", 0);
    const auto cb_plain = step_callback(plain), cb_none = step_callback(none);
    bar->step_at(1.5, "probe b=1: peak 2.4 MiB");
    bar->step_at(62, "probe b=2: peak 4.1 MiB");
    cb_plain("probe b=1: peak 2.4 MiB");
    cb_plain("probe b=2: peak 4.1 MiB");
    cb_none("probe b=1: peak 2.4 MiB");
    bar->finish();
  }
  CHECK(bar_out.str() == "\r\033[Kaccumplan: [0:01] probe b=1: peak 2.4 MiB\r\033[Kaccumplan: [1:02] probe b=2: peak 4.1 MiB\n");
  CHECK(plain_out.str() == "accumplan: probe b=1: peak 2.4 MiB\naccumplan: probe b=2: peak 4.1 MiB\n");
  CHECK(none_out.str().empty());
}

TEST_CASE("progress: none prints no progress but keeps messages", "[progress]") {
  std::ostringstream out;
  Progress p(out, ProgressMode::None, "window", 3);
  for (int64_t d = 1; d <= 3; ++d) p.update_at(1.0, d, 10, "loss 1");
  p.message("out of memory; re-planned");
  CHECK(out.str() == "accumplan: out of memory; re-planned\n");
}
