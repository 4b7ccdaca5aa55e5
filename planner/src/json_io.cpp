// json_io.cpp — file I/O and path-aware JSON reading. See json_io.h.
#include "accumplan/json_io.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "accumplan/errors.h"

namespace accumplan {

std::string read_text_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw InputError(what + ": cannot open '" + path + "': " + std::strerror(errno));
  }
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  const std::string text = read_text_file(path, what);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
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
    throw InputError(what + ": '" + path + "' is not valid JSON (line " + std::to_string(line) +
                     ", column " + std::to_string(col) + ")");
  }
}

void write_text_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) {
      throw InputError("cannot write '" + path + "': " + std::strerror(errno) +
                       " (is the directory there and writable?)");
    }
    out << text;
    out.flush();
    if (!out) {
      std::remove(tmp.c_str());
      throw InputError("cannot write '" + path + "': write failed (disk full?)");
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    std::remove(tmp.c_str());
    throw InputError("cannot write '" + path + "': " + err);
  }
}

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
}  // namespace

void JsonField::fail(const std::string& expected) const {
  throw SchemaError(path_ + ": expected " + expected + ", found " + type_name(*value_));
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
  if (!value_->is_number_integer() && !value_->is_number_unsigned()) fail("an integer");
  return value_->get<int64_t>();
}

double JsonField::as_double() const {
  if (!value_->is_number()) fail("a number");
  return value_->get<double>();
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

std::optional<std::string> JsonField::opt_str(const char* key) const {
  if (!has(key) || (*value_)[key].is_null()) return std::nullopt;
  return at(key).as_string();
}

std::vector<std::string> JsonField::strings(const char* key) const {
  std::vector<std::string> out;
  for (const auto& item : at(key).items()) out.push_back(item.as_string());
  return out;
}

}  // namespace accumplan
