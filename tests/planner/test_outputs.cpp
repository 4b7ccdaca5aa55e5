// check_outputs (accumplan/outputs.h): every output refused before any work when it cannot be
// written, collides with another output or an input, or is a second one on standard output.
#include <catch2/catch.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "accumplan/errors.h"
#include "test_helpers.h"
#include "accumplan/outputs.h"

using namespace accumplan;
namespace fs = std::filesystem;

namespace {

std::string fresh_dir(const std::string& name) { return test::fresh_dir("outputs", name); }

std::string refusal(const std::vector<OutputOption>& outs, const std::vector<InputOption>& ins = {}) {
  try {
    check_outputs(outs, ins);
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("Outputs: new files in existing directories, and absent options, pass", "[outputs]") {
  const std::string dir = fresh_dir("ok");
  CHECK(refusal({{"--out", dir + "/plan.json"}, {"--report", dir + "/r.html"}, {"--trace", "", false}}).empty());
  CHECK(refusal({{"--out", "-"}, {"--report", dir + "/r.svg"}}).empty());
  CHECK(refusal({{"--out", "/dev/null"}, {"--stats", "/dev/null"}}).empty());  // a device is written in place
}

TEST_CASE("Outputs: an empty path is refused, naming the option and the fix", "[outputs]") {
  const std::string msg = refusal({{"--trace", ""}});
  CHECK(msg.find("--trace ''") != std::string::npos);
  CHECK(msg.find("- for standard output") != std::string::npos);
}

TEST_CASE("Outputs: a missing directory is refused with the directory named", "[outputs]") {
  const std::string dir = fresh_dir("missing");
  const std::string msg = refusal({{"--report", dir + "/no-such-dir/r.html"}});
  CHECK(msg.find("no such directory") != std::string::npos);
  CHECK(msg.find("no-such-dir") != std::string::npos);
  CHECK(msg.find('\n') == std::string::npos);
}

TEST_CASE("Outputs: a directory given as an output is refused", "[outputs]") {
  const std::string dir = fresh_dir("isdir");
  CHECK(refusal({{"--out", dir}}).find("is a directory") != std::string::npos);
}

TEST_CASE("Outputs: an unwritable directory is refused", "[outputs]") {
  if (::geteuid() == 0) return;  // root writes anywhere: nothing to observe
  const std::string dir = fresh_dir("readonly");
  fs::permissions(dir, fs::perms::owner_read | fs::perms::owner_exec);
  const std::string msg = refusal({{"--out", dir + "/plan.json"}});
  fs::permissions(dir, fs::perms::owner_all);
  CHECK(msg.find("not writable") != std::string::npos);
}

TEST_CASE("Outputs: two outputs naming one file are refused, by any spelling", "[outputs]") {
  const std::string dir = fresh_dir("same");
  CHECK(refusal({{"--out", dir + "/x"}, {"--report", dir + "/x"}}).find("name the same file") != std::string::npos);
  fs::create_directories(dir + "/sub");
  CHECK(refusal({{"--out", dir + "/x"}, {"--report", dir + "/./sub/../x"}}).find("name the same file") != std::string::npos);
  std::ofstream(dir + "/existing") << "{}";
  fs::create_symlink(dir + "/existing", dir + "/link");
  CHECK(refusal({{"--out", dir + "/existing"}, {"--report", dir + "/link"}}).find("name the same file") !=
        std::string::npos);
}

TEST_CASE("Outputs: an output that is an input is refused", "[outputs]") {
  const std::string dir = fresh_dir("input");
  std::ofstream(dir + "/profile.json") << "{}";
  const std::string msg = refusal({{"--out", dir + "/profile.json"}}, {{"--profile", dir + "/profile.json"}});
  CHECK(msg.find("is the --profile file it is made from") != std::string::npos);
  // An input that does not exist cannot be replaced: its own reader reports it.
  CHECK(refusal({{"--out", dir + "/plan.json"}}, {{"--profile", dir + "/plan.json"}}).empty());
}

TEST_CASE("Outputs: two outputs on standard output are refused", "[outputs]") {
  CHECK(refusal({{"--out", "", false, true}, {"--report", "-"}}).find("--out and --report would both write to standard output") !=
        std::string::npos);
  CHECK(refusal({{"--stats", "-"}, {"--trace", "-"}}).find("both write to standard output") != std::string::npos);
  CHECK(refusal({{"--out", "", false, true}, {"--report", "-", false}}).empty());  // --report not given
}

TEST_CASE("Outputs: a file name longer than the file system allows is refused before any work", "[outputs]") {
  const std::string dir = fresh_dir("long-name");
  const std::string msg = refusal({{"--out", dir + "/" + std::string(300, 'n') + ".json"}});
  CHECK(msg.find("its file name is 305 bytes, more than the 255 this file system allows") != std::string::npos);
  CHECK(refusal({{"--out", dir + "/" + std::string(250, 'n') + ".json"}}).empty());
}

TEST_CASE("Outputs: a dangling symlink and the file it names are one output", "[outputs]") {
  const std::string dir = fresh_dir("dangling");
  std::filesystem::create_symlink("a.json", dir + "/l.json");  // a.json does not exist yet
  CHECK(refusal({{"--stats", dir + "/l.json"}, {"--trace", dir + "/a.json"}}).find("name the same file") != std::string::npos);
  CHECK(refusal({{"--stats", dir + "/l.json"}, {"--trace", dir + "/b.json"}}).empty());
}
