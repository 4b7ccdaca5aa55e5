// accumplan/json_io.h — files in and out, and a JSON reader that knows where it is.
//
// What it is: `read_json_file` (clear errors for missing files and invalid JSON, with line and
// column), `write_text_atomic` (temp file in the same directory + rename, so a crash never leaves
// half a plan on disk), and `JsonField`, a cursor that reads typed fields and reports a missing or
// ill-typed one by its JSON path (`$.memory.budget_bytes: expected integer, found string`).
// What it is not: a schema validator; schema.cpp states what each document holds.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace accumplan {

nlohmann::json read_json_file(const std::string& path, const std::string& what);
std::string read_text_file(const std::string& path, const std::string& what);

// Writes `text` to `path` atomically: `path.tmp-<pid>` then rename(2). Throws InputError naming
// the path if the directory is not writable.
void write_text_atomic(const std::string& path, const std::string& text);

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
  int64_t as_int() const;
  double as_double() const;  // integers are accepted as doubles
  bool as_bool() const;

  // Shorthands for required and optional (absent or null) members.
  std::string str(const char* key) const { return at(key).as_string(); }
  int64_t i64(const char* key) const { return at(key).as_int(); }
  double f64(const char* key) const { return at(key).as_double(); }
  bool boolean(const char* key) const { return at(key).as_bool(); }
  std::optional<int64_t> opt_i64(const char* key) const;
  std::optional<double> opt_f64(const char* key) const;
  std::optional<std::string> opt_str(const char* key) const;
  std::vector<std::string> strings(const char* key) const;

  [[noreturn]] void fail(const std::string& expected) const;

 private:
  const nlohmann::json* value_;
  std::string path_;
};

}  // namespace accumplan
