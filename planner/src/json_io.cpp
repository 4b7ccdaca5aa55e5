// json_io.cpp — file I/O and path-aware JSON reading. See json_io.h.
//
// What it is: the readers' refusals of special files, a SAX front end to nlohmann's parser that
// knows the JSON path of the value it is on (so `1e400` is named by its field), the atomic
// writer with its signal-safe registry of live temp names, and JsonField's typed, ranged reads.
// What it is not: the documents' schema (schema.cpp).
#include "accumplan/json_io.h"

#include <algorithm>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <climits>
#include <ctime>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>

#include "accumplan/errors.h"

namespace accumplan {
namespace {

// How every message here names a file: path_for_message keeps its end (the file and its directory).
std::string quoted(const std::string& path) { return "'" + path_for_message(path) + "'"; }

std::string errno_text(int err) { return std::strerror(err); }

bool is_dev_null(const struct stat& st) {
  struct stat null_st {};
  return S_ISCHR(st.st_mode) && ::stat("/dev/null", &null_st) == 0 && null_st.st_rdev == st.st_rdev;
}

// Closes a file descriptor on every exit path.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Reading

namespace {

// Opens `path` for reading and refuses anything but a regular file, each kind with its own line.
// `noun` is what the user should give instead ("a JSON file").
Fd open_regular_file(const std::string& path, const std::string& what, const std::string& noun, struct stat& st) {
  const std::string where = what + " " + quoted(path);
  // O_NONBLOCK: a FIFO without a writer opens at once (and is refused below) instead of waiting.
  Fd f(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (f.fd < 0) {
    const int err = errno;
    throw InputError(what + ": cannot open " + quoted(path) + ": " + errno_text(err));
  }
  if (::fstat(f.fd, &st) != 0) throw InputError(where + ": cannot stat: " + errno_text(errno));
  if (S_ISDIR(st.st_mode)) throw InputError(where + " is a directory; give the path of " + noun + " in it");
  if (is_dev_null(st)) throw InputError(where + " is empty (/dev/null); give " + noun);
  if (S_ISFIFO(st.st_mode)) {
    throw InputError(where + " is a FIFO (named pipe), not a file; save it to a regular file first");
  }
  if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode)) {
    throw InputError(where + " is a device, not a file; give " + noun);
  }
  if (S_ISSOCK(st.st_mode)) throw InputError(where + " is a socket, not a file; give " + noun);
  if (!S_ISREG(st.st_mode)) throw InputError(where + " is not a regular file; give " + noun);
  return f;
}

}  // namespace

void require_regular_file(const std::string& path, const std::string& what, const std::string& noun) {
  struct stat st {};
  open_regular_file(path, what, noun, st);
}

std::string read_text_file(const std::string& path, const std::string& what, const std::string& noun) {
  const std::string where = what + " " + quoted(path);
  struct stat st {};
  const Fd f = open_regular_file(path, what, noun, st);
  if (st.st_size > kMaxInputFileBytes) {
    throw InputError(where + " is " + std::to_string(static_cast<long long>(st.st_size)) +
                     " bytes, more than any accumplan document (at most " +
                     std::to_string(kMaxInputFileBytes) + "); is it the right file?");
  }
  // A regular file: O_NONBLOCK has no effect on it. /proc files report size 0 and are read to
  // their end all the same, up to the limit.
  std::string text;
  char buf[65536];
  while (true) {
    const ssize_t n = ::read(f.fd, buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw InputError(where + ": cannot read: " + errno_text(errno));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
    if (static_cast<int64_t>(text.size()) > kMaxInputFileBytes) {
      throw InputError(where + " is larger than any accumplan document (more than " +
                       std::to_string(kMaxInputFileBytes) + " bytes); is it the right file?");
    }
  }
  return text;
}

namespace {

using nlohmann::json;

// nlohmann's DOM builder behind a SAX interface that also tracks the JSON path of the value being
// parsed, so an error can say which field held `1e400`, and that bounds the nesting depth.
class PathTrackingSax {
 public:
  explicit PathTrackingSax(json& result) : dom_(result, true) {}

  bool null() { return scalar() && dom_.null(); }
  bool boolean(bool v) { return scalar() && dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return scalar() && dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return scalar() && dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) {
    if (!std::isfinite(v)) overflow(s);
    return scalar() && dom_.number_float(v, s);
  }
  bool string(json::string_t& v) { return scalar() && dom_.string(v); }
  bool binary(json::binary_t& v) { return scalar() && dom_.binary(v); }
  bool start_object(std::size_t n) {
    open(false);
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    frames_.back().key = k;
    return dom_.key(k);
  }
  bool end_object() {
    close();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) {
    open(true);
    return dom_.start_array(n);
  }
  bool end_array() {
    close();
    return dom_.end_array();
  }
  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::detail::exception& e) {
    if (e.id == 406) overflow(last_token);  // "number overflow": a float beyond a double
    throw SyntaxError{position, path()};  // the DOM parser would rethrow a sliced copy of `e`
  }

  // "$.points[2].peak_bytes": where the value being parsed sits.
  std::string path() const {
    std::string p = "$";
    for (const auto& f : frames_) {
      p += f.array ? "[" + std::to_string(f.index) + "]" : "." + cut_for_message(f.key, 40);
    }
    return cut_for_message(p, 160);
  }

  struct NumberOverflow {
    std::string path;
    std::string token;
  };
  struct TooDeep {
    std::string path;
  };
  struct SyntaxError {
    size_t byte;       // 1-based offset of the failure, as nlohmann counts
    std::string path;  // the field being read: NaN is not JSON, and the line alone did not say which
  };

 private:
  struct Frame {
    bool array = false;
    size_t index = 0;
    std::string key;
  };

  bool scalar() {
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
    return true;
  }
  void open(bool array) {
    if (static_cast<int>(frames_.size()) >= kMaxJsonDepth) throw TooDeep{path()};
    frames_.push_back(Frame{array, 0, {}});
  }
  void close() {
    frames_.pop_back();
    if (!frames_.empty() && frames_.back().array) ++frames_.back().index;
  }
  [[noreturn]] void overflow(const std::string& token) const { throw NumberOverflow{path(), token}; }

  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::vector<Frame> frames_;
};

bool all_whitespace(const std::string& text) {
  return text.find_first_not_of(" \t\r\n") == std::string::npos;
}

}  // namespace

json parse_json_text(const std::string& text, const std::string& where) {
  if (all_whitespace(text)) throw InputError(where + " is empty; give a JSON file written by accumplan");
  json result;
  PathTrackingSax sax(result);
  try {
    json::sax_parse(text, &sax);
  } catch (const PathTrackingSax::NumberOverflow& e) {
    throw InputError(where + ": " + e.path + ": the number " + cut_for_message(e.token) +
                     " is beyond the range of a double (about 1.8e308); the field's range is in "
                     "docs/plan-format.md");
  } catch (const PathTrackingSax::TooDeep& e) {
    // The file's name first, as every other refusal of the text (a corpus file showed it missing).
    throw InputError(where + ": " + e.path + ": nested deeper than " + std::to_string(kMaxJsonDepth) +
                     " levels; accumplan's documents nest 4");
  } catch (const PathTrackingSax::SyntaxError& e) {
    // e.byte is the 1-based offset of the failure; turn it into line:column for editors.
    size_t line = 1, col = 1;
    for (size_t i = 0; i + 1 < e.byte && i < text.size(); ++i) {
      if (text[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    throw InputError(where + " is not valid JSON (line " + std::to_string(line) + ", column " +
                     std::to_string(col) + (e.path == "$" || e.path.back() == '.' ? std::string() : ", in " + e.path) + ")");
  } catch (const json::exception& e) {
    // Any other refusal of the parser (none known): still the file's fault, not ours.
    throw InputError(where + " is not valid JSON (" + cut_for_message(e.what()) + ")");
  }
  return result;
}

json read_json_file(const std::string& path, const std::string& what) {
  return parse_json_text(read_text_file(path, what), what + " " + quoted(path));
}

// ---------------------------------------------------------------------------------------------
// Writing

namespace {

// Temp names that exist on disk right now, for the signal handlers. Fixed slots, no allocation:
// a handler may only read them and call unlink(2), which is async-signal-safe.
constexpr int kTempSlots = 16;
struct TempSlot {
  std::atomic<int> state{0};  // 0 free, 1 claimed (being filled), 2 live (name on disk)
  char path[PATH_MAX + 1] = {};
};
TempSlot g_temp_slots[kTempSlots];

extern "C" void unlink_temps_and_reraise(int sig) {
  const int saved = errno;
  for (auto& slot : g_temp_slots) {
    if (slot.state.load(std::memory_order_acquire) == 2) ::unlink(slot.path);
  }
  errno = saved;
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Installs the handlers before each write, only over the default action (a program that ignores
// or handles SIGINT itself keeps its choice; one that reset it to the default gets ours again).
void install_temp_handlers() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || (old.sa_flags & SA_SIGINFO) || old.sa_handler != SIG_DFL) continue;
    struct sigaction sa {};
    sa.sa_handler = unlink_temps_and_reraise;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    ::sigaction(sig, &sa, nullptr);
  }
}

// One live temp name: registered for the signal handlers while it exists, unlinked by the
// destructor unless released (after the rename moved it).
class TempName {
 public:
  TempName() = default;
  TempName(const TempName&) = delete;
  TempName& operator=(const TempName&) = delete;
  ~TempName() {
    if (!path_.empty()) ::unlink(path_.c_str());
    release();
  }
  // Claims a slot for `path` before it is created; false if every slot is busy (the write then
  // goes on without signal cleanup, which only the 17th concurrent writer would see).
  void hold(const std::string& path) {
    path_ = path;
    if (path.size() > PATH_MAX) return;
    for (int i = 0; i < kTempSlots; ++i) {
      int expected = 0;
      if (g_temp_slots[i].state.compare_exchange_strong(expected, 1)) {
        std::memcpy(g_temp_slots[i].path, path.c_str(), path.size() + 1);
        g_temp_slots[i].state.store(2, std::memory_order_release);
        slot_ = i;
        return;
      }
    }
  }
  // The name no longer exists (renamed): forget it.
  void release() {
    path_.clear();
    if (slot_ >= 0) g_temp_slots[slot_].state.store(0, std::memory_order_release);
    slot_ = -1;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int slot_ = -1;
};

std::string dir_of(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

bool under_proc(const std::string& path) {
  return path.rfind("/proc/", 0) == 0 || path.rfind("/dev/fd/", 0) == 0 || path == "/dev/stdout" ||
         path == "/dev/stderr";
}

// Follows a chain of symlinks to the name that will be replaced; a dangling link's target is
// created. Relative link targets are relative to the link's directory. `*via_proc` is set when a
// name on the way is a /proc (or /dev/fd) file-descriptor link: those are written in place.
std::string follow_links(const std::string& path, bool* via_proc) {
  std::string p = path;
  *via_proc = under_proc(p);
  for (int hops = 0; hops < 40; ++hops) {
    struct stat st {};
    if (::lstat(p.c_str(), &st) != 0 || !S_ISLNK(st.st_mode)) return p;
    std::string target(PATH_MAX + 1, '\0');
    const ssize_t n = ::readlink(p.c_str(), &target[0], target.size());
    if (n < 0 || static_cast<size_t>(n) >= target.size()) return p;
    target.resize(static_cast<size_t>(n));
    p = (!target.empty() && target[0] == '/') ? target : dir_of(p) + "/" + target;
    *via_proc = *via_proc || under_proc(p);
  }
  throw InputError("cannot write " + quoted(path) + ": too many levels of symbolic links");
}

// Why a write failed, as every writer says it (a file, or standard output).
std::string write_failure_text(int err) {
  if (err == ENOSPC || err == EDQUOT) return errno_text(err) + " (disk full?)";
  if (err == EFBIG) return errno_text(err) + " (file size limit)";
  return errno_text(err);
}

void write_all(int fd, const std::string& text, const std::string& path) {
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw InputError("cannot write " + quoted(path) + ": " + write_failure_text(errno));
    }
    done += static_cast<size_t>(n);
  }
}

// Devices, FIFOs, /proc/self/fd/N: opened and written in place. A FIFO without a reader fails at
// once with ENXIO (O_NONBLOCK) instead of blocking.
void write_in_place(const std::string& path, const std::string& text) {
  const Fd f(::open(path.c_str(), O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC));
  if (f.fd < 0) {
    const int err = errno;
    if (err == ENXIO) {
      throw InputError("cannot write " + quoted(path) + ": it is a FIFO (named pipe) with no reader; start the "
                       "reader first, or give a file name");
    }
    throw InputError("cannot write " + quoted(path) + ": " + errno_text(err));
  }
  struct stat st {};
  if (::fstat(f.fd, &st) != 0) throw InputError("cannot write " + quoted(path) + ": " + errno_text(errno));
  if (S_ISDIR(st.st_mode)) throw InputError("cannot write " + quoted(path) + ": it is a directory; give a file name");
  // Blocking writes from here on: a pipe with a reader takes the text at the reader's pace.
  const int flags = ::fcntl(f.fd, F_GETFL);
  if (flags >= 0) ::fcntl(f.fd, F_SETFL, flags & ~O_NONBLOCK);
  if (S_ISREG(st.st_mode) && ::ftruncate(f.fd, 0) != 0 && errno != EINVAL) {
    throw InputError("cannot write " + quoted(path) + ": " + errno_text(errno));
  }
  write_all(f.fd, text, path);
}

// `.ap` + 6 hex digits + `.tmp` (".ap3f09c1.tmp"): 13 characters, so a 255-character final name
// still works, and a prefix that says whose it is, so only accumplan's own are ever swept.
std::string temp_name_in(const std::string& dir, unsigned attempt) {
  static std::atomic<unsigned> counter{0};
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  unsigned x = static_cast<unsigned>(::getpid()) * 2654435761u ^ static_cast<unsigned>(now) ^
               (counter.fetch_add(1) * 40503u) ^ (attempt * 97u);
  char buf[16];
  std::snprintf(buf, sizeof buf, ".ap%06x.tmp", x & 0xffffffu);
  return dir + "/" + buf;
}

bool is_our_temp_name(const char* name) {
  if (std::strlen(name) != 13 || std::strncmp(name, ".ap", 3) != 0 || std::strcmp(name + 9, ".tmp") != 0) return false;
  for (int i = 3; i < 9; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(name[i]))) return false;
  }
  return true;
}

// A SIGKILL between naming the temp file and renaming it over the target (microseconds, but no
// handler runs) leaves a temp name behind; the next write into the directory removes ours that
// are older than 10 minutes — no write holds its temp name for more than the seconds its text
// takes to write.
constexpr int64_t kStaleTempSeconds = 600;

void sweep_stale_temps(const std::string& dir) {
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return;
  const time_t now = ::time(nullptr);
  while (const dirent* e = ::readdir(d)) {
    if (!is_our_temp_name(e->d_name)) continue;
    const std::string path = dir + "/" + e->d_name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && now - st.st_mtime > kStaleTempSeconds) {
      (void)::unlink(path.c_str());
    }
  }
  ::closedir(d);
}

void fsync_dir(const std::string& dir, const std::string& path) {
  const Fd d(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (d.fd < 0) return;  // the rename happened; a directory we cannot open we cannot sync either
  if (::fsync(d.fd) != 0 && errno != EINVAL && errno != ENOTSUP && errno != EROFS) {
    throw InputError("wrote " + quoted(path) + " but could not sync its directory: " + errno_text(errno));
  }
}

}  // namespace

void write_stdout(const std::string& text) {
  if (std::cout) {  // a stream already failed keeps its errno: the reason of that failed write
    errno = 0;
    std::cout << text << std::flush;
  }
  if (std::cout) return;
  const int err = errno;
  std::cout.clear();  // a later write (help at exit) must not fail on this one's state
  throw InputError("cannot write to standard output: " + (err != 0 ? write_failure_text(err) : std::string("write failed")) +
                   "; free space where it is redirected, or redirect it elsewhere");
}

void write_text_atomic(const std::string& path, const std::string& text) {
  if (path.empty()) throw InputError("cannot write '': empty file name");
  if (path == "-") {
    write_stdout(text);
    return;
  }
  install_temp_handlers();

  struct stat st {};
  const bool exists = ::stat(path.c_str(), &st) == 0;  // follows links, /proc magic links too
  if (exists && S_ISDIR(st.st_mode)) {
    throw InputError("cannot write " + quoted(path) + ": it is a directory; give a file name, e.g. " +
                     path_for_message(path.substr(0, path.find_last_not_of('/') + 1) + "/plan.json"));
  }
  if (exists && S_ISSOCK(st.st_mode)) throw InputError("cannot write " + quoted(path) + ": it is a socket");
  bool via_proc = false;
  const std::string target = follow_links(path, &via_proc);
  if (via_proc || (exists && !S_ISREG(st.st_mode))) {
    write_in_place(path, text);
    return;
  }
  const std::string dir = dir_of(target);
  sweep_stale_temps(dir);
  const mode_t mode = exists ? (st.st_mode & 07777) : 0666;
  TempName temp;
  int fd = -1;
#ifdef O_TMPFILE
  // An unnamed file: a crash or SIGKILL before the link leaves nothing behind.
  // ACCUMPLAN_NO_TMPFILE=1 takes the named-temp path instead (tests; odd file systems).
  const char* no_tmpfile = std::getenv("ACCUMPLAN_NO_TMPFILE");
  // linkat needs /proc/self/fd to name the unnamed file; without /proc, the named path.
  if ((no_tmpfile == nullptr || std::string(no_tmpfile) != "1") && ::access("/proc/self/fd", X_OK) == 0) {
    fd = ::open(dir.c_str(), O_TMPFILE | O_WRONLY | O_CLOEXEC, mode);
  }
#endif
  const bool unnamed = fd >= 0;
  if (!unnamed) {
    for (unsigned attempt = 0; attempt < 100 && fd < 0; ++attempt) {
      const std::string name = temp_name_in(dir, attempt);
      temp.hold(name);
      fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
      if (fd < 0) {
        const int err = errno;
        temp.release();  // not created: nothing to unlink
        if (err != EEXIST) {
          throw InputError("cannot write " + quoted(path) + ": " + errno_text(err) +
                           " (is the directory there and writable?)");
        }
      }
    }
    if (fd < 0) throw InputError("cannot write " + quoted(path) + ": no free temporary name in " + quoted(dir));
  }
  const Fd file(fd);
  if (exists) (void)::fchmod(file.fd, mode);  // umask applied to a new file, not to a replaced one
  write_all(file.fd, text, path);
  if (::fsync(file.fd) != 0) throw InputError("cannot write " + quoted(path) + ": fsync: " + errno_text(errno));

  if (unnamed) {
    // Give the unnamed file a temp name, then rename it over the target (linkat cannot replace).
    const std::string proc = "/proc/self/fd/" + std::to_string(file.fd);
    bool linked = false;
    for (unsigned attempt = 0; attempt < 100 && !linked; ++attempt) {
      const std::string name = temp_name_in(dir, attempt);
      temp.hold(name);
      if (::linkat(AT_FDCWD, proc.c_str(), AT_FDCWD, name.c_str(), AT_SYMLINK_FOLLOW) == 0) {
        linked = true;
      } else {
        const int err = errno;
        temp.release();
        if (err != EEXIST) {
          throw InputError("cannot write " + quoted(path) + ": " + errno_text(err) +
                           " (is the directory there and writable?)");
        }
      }
    }
    if (!linked) throw InputError("cannot write " + quoted(path) + ": no free temporary name in " + quoted(dir));
  }
  if (::rename(temp.path().c_str(), target.c_str()) != 0) {
    const int err = errno;
    throw InputError("cannot write " + quoted(path) + ": " + errno_text(err));  // ~TempName unlinks
  }
  temp.release();
  fsync_dir(dir, path);
}

// ---------------------------------------------------------------------------------------------
// JsonField

namespace {
const char* type_name(const nlohmann::json& v) {
  if (v.is_null()) return "null";
  if (v.is_boolean()) return "boolean";
  if (v.is_number_integer() || v.is_number_unsigned()) return "integer";
  if (v.is_number_float()) return "number";
  if (v.is_string()) return "string";
  if (v.is_array()) return "array";
  return "object";
}

std::string real_text(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}
}  // namespace

void JsonField::fail(const std::string& expected) const {
  throw SchemaError(path_ + ": expected " + expected + ", found " + type_name(*value_));
}

std::string JsonField::value_text() const {
  if (value_->is_string()) {
    return "\"" + cut_for_message(value_->get_ref<const std::string&>()) + "\"";
  }
  if (value_->is_array() || value_->is_object()) return type_name(*value_);
  return cut_for_message(value_->dump());
}

bool JsonField::has(const char* key) const {
  return value_->is_object() && value_->contains(key);
}

JsonField JsonField::at(const char* key) const {
  if (!value_->is_object()) fail("an object");
  auto it = value_->find(key);
  if (it == value_->end()) throw SchemaError(path_ + "." + key + ": missing required field");
  return JsonField(*it, path_ + "." + key);
}

std::vector<JsonField> JsonField::items() const {
  if (!value_->is_array()) fail("an array");
  std::vector<JsonField> out;
  for (size_t i = 0; i < value_->size(); ++i) {
    out.emplace_back((*value_)[i], path_ + "[" + std::to_string(i) + "]");
  }
  return out;
}

std::string JsonField::as_string() const {
  if (!value_->is_string()) fail("a string");
  return value_->get<std::string>();
}

int64_t JsonField::as_int() const {
  if (value_->is_number_unsigned()) {
    // 2^63 and above arrive as unsigned: refused, never wrapped to a negative number.
    if (value_->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      throw SchemaError(path_ + ": " + value_text() + " is out of range; expected an integer below 2^63");
    }
    return static_cast<int64_t>(value_->get<uint64_t>());
  }
  if (!value_->is_number_integer()) fail("an integer");
  return value_->get<int64_t>();
}

int64_t JsonField::as_int(IntRange range) const {
  auto out_of_range = [&]() {
    return SchemaError(path_ + ": " + value_text() + " is out of range; expected an integer in [" +
                       std::to_string(range.lo) + ", " + std::to_string(range.hi) + "]");
  };
  if (value_->is_number_unsigned() &&
      value_->get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
    throw out_of_range();
  }
  const int64_t v = as_int();
  if (v < range.lo || v > range.hi) throw out_of_range();
  return v;
}

double JsonField::as_double() const {
  if (!value_->is_number()) fail("a number");
  const double v = value_->get<double>();
  if (!std::isfinite(v)) throw SchemaError(path_ + ": " + value_text() + " is not a finite number");
  return v;
}

double JsonField::as_double(RealRange range) const {
  const double v = as_double();
  const bool below = range.lo_open ? !(v > range.lo) : !(v >= range.lo);
  const bool above = range.hi_open ? !(v < range.hi) : !(v <= range.hi);
  if (below || above) {
    throw SchemaError(path_ + ": " + value_text() + " is out of range; expected a number in " +
                      (range.lo_open ? "(" : "[") + real_text(range.lo) + ", " + real_text(range.hi) +
                      (range.hi_open ? ")" : "]"));
  }
  return v;
}

bool JsonField::as_bool() const {
  if (!value_->is_boolean()) fail("a boolean");
  return value_->get<bool>();
}

std::optional<int64_t> JsonField::opt_i64(const char* key) const {
  if (!has(key) || (*value_)[key].is_null()) return std::nullopt;
  return at(key).as_int();
}

std::optional<double> JsonField::opt_f64(const char* key) const {
  if (!has(key) || (*value_)[key].is_null()) return std::nullopt;
  return at(key).as_double();
}

std::optional<int64_t> JsonField::opt_i64(const char* key, IntRange range) const {
  if (!has(key) || (*value_)[key].is_null()) return std::nullopt;
  return at(key).as_int(range);
}

std::optional<double> JsonField::opt_f64(const char* key, RealRange range) const {
  if (!has(key) || (*value_)[key].is_null()) return std::nullopt;
  return at(key).as_double(range);
}

std::optional<std::string> JsonField::opt_str(const char* key) const {
  if (!has(key) || (*value_)[key].is_null()) return std::nullopt;
  return at(key).as_string();
}

std::string JsonField::one_of(const char* key, const std::vector<std::string>& choices) const {
  const JsonField f = at(key);
  const std::string v = f.as_string();
  if (std::find(choices.begin(), choices.end(), v) != choices.end()) return v;
  std::string list;
  for (const auto& c : choices) list += (list.empty() ? "" : ", ") + c;
  throw SchemaError(f.path() + ": '" + cut_for_message(v, 40) + "' is not one of " + list);
}

std::vector<std::string> JsonField::strings(const char* key) const {
  std::vector<std::string> out;
  for (const auto& item : at(key).items()) out.push_back(item.as_string());
  return out;
}

std::string json_text(const nlohmann::ordered_json& j, int indent) {
  return j.dump(indent, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
}

}  // namespace accumplan
