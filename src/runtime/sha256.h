// runtime/sha256.h — SHA-256 (FIPS 180-4) of bytes and files, for ModelInfo::sha256.
//
// What it is: a small, dependency-free implementation so a plan can name the exact model file it
// was measured on and the executor can refuse a different one. Torch-free; tested against the
// FIPS 180-4 example vectors ("abc", the 448-bit message, one million 'a').
// What it is not: constant-time or meant for secrets; it fingerprints files.
#pragma once

#include <cstdint>
#include <string>

namespace accumplan {

class Sha256 {
 public:
  Sha256();
  void update(const void* data, size_t size);
  void update(const std::string& bytes) { update(bytes.data(), bytes.size()); }
  std::string hex_digest();  // finishes the hash; call once

 private:
  void block(const uint8_t* p);
  uint32_t h_[8];
  uint8_t buf_[64];
  size_t buf_len_ = 0;
  uint64_t total_bytes_ = 0;
};

std::string sha256_hex(const std::string& bytes);

// Hex SHA-256 of a file's bytes, read in 1 MiB chunks. Throws InputError if it cannot be opened.
std::string sha256_of_file(const std::string& path);

}  // namespace accumplan
