// Hostile inputs to the LibTorch commands: the main job, `profile`, `run` and `verify`
// given out-of-range numbers, directories and damaged batch files, targets the model cannot take,
// and models that reject the plan's inputs. Every case exits 2 with exactly one line naming the
// bad value, prints nothing on stdout and leaves no file behind (tests/cli/cli_expect.h); the
// range checks come before profiling, so none of them measures anything first.
//
// What it is not: the planner-only commands' cases (tests/cli/test_cli_hostile.cpp) or the
// wording of every message (the commands' own tests).
#include <torch/csrc/jit/serialization/pickle.h>
#include <torch/torch.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"  // path_for_message: how messages show a path
#include "cli_runner.h"
#include "torch_save_file.h"

#include "catch_after_torch.h"  // last: after glog's CHECK from LibTorch
#include "cli_expect.h"         // after Catch

using namespace accumplan::test;

namespace {

uint32_t crc32_of(const std::string& bytes) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : bytes) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

uint32_t le32(const std::string& s, size_t at) {
  return static_cast<uint32_t>(static_cast<unsigned char>(s[at])) | static_cast<uint32_t>(static_cast<unsigned char>(s[at + 1])) << 8 |
         static_cast<uint32_t>(static_cast<unsigned char>(s[at + 2])) << 16 |
         static_cast<uint32_t>(static_cast<unsigned char>(s[at + 3])) << 24;
}
uint16_t le16(const std::string& s, size_t at) {
  return static_cast<uint16_t>(static_cast<unsigned char>(s[at]) | static_cast<unsigned char>(s[at + 1]) << 8);
}
void put32(std::string& s, size_t at, uint32_t v) {
  for (int i = 0; i < 4; ++i) s[at + static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xFF);
}

// torch.save([x, y]) of x = float32 [2, 5] (40 bytes of storage), then its pickle edited to claim
// sizes [32, 64]: the file a hostile or damaged source hands over. LibTorch's zip writer stores
// entries uncompressed with a data descriptor (general-purpose flag bit 3: the local header's CRC
// and sizes are 0, the real ones follow the data and sit in the central directory), so the edit
// keeps every length and both CRC-32 copies of data.pkl are updated.
// With `declare_more`, the sizes become [15, 17] and the storage's declared element count 255
// (1020 bytes) over the same 40-byte record: every element the tensor addresses lies inside the
// declared storage, only the record is short.
std::string write_lying_batch_file(const std::string& path, bool declare_more = false) {
  c10::List<at::Tensor> list;
  list.push_back(torch::arange(10, torch::kFloat).reshape({2, 5}));
  list.push_back(torch::zeros({2}, torch::kLong));
  const std::vector<char> raw = torch::jit::pickle_save(c10::IValue(list));
  std::string zip(raw.begin(), raw.end());
  const std::string name_tail = "data.pkl";
  size_t central = std::string::npos;
  for (size_t at = zip.find("PK\x01\x02"); at != std::string::npos; at = zip.find("PK\x01\x02", at + 4)) {
    const std::string name = zip.substr(at + 46, le16(zip, at + 28));
    if (name.size() >= name_tail.size() && name.compare(name.size() - name_tail.size(), name_tail.size(), name_tail) == 0) {
      central = at;
      break;
    }
  }
  if (central == std::string::npos) throw std::runtime_error("no data.pkl in the torch.save zip");
  const size_t data_len = le32(zip, central + 20);
  const size_t local = le32(zip, central + 42);
  const size_t data_at = local + 30 + le16(zip, local + 26) + le16(zip, local + 28);
  std::string pkl = zip.substr(data_at, data_len);
  // MARK, BININT1 2, BININT1 5, TUPLE: the sizes (2, 5) -> (32, 64); the strides (5, 1) follow.
  const std::string sizes("(K\x02K\x05t", 6);
  const size_t s = pkl.find(sizes);
  if (s == std::string::npos) throw std::runtime_error("the sizes (2, 5) are not in data.pkl");
  pkl.replace(s, sizes.size(), declare_more ? std::string("(K\x0fK\x11t", 6) : std::string("(K\x20K\x40t", 6));
  if (declare_more) {  // ('storage', FloatStorage, '0', 'cpu', 10): the element count follows "cpu"
    const size_t n = pkl.find("K\x0a", pkl.find("cpu"));
    if (n == std::string::npos) throw std::runtime_error("the storage's element count 10 is not in data.pkl");
    pkl[n + 1] = '\xff';
  }
  zip.replace(data_at, data_len, pkl);
  const uint32_t crc = crc32_of(pkl);
  put32(zip, central + 16, crc);
  if (le16(zip, local + 6) & 0x8) {  // the data descriptor: optional signature, then the CRC
    const size_t d = data_at + data_len;
    put32(zip, zip.compare(d, 4, "PK\x07\x08") == 0 ? d + 4 : d, crc);
  } else {
    put32(zip, local + 14, crc);
  }
  std::ofstream(path, std::ios::binary).write(zip.data(), static_cast<std::streamsize>(zip.size()));
  return path;
}

struct Fixture {
  std::string dir;   // inputs: plans, batch files
  std::string plan;  // a plan for builtin:mlp, made by the main job
};

