// Files in and out (json_io.h): readers refuse directories, empty files, FIFOs and devices with
// their own message and never block; write_text_atomic replaces regular files through a temp file
// that never outlives it, writes special files in place, follows symlinks and keeps them.
// No timing assertions: a FIFO "does not block" because the call returns at all (O_NONBLOCK).
#include <catch2/catch.hpp>

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "accumplan/errors.h"
#include "test_helpers.h"
#include "accumplan/json_io.h"

using namespace accumplan;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) { return test::fresh_dir("files", name); }

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

size_t entries(const std::string& dir) {
  return static_cast<size_t>(std::distance(fs::directory_iterator(dir), fs::directory_iterator{}));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("Files: readers name a directory, an empty file, /dev/null, a FIFO and a device", "[files][errors]") {
  const std::string dir = fresh_dir("read");
  CHECK_THAT(error_of([&] { read_json_file(dir, "--profile"); }), Catch::Contains("is a directory"));
  const std::string empty = dir + "/empty.json";
  std::ofstream(empty).close();
  CHECK_THAT(error_of([&] { read_json_file(empty, "--profile"); }), Catch::Contains("is empty"));
  const std::string blank = dir + "/blank.json";
  std::ofstream(blank) << "  \n\n";
  CHECK_THAT(error_of([&] { read_json_file(blank, "--profile"); }), Catch::Contains("is empty"));
  CHECK_THAT(error_of([&] { read_json_file("/dev/null", "--profile"); }), Catch::Contains("is empty"));
  CHECK_THAT(error_of([&] { read_json_file("/dev/zero", "--plan"); }), Catch::Contains("is a device"));
  // A FIFO with no writer: opened O_NONBLOCK and refused; reaching the next line is the test.
  const std::string fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  const std::string msg = error_of([&] { read_json_file(fifo, "--plan"); });
  CHECK_THAT(msg, Catch::Contains("is a FIFO"));
  CHECK_THAT(msg, Catch::StartsWith("--plan '"));
}

TEST_CASE("Files: a number beyond a double is named by file and JSON path", "[files][errors]") {
  const std::string dir = fresh_dir("overflow");
  const std::string path = dir + "/p.json";
  std::ofstream(path) << R"({"a": {"b": [1, 2, {"c": 1e400}]}})";
  const std::string msg = error_of([&] { read_json_file(path, "--profile"); });
  CHECK_THAT(msg, Catch::Contains("p.json"));
  CHECK_THAT(msg, Catch::Contains("$.a.b[2].c"));
  CHECK_THAT(msg, Catch::Contains("1e400"));
  CHECK_THAT(error_of([&] { parse_json_text("[1, -1e999]", "x"); }), Catch::Contains("$[1]"));
  CHECK_THAT(error_of([&] { parse_json_text(std::string(100, '[') + std::string(100, ']'), "x"); }),
             Catch::Contains("nested deeper than"));
  CHECK_THAT(error_of([&] { parse_json_text("{\n  oops\n}", "x"); }), Catch::Contains("not valid JSON (line 2"));
  // NaN is no JSON: the message names the field it stood in, not only where.
  CHECK(error_of([&] { parse_json_text("{\"a\": {\"target_batch\": NaN}}", "x"); }) ==
        "x is not valid JSON (line 1, column 24, in $.a.target_batch)");
  CHECK(parse_json_text("{\"a\": 1.5e300}", "x")["a"] == 1.5e300);
}

TEST_CASE("Files: a regular file is replaced whole and no temp file is left", "[files]") {
  const std::string dir = fresh_dir("regular");
  const std::string path = dir + "/plan.json";
  write_text_atomic(path, "first\n");
  write_text_atomic(path, "second\n");
  CHECK(read_all(path) == "second\n");
  CHECK(entries(dir) == 1);
  ::chmod(path.c_str(), 0640);
  write_text_atomic(path, "third\n");
  struct stat st {};
  REQUIRE(::stat(path.c_str(), &st) == 0);
  CHECK((st.st_mode & 0777) == 0640);  // an existing file's permissions are kept
}

TEST_CASE("Files: a stale temp name of ours left by a SIGKILL is swept by the next write; others stay", "[files]") {
  const std::string dir = fresh_dir("sweep");
  auto make = [&](const std::string& name, int64_t age_seconds) {
    std::ofstream(dir + "/" + name) << "left behind";
    const timespec when[2] = {{::time(nullptr) - age_seconds, 0}, {::time(nullptr) - age_seconds, 0}};
    REQUIRE(::utimensat(AT_FDCWD, (dir + "/" + name).c_str(), when, 0) == 0);
  };
  make(".ap3f09c1.tmp", 3600);  // ours, an hour old: a write killed between link and rename
  make(".ap00aa11.tmp", 5);     // ours, seconds old: another write may still hold it
  make(".3f09c1aa.tmp", 3600);  // not ours (no prefix): never touched
  write_text_atomic(dir + "/plan.json", "{}\n");
  CHECK_FALSE(fs::exists(dir + "/.ap3f09c1.tmp"));
  CHECK(fs::exists(dir + "/.ap00aa11.tmp"));
  CHECK(fs::exists(dir + "/.3f09c1aa.tmp"));
  CHECK(read_all(dir + "/plan.json") == "{}\n");
}

TEST_CASE("Files: a 255-character file name can be written", "[files]") {
  const std::string dir = fresh_dir("long-name");
  const std::string name = std::string(250, 'p') + ".json";
  REQUIRE(name.size() == 255);
  write_text_atomic(dir + "/" + name, "{}\n");
  CHECK(read_all(dir + "/" + name) == "{}\n");
  CHECK(entries(dir) == 1);
}

TEST_CASE("Files: a symlink is followed; its target is replaced and the link kept", "[files]") {
  const std::string dir = fresh_dir("symlink");
  fs::create_directories(dir + "/real");
  std::ofstream(dir + "/real/plan.json") << "old\n";
  fs::create_symlink("real/plan.json", dir + "/link.json");
  write_text_atomic(dir + "/link.json", "new\n");
  CHECK(fs::is_symlink(dir + "/link.json"));
  CHECK(read_all(dir + "/real/plan.json") == "new\n");
  CHECK(entries(dir) == 2);
  CHECK(entries(dir + "/real") == 1);
  // A dangling link: its target is created.
  fs::create_symlink("real/new.json", dir + "/dangling.json");
  write_text_atomic(dir + "/dangling.json", "made\n");
  CHECK(fs::is_symlink(dir + "/dangling.json"));
  CHECK(read_all(dir + "/real/new.json") == "made\n");
}

TEST_CASE("Files: a directory as output is refused, nothing written", "[files][errors]") {
  const std::string dir = fresh_dir("out-dir");
  CHECK_THAT(error_of([&] { write_text_atomic(dir, "x"); }), Catch::Contains("is a directory"));
  CHECK(entries(dir) == 0);
  CHECK_THAT(error_of([&] { write_text_atomic(dir + "/no/such/dir.json", "x"); }),
             Catch::Contains("No such file or directory"));
}

TEST_CASE("Files: devices are written in place and stay devices", "[files]") {
  write_text_atomic("/dev/null", "discarded\n");
  struct stat st {};
  REQUIRE(::stat("/dev/null", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
  // /dev/full: the write fails (disk full) and, written in place, nothing is created anywhere.
  CHECK_THAT(error_of([&] { write_text_atomic("/dev/full", "x"); }), Catch::Contains("disk full"));
  REQUIRE(::stat("/dev/full", &st) == 0);
  CHECK(S_ISCHR(st.st_mode));
}

TEST_CASE("Files: a FIFO without a reader is refused at once; with one it is written in place", "[files]") {
  const std::string dir = fresh_dir("out-fifo");
  const std::string fifo = dir + "/fifo";
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  CHECK_THAT(error_of([&] { write_text_atomic(fifo, "x"); }), Catch::Contains("no reader"));
  // A reader opened first (O_NONBLOCK, so opening does not wait either), then the write.
  const int reader = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  REQUIRE(reader >= 0);
  write_text_atomic(fifo, "through the pipe\n");
  char buf[64] = {};
  const ssize_t n = ::read(reader, buf, sizeof buf - 1);
  ::close(reader);
  CHECK(std::string(buf, n > 0 ? static_cast<size_t>(n) : 0) == "through the pipe\n");
  struct stat st {};
  REQUIRE(::lstat(fifo.c_str(), &st) == 0);
  CHECK(S_ISFIFO(st.st_mode));
  CHECK(entries(dir) == 1);
}

TEST_CASE("Files: /proc/self/fd/N is written in place, not replaced", "[files]") {
  const std::string dir = fresh_dir("proc-fd");
  const std::string path = dir + "/target.txt";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  REQUIRE(fd >= 0);
  struct stat before {};
  REQUIRE(::fstat(fd, &before) == 0);
  write_text_atomic("/proc/self/fd/" + std::to_string(fd), "via fd\n");
  struct stat after {};
  REQUIRE(::stat(path.c_str(), &after) == 0);
  ::close(fd);
  CHECK(after.st_ino == before.st_ino);  // the same file, written through the descriptor
  CHECK(read_all(path) == "via fd\n");
  CHECK(entries(dir) == 1);
}

TEST_CASE("Files: a write that fails part way leaves neither the file nor a temp file", "[files][errors]") {
  // A child process under a 4 KiB file size limit writes 1 MiB: the write fails with EFBIG after
  // the temp file exists; the parent then finds the directory as it was.
  const std::string dir = fresh_dir("failing-write");
  std::ofstream(dir + "/plan.json") << "old\n";
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::signal(SIGXFSZ, SIG_IGN);
    struct rlimit lim {4096, 4096};
    ::setrlimit(RLIMIT_FSIZE, &lim);
    try {
      write_text_atomic(dir + "/plan.json", std::string(1 << 20, 'x'));
    } catch (const InputError& e) {
      ::_exit(std::string(e.what()).find("plan.json") != std::string::npos ? 2 : 3);
    } catch (...) {
      ::_exit(4);
    }
    ::_exit(0);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 2);
  CHECK(read_all(dir + "/plan.json") == "old\n");
  CHECK(entries(dir) == 1);
}

TEST_CASE("Files: - writes standard output", "[files]") {
  // Only that it does not create a file named "-".
  const fs::path cwd = fs::current_path();
  const std::string dir = fresh_dir("dash");
  fs::current_path(dir);
  write_text_atomic("-", "");
  fs::current_path(cwd);
  CHECK(entries(dir) == 0);
}

TEST_CASE("Files: SIGTERM or SIGINT during writes leaves the old or the new file and no temp file", "[files][signals]") {
  // A child rewrites a 4 MiB file over and over; the parent signals it once the file exists.
  // Whenever the signal lands (writing an unnamed O_TMPFILE, between its link and the rename, or
  // after), the directory must hold exactly the complete file: the outcome, not the timing, is
  // what is checked.
  for (const bool named_temp : {false, true}) {
  for (int sig : {SIGTERM, SIGINT}) {
    INFO("signal " << sig << (named_temp ? ", named temp file" : ", O_TMPFILE"));
    const std::string dir = fresh_dir("signal-" + std::to_string(sig) + (named_temp ? "-named" : ""));
    const std::string path = dir + "/plan.json";
    const std::string text(4 << 20, 'x');
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::signal(SIGTERM, SIG_DFL);  // the test runner's own handlers, reset as in a fresh process
      ::signal(SIGINT, SIG_DFL);
      // The named `.ap<6 hex>.tmp` path: the signal handlers' registry is what removes it.
      if (named_temp) ::setenv("ACCUMPLAN_NO_TMPFILE", "1", 1);
      for (int i = 0; i < 100000; ++i) write_text_atomic(path, text);
      ::_exit(0);
    }
    while (!fs::exists(path)) ::usleep(1000);
    ::usleep(20000);
    ::kill(pid, sig);
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    CHECK(WIFSIGNALED(status));  // re-raised: the process still dies of the signal
    if (WIFSIGNALED(status)) CHECK(WTERMSIG(status) == sig);
    CHECK(entries(dir) == 1);
    CHECK(fs::file_size(path) == text.size());
  }
  }
}
