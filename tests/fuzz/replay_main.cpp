// replay_main.cpp — a main for the fuzz targets where libFuzzer is not available (GCC builds):
// runs every file named, and every file in every directory named, through
// LLVMFuzzerTestOneInput once. Arguments starting with '-' (libFuzzer flags) are ignored, so
// ctest runs the same command line against either build.
// What it is not: a fuzzer; it never mutates anything.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace {
void run_file(const std::filesystem::path& p, size_t* runs) {
  std::ifstream in(p, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  ++*runs;
}
}  // namespace

int main(int argc, char** argv) {
  size_t runs = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (!arg.empty() && arg[0] == '-') continue;
    const std::filesystem::path p(arg);
    if (std::filesystem::is_directory(p)) {
      std::vector<std::filesystem::path> files;
      for (const auto& e : std::filesystem::directory_iterator(p)) {
        if (e.is_regular_file()) files.push_back(e.path());
      }
      std::sort(files.begin(), files.end());
      for (const auto& f : files) run_file(f, &runs);
    } else {
      run_file(p, &runs);
    }
  }
  std::printf("replay: %zu inputs, no finding\n", runs);
  return 0;
}