const Fixture& fixture() {
  static const Fixture f = [] {
    Fixture x;
    x.dir = scratch_dir("hostile-torch-" + std::to_string(::getpid()));
    x.plan = x.dir + "/plan.json";
    const CliResult r = run_cli({"--model", "builtin:mlp", "--target-batch", "32", "--device", "cpu", "--memory-budget",
                                 "2MiB", "--threads", "2", "--progress", "none", "--out", x.plan});
    if (r.exit_code != 0) throw std::runtime_error("accumplan --model builtin:mlp failed: " + r.err);
    return x;
  }();
  return f;
}

}  // namespace

TEST_CASE("CLI hostile torch: the main job refuses out-of-range numbers before measuring anything",
          "[cli][hostile][device]") {
  const std::string out = scratch_dir("hostile-torch-main-out");
  auto job = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"--model", "builtin:mlp", "--device", "cpu", "--memory-budget", "2MiB",
                                     "--progress", "none", "--out", out + "/plan.json"};
    args.insert(args.end(), extra.begin(), extra.end());
    if (std::find(extra.begin(), extra.end(), "--target-batch") == extra.end()) {
      args.insert(args.end(), {"--target-batch", "16"});
    }
    return args;
  };
  expect_refusal(out, job({"--target-batch", "9223372036854775807"}),
                 "--target-batch: 9223372036854775807 is out of range [1, 1099511627776]");
  expect_refusal(out, job({"--target-batch", "4611686018427387904"}), "--target-batch: 4611686018427387904 is out of range");
  expect_refusal(out, job({"--lr", "1e308"}), "--lr: 1e+308 is out of range [0, 1e+06]");
  expect_refusal(out, job({"--lr", "inf"}), "--lr: inf is out of range");
  expect_refusal(out, job({"--momentum", "nan", "--optimizer", "momentum"}), "--momentum: nan is out of range [0, 1)");
  expect_refusal(out, job({"--max-grad-norm", "nan"}), "--max-grad-norm: nan is out of range");
  expect_refusal(out, job({"--threads", "1000000"}), "--threads: Value 1000000 not in range");
  expect_refusal(out, job({"--max-micro-batch", "-1"}), "--max-micro-batch must be at least 1, got -1");
  expect_refusal(out, job({"--input", "float32[B,99999999999]"}), "dimension 99999999999 is out of range");
  expect_refusal(out, job({"--world-size", "4611686018427387904", "--target-batch", "16"}), "--world-size: 4611686018427387904 is out of range");
}

TEST_CASE("CLI hostile torch: batch files that are directories, damaged, or name classes the model lacks",
          "[cli][hostile][device][batch-file]") {
  const Fixture& f = fixture();
  const std::string out = scratch_dir("hostile-torch-batch-out");
  auto job = [&](const std::string& batch) {
    return std::vector<std::string>{"--model", "builtin:mlp", "--batch-file", batch, "--target-batch", "16", "--device",
                                    "cpu", "--memory-budget", "2MiB", "--progress", "none", "--out", out + "/plan.json"};
  };
  expect_refusal(out, job(f.dir), "is a directory");
  expect_refusal(out, job("/dev/null"), "is empty (/dev/null)");
  // Sizes [32, 64] over 40 bytes of storage: read past its end before (or SIGSEGV for [2^40, 64]).
  expect_refusal(out, job(write_lying_batch_file(f.dir + "/lying.pt")), "(shape [32,64]) claims 876 bytes but its storage holds 40");
  // A storage declared as 1020 bytes over a 40-byte record: read past the record's end before.
  expect_refusal(out, job(write_lying_batch_file(f.dir + "/short-record.pt", true)),
                 "a tensor's storage declares 1020 bytes but its record in the archive holds 40");
  // --seq-len-file is an input: --out onto it replaced the lengths with the plan (exit 0).
  const std::string lengths = out + "/lengths.txt";
  std::ofstream(lengths) << "5 9 12\n";
  expect_refusal(out,
                 {"--model", "builtin:tinylm", "--seq-len-file", lengths, "--input", "int64[B,T]:1000", "--target",
                  "int64[B,T]:1000", "--target-batch", "8", "--device", "cpu", "--memory-budget", "64MiB", "--out", lengths},
                 "is the --seq-len-file file it is made from");
  CHECK(slurp(lengths) == "5 9 12\n");
  std::filesystem::remove(lengths);
  // Data `run --data` refuses is refused by the main job too: one data check for both.
  const std::string negative =
      write_torch_save(f.dir + "/negative.pt", {torch::randn({4, 64}), torch::tensor({1, -2, 5, 3}, torch::kLong)});
  expect_refusal(out, job(negative), "its targets (class ids) range over [-2, 5] but must be 0 or more (or -100 to ignore)");
  const std::string ignored = write_torch_save(f.dir + "/ignored.pt", {torch::randn({4, 64}), torch::full({4}, -100, torch::kLong)});
  expect_refusal(out, job(ignored), "has no valid target: every target is the ignore index -100");
  at::Tensor nan_inputs = torch::randn({4, 64});
  nan_inputs[3][0] = std::numeric_limits<float>::infinity();
  const std::string nan = write_torch_save(f.dir + "/nan.pt", {nan_inputs, torch::zeros({4}, torch::kLong)});
  expect_refusal(out, job(nan), "input 0 holds NaN or infinite values in 1 sample(s), the first sample 3");
  const std::string rag = write_ragged_save(f.dir + "/long.pt", {torch::ones({30}, torch::kLong), torch::ones({4}, torch::kLong)}, {});
  expect_refusal(out,
                 {"--model", "builtin:tinylm", "--batch-file", rag, "--seq-len", "2..20", "--target-batch", "16", "--device",
                  "cpu", "--memory-budget", "64MiB", "--progress", "none", "--out", out + "/plan.json"},
                 "sequence 0 has 30 tokens, more than the 20 of --seq-len 2..20");
  // builtin:mlp has 10 classes; class 50 in the file makes the target spec int64[B]:51.
  const std::string classes =
      write_torch_save(f.dir + "/classes.pt", {torch::randn({4, 64}), torch::tensor({1, 2, 50, 3}, torch::kLong)});
  expect_refusal(out, job(classes), "the targets are class indices in [0, 51)");
  // The model rejects the file's inputs: its own error line, the traceback only with --verbose.
  const std::string narrow = write_torch_save(f.dir + "/narrow.pt", {torch::randn({4, 63}), torch::zeros({4}, torch::kLong)});
  expect_refusal(out, job(narrow), "mat1 and mat2 shapes cannot be multiplied");
  std::vector<std::string> verbose = job(narrow);
  verbose.push_back("--verbose");
  const CliResult r = run_cli(verbose);
  CHECK(r.exit_code == 2);
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') > 1);  // the details under the line
}

