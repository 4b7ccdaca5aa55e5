// SHA-256 against the FIPS 180-4 example vectors, and file hashing.
#include <catch2/catch.hpp>

#include <fstream>

#include "cli_runner.h"
#include "runtime/sha256.h"

using namespace accumplan;

TEST_CASE("sha256 matches the FIPS 180-4 vectors", "[sha256]") {
  CHECK(sha256_hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  // One million 'a', fed in uneven pieces so the block buffering is exercised.
  Sha256 s;
  const std::string chunk(997, 'a');
  size_t left = 1000000;
  while (left > 0) {
    const size_t n = std::min(left, chunk.size());
    s.update(chunk.data(), n);
    left -= n;
  }
  CHECK(s.hex_digest() == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("sha256_of_file hashes the bytes and refuses a missing file", "[sha256]") {
  const std::string path = test::scratch_dir("sha") + "/abc.txt";
  std::ofstream(path, std::ios::binary) << "abc";
  CHECK(sha256_of_file(path) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK_THROWS_WITH(sha256_of_file(path + ".missing"), Catch::Contains("cannot open"));
}
