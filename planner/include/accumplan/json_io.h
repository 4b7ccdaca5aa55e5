// accumplan/json_io.h — files in and out, and a JSON reader that knows where it is.
//
// What it is: `read_json_file` / `read_text_file` (a missing file, a directory, an empty file, a
// FIFO, a device or a socket each refused with its own one-line message; a FIFO never blocks, it
// is opened O_NONBLOCK and refused; invalid JSON with line and column; a number beyond a double,
// such as 1e400, named by its JSON path), `write_text_atomic` (see below), and `JsonField`, a
// cursor that reads typed fields and reports a missing, ill-typed or out-of-range one by its JSON
// path (`$.memory.budget_bytes: expected an integer, found string`, `$.points[0].peak_bytes: -5 is
// out of range; expected an integer in [0, 1125899906842624]`). User text in messages is cut to
// 80 characters.
// What it is not: a schema validator; schema.cpp states what each document holds and which range
// each number has (docs/plan-format.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace accumplan {

// Files larger than this are refused before they are read (no plan or profile comes near it).
inline constexpr int64_t kMaxInputFileBytes = int64_t{256} << 20;
// JSON nested deeper than this is refused (accumplan's documents nest 4 levels).
inline constexpr int kMaxJsonDepth = 64;

// InputError naming `what` and the path for: a missing or unreadable file, a directory, an empty
// file (or /dev/null), a FIFO, a device, a socket, a file over kMaxInputFileBytes; invalid JSON
// (line and column); a number too large for a double (the JSON path of the field).
nlohmann::json read_json_file(const std::string& path, const std::string& what);
// The same refusals for any input file (a batch file, a model): InputError unless `path` opens as
// a regular file; `noun` says what to give instead ("a file written by torch.save").
void require_regular_file(const std::string& path, const std::string& what, const std::string& noun);
std::string read_text_file(const std::string& path, const std::string& what,
                           const std::string& noun = "a JSON file written by accumplan");
// Parses `text` as read_json_file does; `where` prefixes messages (e.g. "--plan 'p.json'").
nlohmann::json parse_json_text(const std::string& text, const std::string& where);

// Writes `text` to `path` so that `path` holds either its old contents or all of `text`, never a
// part, even across a crash or a power loss:
//  - a regular file (or a new name) is written to an unnamed O_TMPFILE in the same directory
//    (Linux; ACCUMPLAN_NO_TMPFILE=1 in the environment skips it), else to `.ap<6 hex>.tmp` there, fsync'ed, renamed over `path`, and the directory
//    fsync'ed; a temp name is removed on every exit path, SIGINT, SIGTERM and SIGHUP included
//    (their handlers unlink live temp names, then re-raise). The temp name is 13 characters, so a
//    255-character final name works. A symlink is followed: its target is replaced, the link kept.
//    An existing file's permission bits are kept.
//  - `-` is standard output; character and block devices, FIFOs and file-descriptor links
//    (/proc/self/fd/1, /dev/fd/1, /dev/stdout: whatever they point at) are written directly,
//    never replaced. A FIFO with no reader is refused at once (opened O_NONBLOCK), not waited on.
//  - a directory or a socket is refused.
// Throws InputError naming the path and the reason (no such directory, disk full, ...).
void write_text_atomic(const std::string& path, const std::string& text);
// Writes `text` to standard output and flushes it; InputError naming the reason (a full disk:
// "No space left on device") when the write or the flush fails, so no output is lost unsaid.
void write_stdout(const std::string& text);

// The text of a document accumplan writes: indented by `indent`, ending in a newline. Text that
// is not valid UTF-8 (a path or a name from a non-UTF-8 locale) is written with U+FFFD in place
// of the bad bytes rather than failing the write after the work (nlohmann's type_error.316).
std::string json_text(const nlohmann::ordered_json& j, int indent = 2);

// Inclusive bounds for a number read from a document; `lo_open`/`hi_open` make an end exclusive.
struct IntRange {
  int64_t lo;
  int64_t hi;
};
struct RealRange {
  double lo;
  double hi;
  bool lo_open = false;
  bool hi_open = false;
};

// A read-only view of one JSON value plus its path from the document root.
class JsonField {
 public:
  JsonField(const nlohmann::json& value, std::string path) : value_(&value), path_(std::move(path)) {}

  const std::string& path() const { return path_; }
  const nlohmann::json& raw() const { return *value_; }

  bool has(const char* key) const;
  // Child of an object; SchemaError if this is not an object or the key is missing.
  JsonField at(const char* key) const;
  // Elements of an array; SchemaError if this is not an array.
  std::vector<JsonField> items() const;

  std::string as_string() const;
  // An integer that fits int64 (2^63 and above are out of range, never wrapped).
  int64_t as_int() const;
  double as_double() const;  // finite; integers are accepted as doubles
  bool as_bool() const;
  // The same, also refused outside `range` with a message naming the path, value and range.
  int64_t as_int(IntRange range) const;
  double as_double(RealRange range) const;

  // Shorthands for required and optional (absent or null) members.
  std::string str(const char* key) const { return at(key).as_string(); }
  int64_t i64(const char* key) const { return at(key).as_int(); }
  double f64(const char* key) const { return at(key).as_double(); }
  int64_t i64(const char* key, IntRange range) const { return at(key).as_int(range); }
  double f64(const char* key, RealRange range) const { return at(key).as_double(range); }
  bool boolean(const char* key) const { return at(key).as_bool(); }
  std::optional<int64_t> opt_i64(const char* key) const;
  std::optional<double> opt_f64(const char* key) const;
  std::optional<int64_t> opt_i64(const char* key, IntRange range) const;
  std::optional<double> opt_f64(const char* key, RealRange range) const;
  std::optional<std::string> opt_str(const char* key) const;
  std::vector<std::string> strings(const char* key) const;
  // A required string that must be one of `choices` exactly ("balanced\n" is not "balanced").
  std::string one_of(const char* key, const std::vector<std::string>& choices) const;

  [[noreturn]] void fail(const std::string& expected) const;
  // "-5", "9223372036854775808", "\"abc\"": this value as JSON, cut to 80 characters.
  std::string value_text() const;

 private:
  const nlohmann::json* value_;
  std::string path_;
};

}  // namespace accumplan
