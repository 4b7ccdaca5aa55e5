// accumplan/errors.h — the one error hierarchy of accumplan, with process exit codes.
//
// What it is: every error a user can cause (bad flag, bad file, infeasible plan) derives from
// `InputError` and maps to exit code 2; anything else that escapes is an internal error (exit 1).
// What it is not: a logging facility. Messages are complete sentences that name the bad value
// (user text cut to 80 characters by `cut_for_message`) and, where there is one, the fix.
#pragma once

#include <stdexcept>
#include <string>
#include <utility>

namespace accumplan {

enum ExitCode : int {
  kExitOk = 0,
  kExitInternal = 1,  // a bug or an environment failure we did not anticipate
  kExitInput = 2,     // bad input, infeasible plan, backend not built: the user can fix it
};

class Error : public std::runtime_error {
 public:
  // `what` is the one line every user sees; `detail` (e.g. a model's TorchScript traceback, many
  // lines) is printed under it only with --verbose.
  explicit Error(const std::string& what, std::string detail = "")
      : std::runtime_error(what), detail_(std::move(detail)) {}
  virtual int exit_code() const { return kExitInternal; }
  const std::string& detail() const { return detail_; }

 private:
  std::string detail_;
};

// Bad flag, bad file, bad value. Exit code 2.
class InputError : public Error {
 public:
  using Error::Error;
  int exit_code() const override { return kExitInput; }
};

// A JSON document that does not match its schema; the message names the JSON path ($.a.b[2]).
class SchemaError : public InputError {
 public:
  using InputError::InputError;
};

// The request is well-formed but no plan satisfies it (budget too small, B not divisible by W).
class InfeasibleError : public InputError {
 public:
  using InputError::InputError;
};

// A collective with the other ranks failed: a peer exited or the connection dropped. Not the
// user's input, and not a bug: exit code 1, one line naming this rank.
class PeerError : public Error {
 public:
  using Error::Error;
};
// A backend (CUDA, CUPTI, LibTorch) was asked for but not compiled in; the message says how to
// reconfigure.
class BackendNotBuiltError : public InputError {
 public:
  using InputError::InputError;
};

// User text for an error message: at most 80 characters (longer text is cut and ends with
// "... (N characters)"), control characters shown as '?', so a message stays one short line
// whatever the input held (a 50 MB string, a newline in a file name).
// The first `n` bytes of `text` with control characters (C0 and DEL) shown as '?': the one rule
// that keeps user text on one line, for cut_for_message and path_for_message.
inline std::string printable_prefix(const std::string& text, size_t n) {
  std::string out;
  out.reserve(n + 32);
  for (size_t i = 0; i < n && i < text.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    out += (c < 0x20 || c == 0x7f) ? '?' : static_cast<char>(c);
  }
  return out;
}

// A whole message on one line: control characters as '?', nothing cut. The CLI prints every
// refusal through it, so a value a message echoes uncut still cannot break the line.
inline std::string one_line(const std::string& text) { return printable_prefix(text, text.size()); }
// The first line of an error's text: a TorchScript or c10 error runs on into a traceback.
inline std::string first_line(const std::string& text) { return text.substr(0, text.find('\n')); }

inline std::string cut_for_message(const std::string& text, size_t max_chars = 80) {
  size_t n = text.size() <= max_chars ? text.size() : max_chars;
  // Never cut inside a UTF-8 sequence: back off to the start of the character.
  while (n > 0 && n < text.size() && (static_cast<unsigned char>(text[n]) & 0xC0) == 0x80) --n;
  std::string out = printable_prefix(text, n);
  if (n < text.size()) out += "... (" + std::to_string(text.size()) + " characters)";
  return out;
}

// A file path for an error message: the one rule for every message that echoes a path. Control
// characters show as '?' (as in cut_for_message); a path longer than `max_chars` bytes (UTF-8
// bytes, not characters; the result may be 2 bytes longer for the "…") keeps its END — the file
// name and, when they fit together, its directory — and as much of its start as fits, elided in
// the middle at a '/' ("/home/me/…/no-such-dir/plan.json"). Why the end: in a deep project folder
// the part that names the problem (the missing directory, the file) is the last part; cutting the
// end would tell users about "/home/me/.../no-such-...". A last component longer than the
// limit on its own keeps its start and its end.
inline std::string path_for_message(const std::string& path, size_t max_chars = 80) {
  static const std::string kEllipsis = "\xE2\x80\xA6";  // "…": one character, three UTF-8 bytes
  const std::string s = printable_prefix(path, path.size());
  if (max_chars < 8) max_chars = 8;  // room for "a…/b": below that nothing useful is left
  if (s.size() <= max_chars) return s;
  // Byte offsets moved onto the start of a UTF-8 character (never inside a multi-byte sequence).
  const auto back_to_char = [&s](size_t i) {
    while (i > 0 && i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    return i;
  };
  const auto forward_to_char = [&s](size_t i) {
    while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
    return i;
  };
  size_t end = s.size();
  while (end > 1 && s[end - 1] == '/') --end;  // "dir/sub/" names "sub"
  const size_t name_slash = end == 0 ? std::string::npos : s.rfind('/', end - 1);
  size_t tail = name_slash == std::string::npos || name_slash == 0 ? 0 : name_slash;
  if (tail > 0) {
    const size_t dir_slash = s.rfind('/', tail - 1);
    if (dir_slash != std::string::npos && dir_slash > 0 && s.size() - dir_slash + 1 < max_chars) tail = dir_slash;
  }
  if (tail == 0 || s.size() - tail + 1 >= max_chars) {
    // No directory to elide, or the file name alone is too long: its start and its end.
    const size_t keep = max_chars - 1, first = back_to_char(keep / 2);
    return s.substr(0, first) + kEllipsis + s.substr(forward_to_char(s.size() - (keep - first)));
  }
  size_t head = back_to_char(max_chars - 1 - (s.size() - tail));
  const size_t head_slash = head == 0 ? std::string::npos : s.rfind('/', head - 1);
  if (head_slash != std::string::npos) head = head_slash + 1;  // "/home/me/", not "/home/m"
  return s.substr(0, head) + kEllipsis + s.substr(tail);
}

// An invariant broke: always a bug in accumplan. Exit code 1.
class InternalError : public Error {
 public:
  using Error::Error;
};

}  // namespace accumplan
