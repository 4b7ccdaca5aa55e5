// cli_runner.cpp — fork/exec of the accumplan binary with stdout and stderr sent to files.
#include "cli_runner.h"
#include "cli_stdout.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <thread>

namespace accumplan::test {

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string source_path(const std::string& rel) { return std::string(ACCUMPLAN_SOURCE_DIR) + "/" + rel; }

std::string scratch_dir(const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(ACCUMPLAN_SCRATCH_DIR) / name;  // 160+ characters deep (tests/CMakeLists.txt)
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

namespace {

CliResult run(const std::string& bin_path, const std::vector<std::string>& args, int timeout_seconds,
              const std::string& stdout_path) {
  static int counter = 0;
  const std::string base = scratch_dir("run-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  const std::string out_path = base + "/stdout", err_path = base + "/stderr";
  const pid_t pid = ::fork();
  if (pid < 0) throw std::runtime_error("fork failed");
  if (pid == 0) {
    const int out = stdout_path.empty() ? ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644)
                                        : ::open(stdout_path.c_str(), O_WRONLY);
    const int err = ::open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int in = ::open("/dev/null", O_RDONLY);
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::dup2(in, 0);
    std::vector<char*> argv;
    std::string bin = bin_path;
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(bin.c_str(), argv.data());
    ::_exit(127);
  }
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      CliResult r;
      r.err = "timed out after " + std::to_string(timeout_seconds) + " s";
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  CliResult r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  if (stdout_path.empty()) r.out = slurp(out_path);
  r.err = slurp(err_path);
  std::filesystem::remove_all(base);
  return r;
}

}  // namespace

CliResult run_cli(const std::vector<std::string>& args, int timeout_seconds) {
  return run(ACCUMPLAN_BIN, args, timeout_seconds, "");
}

CliResult run_binary(const std::string& bin, const std::vector<std::string>& args) { return run(bin, args, 600, ""); }

CliResult run_cli_with_stdout(const std::string& stdout_path, const std::vector<std::string>& args, int timeout_seconds) {
  return run(ACCUMPLAN_BIN, args, timeout_seconds, stdout_path);
}

}  // namespace accumplan::test
