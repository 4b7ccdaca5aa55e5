// `accumplan --model ... --batch-file batch.pt` end to end through the real binary: real samples
// (Python's torch.save([inputs..., target], f)) replace the synthetic specs, the plan's setup
// records the specs read from the file, and a file the model cannot take is refused with the
// model's own error and the file's name.
//
// What it is not: a test of load_batch_file's parsing and tiling (test_model_batch.cpp).
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include "cli_runner.h"
#include "torch_save_file.h"

#include "catch_after_torch.h"  // last: after glog's CHECK from LibTorch

using namespace accumplan::test;
using nlohmann::json;

TEST_CASE("CLI --batch-file: real samples are profiled, planned and confirmed; the plan names their specs",
          "[cli][device][batch-file]") {
  const std::string dir = scratch_dir("cli-batch-file");
  torch::manual_seed(7);
  // Five real samples of builtin:mlp (64 features, classes 0..6): tiled to every probed size.
  const std::string batch =
      write_torch_save(dir + "/batch.pt", {torch::randn({5, 64}), torch::tensor({2, 3, 4, 5, 6}, torch::kLong)});
  const CliResult r = run_cli({"--model", "builtin:mlp", "--batch-file", batch, "--target-batch", "128", "--device", "cpu",
                               "--memory-budget", "2MiB", "--threads", "2"});
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  const json plan = json::parse(r.out);
  CHECK(plan["confirmed"] == true);
  CHECK(plan["confirmed_peak_bytes"].get<int64_t>() <= 2 * 1024 * 1024);
  CHECK(plan["setup"]["inputs"] == json::array({"float32[B,64]"}));
  CHECK(plan["setup"]["target"] == "int64[B]:7");  // the largest class in the file is 6
  int64_t sum = 0;
  for (const auto& n : plan["microbatch_sizes"]) sum += n.get<int64_t>();
  CHECK(sum == 128);
}

TEST_CASE("CLI --batch-file: a file the model cannot take, or one given beside --input, exits 2", "[cli][device][batch-file][errors]") {
  const std::string dir = scratch_dir("cli-batch-file-bad");
  const std::string narrow = write_torch_save(dir + "/narrow.pt", {torch::randn({4, 63}), torch::zeros({4}, torch::kLong)});
  const CliResult r = run_cli({"--model", "builtin:mlp", "--batch-file", narrow, "--target-batch", "16", "--device", "cpu",
                               "--memory-budget", "2MiB"});
  INFO(r.err);
  CHECK(r.exit_code == 2);
  CHECK(r.err.find("--batch-file " + narrow) != std::string::npos);
  CHECK(r.err.find("mat1 and mat2 shapes cannot be multiplied") != std::string::npos);
  CHECK(r.out.empty());

  const CliResult both = run_cli({"--model", "builtin:mlp", "--batch-file", narrow, "--input", "float32[B,64]",
                                  "--target-batch", "16", "--device", "cpu"});
  CHECK(both.exit_code == 2);
  CHECK(both.err.find("give either --batch-file or --input/--target specs, not both") != std::string::npos);
}

TEST_CASE("CLI --batch-file: the file is host data, outside every measured peak, as run keeps its --data",
          "[cli][device][batch-file]") {
  // 20,000 samples of builtin:mlp (5.1 MiB of features): loaded through the CPU counting allocator,
  // they must not sit inside any probe's peak. The profile from the file and the one from specs
  // of the same shapes must measure the same windows.
  const std::string dir = scratch_dir("cli-batch-file-host");
  torch::manual_seed(9);
  const std::string batch = write_torch_save(
      dir + "/big.pt", {torch::randn({20000, 64}), torch::randint(0, 7, {20000}, torch::kLong)});
  const std::vector<std::string> common{"profile", "--model", "builtin:mlp", "--target-batch", "64", "--device", "cpu",
                                        "--memory-budget", "8MiB", "--threads", "2", "--probe-sizes", "2,4"};
  std::vector<std::string> from_file = common, from_specs = common;
  from_file.insert(from_file.end(), {"--batch-file", batch});
  from_specs.insert(from_specs.end(), {"--input", "float32[B,64]", "--target", "int64[B]:7"});
  const CliResult f = run_cli(from_file), s = run_cli(from_specs);
  INFO(f.err << s.err);
  REQUIRE(f.exit_code == 0);
  REQUIRE(s.exit_code == 0);
  const json pf = json::parse(f.out), ps = json::parse(s.out);
  REQUIRE(pf["points"].size() == ps["points"].size());
  for (size_t i = 0; i < pf["points"].size(); ++i) {
    const double a = pf["points"][i]["peak_bytes"].get<double>(), b = ps["points"][i]["peak_bytes"].get<double>();
    INFO("b=" << pf["points"][i]["micro_batch"] << ": from the file " << a << ", from specs " << b);
    CHECK(std::abs(a - b) < 0.02 * b);  // 5.1 MiB of file against peaks of about 1.1 MiB before the fix
  }
}