TEST_CASE("CLI hostile torch: run and verify refuse bad numbers, bad data and a model that rejects the plan",
          "[cli][hostile][run]") {
  const Fixture& f = fixture();
  const std::string out = scratch_dir("hostile-torch-run-out");
  auto run = [&](std::vector<std::string> extra, const std::string& model = "builtin:mlp") {
    std::vector<std::string> args = {"run", "--plan", f.plan, "--model", model, "--steps", "1", "--threads", "2",
                                     "--progress", "none", "--stats", out + "/stats.json", "--plan-out", out + "/p.json"};
    args.insert(args.end(), extra.begin(), extra.end());
    return args;
  };
  expect_refusal(out, run({"--lr", "1e308"}), "--lr: 1e+308 is out of range");
  expect_refusal(out, run({"--clip-grad-norm", "nan"}), "--clip-grad-norm: nan is out of range");
  expect_refusal(out, run({"--clip-grad-norm", "inf"}), "--clip-grad-norm: inf is out of range");
  expect_refusal(out, {"run", "--plan", f.plan, "--model", "builtin:mlp", "--epochs", "9223372036854775807"},
                 "--epochs: 9223372036854775807 is out of range [1, 1000000]");
  expect_refusal(out, {"run", "--plan", f.plan, "--model", "builtin:mlp", "--synthetic-samples", "1000000000"},
                 "--synthetic-samples 1000000000 would take 245.9 GiB of host memory");
  expect_refusal(out, {"run", "--plan", f.plan, "--model", "builtin:mlp", "--synthetic-samples", "2000000000"},
                 "--synthetic-samples: 2000000000 is out of range [1, 1073741824]");
  expect_refusal(out, run({"--threads", "1000000"}), "--threads: Value 1000000 not in range");
  expect_refusal(out, run({"--data", f.dir}), "--data '" + accumplan::path_for_message(f.dir) + "' is a directory");
  const std::string classes =
      write_torch_save(f.dir + "/run-classes.pt", {torch::randn({4, 64}), torch::tensor({1, 2, 50, 3}, torch::kLong)});
  expect_refusal(out, run({"--data", classes}), "its targets (class ids) range over [1, 50] but must be [0, 9]");
  const std::string none_valid =
      write_torch_save(f.dir + "/run-ignored.pt", {torch::randn({4, 64}), torch::full({4}, -100, torch::kLong)});
  expect_refusal(out, run({"--data", none_valid}), "has no valid target: every target is the ignore index -100");
  // A model that rejects the plan's inputs (builtin:mlp takes 64 features; this plan says 63):
  // exit 2, one line ending in the model's own error.
  nlohmann::json doc = nlohmann::json::parse(slurp(f.plan));
  doc["setup"]["inputs"] = nlohmann::json::array({"float32[B,63]"});
  const std::string narrow = f.dir + "/narrow-plan.json";
  std::ofstream(narrow) << doc.dump(1);
  expect_refusal(out, {"run", "--plan", narrow, "--model", "builtin:mlp", "--steps", "1", "--stats", out + "/s.json",
                       "--progress", "none"},
                 "the model rejected inputs of shape [32,63] (from synthetic samples of the plan's setup.inputs); its "
                 "forward failed with: RuntimeError: mat1 and mat2");
  expect_refusal(out, {"verify", "--plan", narrow, "--model", "builtin:mlp"}, "RuntimeError: mat1 and mat2");
}
