// outputs.cpp — checking a command's outputs before it works. See outputs.h.
#include "accumplan/outputs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <filesystem>
#include <optional>

#include "accumplan/errors.h"

namespace accumplan {
namespace {

namespace fs = std::filesystem;

std::string named(const OutputOption& o) { return o.option + " '" + path_for_message(o.path) + "'"; }

std::optional<struct stat> stat_of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return std::nullopt;
  return st;
}

// Where the output will be written: standard output ('-', or a file that is this process's own
// standard output, e.g. /dev/stdout).
bool is_stdout(const OutputOption& o) {
  if (!o.given) return o.to_stdout_when_absent;
  if (o.path == "-") return true;
  struct stat out {};
  const auto st = stat_of(o.path);
  return st && ::fstat(STDOUT_FILENO, &out) == 0 && st->st_dev == out.st_dev && st->st_ino == out.st_ino;
}

// The directory a new file at `path` would be created in.
std::string parent_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

// A file path the writer can create or replace.
void check_writable(const OutputOption& o) {
  if (const auto st = stat_of(o.path)) {
    if (S_ISDIR(st->st_mode)) throw InputError(named(o) + " is a directory; give a file name inside it");
    if (S_ISSOCK(st->st_mode)) throw InputError(named(o) + " is a socket; give a regular file");
    if (!S_ISREG(st->st_mode)) return;  // a device or a FIFO is written directly, never replaced
  }
  const std::string dir = parent_of(o.path);
  // A name the file system cannot hold failed only at the final write, after the work ("File name
  // too long" after a profile, with the plan already on stdout).
  const size_t name_bytes = fs::path(o.path).filename().string().size();
  const long name_max = ::pathconf(dir.c_str(), _PC_NAME_MAX);
  if (name_bytes > static_cast<size_t>(name_max > 0 ? name_max : 255)) {
    throw InputError(named(o) + ": its file name is " + std::to_string(name_bytes) + " bytes, more than the " +
                     std::to_string(name_max > 0 ? name_max : 255) + " this file system allows; choose a shorter name");
  }
  if (o.path.size() >= PATH_MAX) {
    throw InputError(named(o) + ": the path is " + std::to_string(o.path.size()) + " bytes, more than the " +
                     std::to_string(PATH_MAX - 1) + " a path may have");
  }
  const auto d = stat_of(dir);
  if (!d) {
    throw InputError(named(o) + ": no such directory '" + path_for_message(dir) + "'; create it first or choose another path");
  }
  if (!S_ISDIR(d->st_mode)) throw InputError(named(o) + ": '" + path_for_message(dir) + "' is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    throw InputError(named(o) + ": the directory '" + path_for_message(dir) + "' is not writable; choose another path");
  }
}

// Two names of one file: the same inode when both exist, else the same path once symlinks and
// '..' in the existing part are resolved.
// A path with its symlinks followed, dangling ones included (l.json -> a.json with no a.json yet:
// writing l.json creates a.json), then '..' and the existing part resolved.
fs::path resolved(const std::string& path, std::error_code& ec) {
  fs::path p = fs::absolute(path, ec);
  std::error_code missing;  // symlink_status of a path that does not exist sets it: not an error here
  for (int hops = 0; !ec && hops < 40 && fs::is_symlink(fs::symlink_status(p, missing)); ++hops) {
    const fs::path target = fs::read_symlink(p, ec);
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  return ec ? p : fs::weakly_canonical(p, ec);
}

// Two names of one file: the same inode when both exist, else the same path once symlinks and
// '..' are resolved.
bool same_file(const std::string& a, const std::string& b) {
  const auto sa = stat_of(a), sb = stat_of(b);
  if (sa && sb) return sa->st_dev == sb->st_dev && sa->st_ino == sb->st_ino;
  if (sa || sb) return false;
  std::error_code ea, eb;
  const fs::path ca = resolved(a, ea), cb = resolved(b, eb);
  return !ea && !eb && ca == cb;
}

bool is_regular_or_new(const std::string& path) {
  const auto st = stat_of(path);
  return !st || S_ISREG(st->st_mode);
}

}  // namespace

void check_outputs(const std::vector<OutputOption>& outputs, const std::vector<InputOption>& inputs) {
  const OutputOption* on_stdout = nullptr;
  std::vector<const OutputOption*> files;
  for (const auto& o : outputs) {
    if (o.given && o.path.empty()) {
      throw InputError(o.option + " ''" + ": an empty path; give a file name, or - for standard output");
    }
    if (is_stdout(o)) {
      if (on_stdout) {
        throw InputError(on_stdout->option + " and " + o.option + " would both write to standard output; give one of "
                         "them a file name");
      }
      on_stdout = &o;
      continue;
    }
    if (!o.given) continue;
    check_writable(o);
    if (is_regular_or_new(o.path)) files.push_back(&o);
  }
  for (size_t i = 0; i < files.size(); ++i) {
    for (size_t j = i + 1; j < files.size(); ++j) {
      if (same_file(files[i]->path, files[j]->path)) {
        throw InputError(named(*files[i]) + " and " + files[j]->option + " name the same file; the second would replace "
                         "the first. Give each output its own file");
      }
    }
    for (const auto& in : inputs) {
      if (in.path.empty() || in.path == "-" || !stat_of(in.path)) continue;
      if (same_file(files[i]->path, in.path)) {
        throw InputError(named(*files[i]) + " is the " + in.option + " file it is made from; writing it would replace "
                         "that input. Give the output another name");
      }
    }
  }
}

}  // namespace accumplan
