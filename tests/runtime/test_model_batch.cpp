// Model loading (files and built-ins) and batches (synthetic, from a torch.save file, tiled).
#include <torch/script.h>

#include <fstream>
#include <iterator>
#include <limits>

#include "accumplan/errors.h"
#include "accumplan/tensor_spec.h"
#include "cli_runner.h"
#include "runtime/batch.h"
#include "runtime/host_data.h"
#include "runtime/model.h"
#include "runtime/torch_save_reader.h"
#include "torch_save_file.h"

#include "catch_after_torch.h"  // last: after glog's CHECK from LibTorch

using namespace accumplan;

TEST_CASE("built-in models load, train, and carry a stable hash", "[model]") {
  CHECK((builtin_model_names() == std::vector<std::string>{"convnet", "mlp", "tinylm"}));
  for (const auto& name : builtin_model_names()) {
    INFO(name);
    const LoadedModel a = load_model("builtin:" + name, torch::kCPU);
    const LoadedModel b = load_model("builtin:" + name, torch::kCPU);
    CHECK(a.info.sha256.size() == 64);
    CHECK(a.info.sha256 == b.info.sha256);  // seeded weights: the same bytes every time
    CHECK(a.info.parameter_count > 0);
    CHECK(a.module.is_training());
    // The defaults describe inputs the model accepts.
    const ModelDefaults d = *builtin_defaults("builtin:" + name);
    std::vector<TensorSpec> specs;
    for (const auto& s : d.inputs) specs.push_back(parse_tensor_spec(s, "--input"));
    const Batch batch = synthetic_batch(specs, parse_tensor_spec(d.target, "--target"), 2, 7, torch::kCPU);
    torch::jit::Module m = a.module;
    const at::Tensor out = m.forward({batch.inputs[0]}).toTensor();
    CHECK(out.size(0) == 2);
  }
  CHECK((load_model("builtin:convnet", torch::kCPU).info.batch_dependent_layers ==
         std::vector<std::string>{"bn1 (BatchNorm2d)"}));
  CHECK(load_model("builtin:mlp", torch::kCPU).info.batch_dependent_layers.empty());
  CHECK_THROWS_WITH(load_model("builtin:resnet", torch::kCPU), Catch::Contains("builtin:convnet"));
}

TEST_CASE("a saved built-in loads from its file with the file's hash", "[model]") {
  const std::string path = test::scratch_dir("model") + "/convnet.pt";
  save_builtin_model("convnet", path);
  const LoadedModel m = load_model(path, torch::kCPU);
  CHECK(m.info.sha256 == sha256_file(path));
  // Saving is deterministic (seeded weights, no timestamps), so the same name hashes the same.
  // (The archive's inner folder is named after the file, so another file name hashes differently.)
  const std::string again = test::scratch_dir("model-again") + "/convnet.pt";
  save_builtin_model("builtin:convnet", again);
  CHECK(sha256_file(again) == m.info.sha256);
  CHECK(sha256_file("builtin:convnet") == sha256_file("builtin:convnet"));
  CHECK(m.info.batch_dependent_layers.size() == 1);
  CHECK(m.info.parameter_count == load_model("builtin:convnet", torch::kCPU).info.parameter_count);
}

TEST_CASE("a missing model file and a file that is not TorchScript are input errors", "[model][errors]") {
  CHECK_THROWS_AS(load_model("/nonexistent/m.pt", torch::kCPU), InputError);
  CHECK_THROWS_WITH(load_model("/nonexistent/m.pt", torch::kCPU), Catch::Contains("no such file"));
  const std::string path = test::scratch_dir("model-bad") + "/bad.pt";
  std::ofstream(path) << "this is not a zip archive";
  CHECK_THROWS_WITH(load_model(path, torch::kCPU), Catch::Contains("is not a TorchScript model"));
}

TEST_CASE("synthetic batches are seeded, shaped by their specs, and integers stay in range", "[batch]") {
  const std::vector<TensorSpec> in = {parse_tensor_spec("float32[B,3,4]", "--input"),
                                      parse_tensor_spec("int64[B,5]:7", "--input")};
  const TensorSpec target = parse_tensor_spec("int64[B]:10", "--target");
  const Batch a = synthetic_batch(in, target, 6, 42, torch::kCPU);
  const Batch b = synthetic_batch(in, target, 6, 42, torch::kCPU);
  const Batch c = synthetic_batch(in, target, 6, 43, torch::kCPU);
  CHECK(a.size() == 6);
  CHECK((a.inputs[0].sizes() == at::IntArrayRef({6, 3, 4})));
  CHECK(a.inputs[1].scalar_type() == at::kLong);
  CHECK(a.inputs[1].max().item<int64_t>() < 7);
  CHECK(a.inputs[1].min().item<int64_t>() >= 0);
  CHECK(a.inputs[0].equal(b.inputs[0]));
  CHECK_FALSE(a.inputs[0].equal(c.inputs[0]));
  CHECK(a.slice(2, 3).size() == 3);
  CHECK(a.slice(2, 3).inputs[0].equal(a.inputs[0].narrow(0, 2, 3)));
  check_batch_matches(a, in, target, "batch");
  CHECK_THROWS_WITH(check_batch_matches(a, {in[0]}, target, "batch"), Catch::Contains("the model takes 1"));
}

TEST_CASE("a torch.save list of tensors loads as a batch and tiles to any size", "[batch]") {
  const at::Tensor x = at::arange(12, at::kFloat).reshape({3, 4});
  const at::Tensor y = at::tensor({0, 1, 2}, at::kLong);
  const std::string dir = test::scratch_dir("batch-file");
  const std::string path = test::write_torch_save(dir + "/batch.pt", {x, y});

  const Batch b = load_batch_file(path, true);
  REQUIRE(b.inputs.size() == 1);
  CHECK(b.inputs[0].equal(x));
  CHECK(b.target.equal(y));
  CHECK(spec_text_of(b.inputs[0]) == "float32[B,4]");
  CHECK(spec_text_of(b.target) == "int64[B]:3");
  const Batch t = tile_batch(b, 7);
  CHECK(t.size() == 7);
  CHECK(t.target.equal(at::tensor({0, 1, 2, 0, 1, 2, 0}, at::kLong)));
  CHECK(t.inputs[0][6].equal(x[0]));

  CHECK_THROWS_WITH(load_batch_file(dir + "/missing.pt", true), Catch::Contains("cannot open"));
  std::ofstream(dir + "/bad.pt") << "garbage";
  CHECK_THROWS_WITH(load_batch_file(dir + "/bad.pt", true), Catch::Contains("is not a file written by torch.save"));
  test::write_torch_save(dir + "/uneven.pt", {x, at::zeros({2}, at::kLong)});
  CHECK_THROWS_WITH(load_batch_file(dir + "/uneven.pt", true), Catch::Contains("dim 0 must be the samples"));
}

TEST_CASE("a torch.save of [sequences, targets] loads as ragged data padded to its longest", "[batch][ragged]") {
  const std::string dir = test::scratch_dir("ragged-file");
  const std::vector<at::Tensor> seqs{at::tensor({5, 6, 7}, at::kLong), at::tensor({8}, at::kLong),
                                     at::tensor({1, 2}, at::kLong)};
  const std::vector<at::Tensor> targets{at::tensor({1, 2, 3}, at::kLong), at::tensor({4}, at::kLong),
                                        at::tensor({0, 1}, at::kLong)};
  const Batch b = load_batch_file(test::write_ragged_save(dir + "/tokens.pt", seqs, targets), true);
  REQUIRE(b.ragged());
  CHECK(b.sequence_lengths() == std::vector<int64_t>{3, 1, 2});
  CHECK(b.padded_length() == 3);
  CHECK(b.inputs[0].equal(at::tensor({5, 6, 7, 8, 0, 0, 1, 2, 0}, at::kLong).reshape({3, 3})));
  CHECK(b.target.equal(at::tensor({1, 2, 3, 4, -100, -100, 0, 1, -100}, at::kLong).reshape({3, 3})));
  // The plan's spec with T matches any padded length.
  check_batch_matches(b, {parse_tensor_spec("int64[B,T]:9", "--input")}, parse_tensor_spec("int64[B,T]:5", "--target"),
                      "--data");
  // A packed microbatch: the rows asked for, cut to their own longest.
  const Batch mb = b.gather({2, 1});
  CHECK(mb.inputs[0].equal(at::tensor({1, 2, 8, 0}, at::kLong).reshape({2, 2})));
  CHECK(mb.sequence_lengths() == std::vector<int64_t>{2, 1});
  CHECK(padding_mask(mb).equal(at::tensor({0, 0, 0, 1}, at::kLong).reshape({2, 2}).to(at::kBool)));
  // None targets: next-token prediction, the last position of each sequence ignored.
  const Batch lm = load_batch_file(test::write_ragged_save(dir + "/lm.pt", seqs, {}), true, "--data", -1);
  CHECK(lm.target.equal(at::tensor({6, 7, -1, -1, -1, -1, 2, -1, -1}, at::kLong).reshape({3, 3})));
  // Slicing and tiling keep the lengths.
  CHECK(b.slice(1, 2).sequence_lengths() == std::vector<int64_t>{1, 2});
  CHECK(tile_batch(b, 5).sequence_lengths() == std::vector<int64_t>{3, 1, 2, 3, 1});
  // Refusals name the file and what is wrong.
  CHECK_THROWS_WITH(load_batch_file(test::write_ragged_save(dir + "/short.pt", seqs, {targets[0], targets[1]}), true),
                    Catch::Contains("has 3 sequences but 2 targets"));
  CHECK_THROWS_WITH(load_batch_file(test::write_ragged_save(dir + "/mismatch.pt", seqs,
                                                            {targets[1], targets[1], targets[2]}), true),
                    Catch::Contains("target 0 has shape [1] but sequence 0 has 3 tokens"));
  CHECK_THROWS_WITH(load_batch_file(test::write_ragged_save(dir + "/empty.pt", {at::zeros({0}, at::kLong)}, {}), true),
                    Catch::Contains("sequence 0 is empty"));
  CHECK_THROWS_WITH(load_batch_file(dir + "/tokens.pt", false), Catch::Contains("the loss takes none"));
}

TEST_CASE("synthetic ragged data has the given lengths, padded as a file loads", "[batch][ragged]") {
  const auto in = parse_tensor_spec("int64[B,T]:50", "--input");
  const auto tg = parse_tensor_spec("int64[B,T]:50", "--target");
  const Batch b = synthetic_ragged_batch({in}, tg, {4, 1, 3}, 7);
  CHECK(b.sequence_lengths() == std::vector<int64_t>{4, 1, 3});
  CHECK(b.inputs[0].sizes() == at::IntArrayRef({3, 4}));
  CHECK(b.inputs[0].masked_select(padding_mask(b)).eq(0).all().item<bool>());
  CHECK(b.target.masked_select(padding_mask(b)).eq(-100).all().item<bool>());
  CHECK(b.target.masked_select(padding_mask(b).logical_not()).ge(0).all().item<bool>());
  CHECK(synthetic_ragged_batch({in}, tg, {4, 1, 3}, 7).inputs[0].equal(b.inputs[0]));  // seeded
  // A class per sequence needs no padding; a fixed-shape input cannot be ragged.
  const Batch classes = synthetic_ragged_batch({in}, parse_tensor_spec("int64[B]:3", "--target"), {2, 5}, 1);
  CHECK(classes.target.sizes() == at::IntArrayRef({2}));
  // A microbatch of it keeps one label per sequence (only [B,T,...] tensors are cut).
  const Batch one = classes.gather({1});
  CHECK(one.target.sizes() == at::IntArrayRef({1}));
  CHECK(one.target.equal(classes.target.narrow(0, 1, 1)));
  CHECK(one.inputs[0].sizes() == at::IntArrayRef({1, 5}));
  CHECK_THROWS_WITH(synthetic_ragged_batch({parse_tensor_spec("float32[B,4]", "--input")}, tg, {2}, 1),
                    Catch::Contains("has no sequence dimension T"));
  CHECK_THROWS_WITH(synthetic_batch({in}, tg, 2, 1, at::kCPU), Catch::Contains("synthetic samples need their lengths"));
}

TEST_CASE("ragged data whose padding would exceed the host-data limit is refused before it is padded",
          "[batch][ragged][host-memory]") {
  // 2 sequences, one of 1000 tokens: padded, 2 x 1000 x 24 bytes (input, target, a temporary) = 48 000.
  const std::vector<at::Tensor> sequences = {torch::ones({1000}, torch::kLong), torch::ones({3}, torch::kLong)};
  ::setenv("ACCUMPLAN_MAX_HOST_DATA", "40kB", 1);
  CHECK_THROWS_WITH(ragged_batch(sequences, {}, -100, "--data 'x.pt'"),
                    Catch::Contains("--data 'x.pt' padded to its longest sequence (2 sequences of up to 1000 tokens) "
                                    "would take 46.9 KiB of host memory, more than the 39.1 KiB allowed"));
  ::setenv("ACCUMPLAN_MAX_HOST_DATA", "64kB", 1);
  CHECK(ragged_batch(sequences, {}, -100, "--data 'x.pt'").inputs[0].sizes() == at::IntArrayRef({2, 1000}));
  ::unsetenv("ACCUMPLAN_MAX_HOST_DATA");
}

TEST_CASE("Batch file: a storage shared by many views is read once", "[batch][host-memory]") {
  // 1000 views of one [1000, 64] tensor: torch.save writes one storage record and 1000 references.
  const at::Tensor base = torch::randn({1000, 64});
  std::vector<at::Tensor> views;
  for (int64_t i = 0; i < 1000; ++i) views.push_back(base[i]);
  const std::string path = test::write_torch_save(test::scratch_dir("shared-storage") + "/views.pt", views);
  const c10::IValue v = read_torch_save(path, "--data 'views.pt'");
  const auto list = v.toListRef();
  REQUIRE(list.size() == 1000);
  const void* first = list[0].toTensor().storage().data();
  for (const auto& e : list) CHECK(e.toTensor().storage().data() == first);  // one buffer, not 1000 copies
  CHECK(list[999].toTensor().equal(base[999]));
}

TEST_CASE("Batch file: the file larger than the host-data limit is refused before it is read", "[batch][host-memory]") {
  const std::string path = test::write_torch_save(test::scratch_dir("big-file") + "/big.pt", {torch::zeros({1000, 64})});
  ::setenv("ACCUMPLAN_MAX_HOST_DATA", "10kB", 1);
  CHECK_THROWS_WITH(read_torch_save(path, "--data 'big.pt'"), Catch::Contains("--data 'big.pt' would take"));
  ::unsetenv("ACCUMPLAN_MAX_HOST_DATA");
}

TEST_CASE("Data check: ids, targets, valid targets, lengths and finiteness are checked once, naming the value",
          "[batch][data-check]") {
  const DataRules rules = data_rules({parse_tensor_spec("int64[B,4]:50", "--input")},
                                     parse_tensor_spec("int64[B]:10", "--target"), -100);
  auto batch = [](at::Tensor x, at::Tensor y) {
    Batch b;
    b.inputs.push_back(x);
    b.target = y;
    return b;
  };
  const at::Tensor ids = torch::randint(0, 50, {4, 4}, torch::kLong);
  CHECK_NOTHROW(check_batch_values(batch(ids, torch::tensor({0, 9, -100, 3}, torch::kLong)), rules, "d", "fix"));
  CHECK_THROWS_WITH(check_batch_values(batch(ids, torch::tensor({0, 10, 1, 3}, torch::kLong)), rules, "d", "fix"),
                    Catch::Contains("d: its targets (class ids) range over [0, 10] but must be [0, 9] (or -100 to ignore); fix"));
  CHECK_THROWS_WITH(check_batch_values(batch(ids, torch::tensor({0, -3, 1, 3}, torch::kLong)), rules, "d", "fix"),
                    Catch::Contains("range over [-3, 3]"));
  CHECK_THROWS_WITH(check_batch_values(batch(ids, torch::full({4}, -100, torch::kLong)), rules, "d", "fix"),
                    Catch::Contains("d has no valid target: every target is the ignore index -100"));
  CHECK_THROWS_WITH(check_batch_values(batch(ids.clone().fill_(-1), torch::zeros({4}, torch::kLong)), rules, "d", "fix"),
                    Catch::Contains("d: the ids of input 0 range over [-1, -1] but must be [0, 49]"));
  const DataRules floats = data_rules({parse_tensor_spec("float32[B,4]", "--input")}, parse_tensor_spec("int64[B]:10", "--target"), -100);
  at::Tensor x = torch::randn({4, 4});
  x[2][1] = std::numeric_limits<float>::quiet_NaN();
  CHECK_THROWS_WITH(check_batch_values(batch(x, torch::zeros({4}, torch::kLong)), floats, "d", "fix"),
                    Catch::Contains("d: input 0 holds NaN or infinite values in 1 sample(s), the first sample 2"));
  // Ragged: a sequence longer than the plan allows.
  Batch r = ragged_batch({torch::ones({3}, torch::kLong), torch::ones({9}, torch::kLong)}, {}, -100, "r");
  r.target = next_token_targets(r, -100);
  DataRules longest = data_rules({parse_tensor_spec("int64[B,T]:50", "--input")}, parse_tensor_spec("int64[B,T]:50", "--target"), -100);
  longest.max_length = 8;
  longest.max_length_source = "--seq-len 2..8";
  CHECK_THROWS_WITH(check_batch_values(r, longest, "r", "fix"),
                    Catch::Contains("r: sequence 1 has 9 tokens, more than the 8 of --seq-len 2..8"));
  longest.max_length = 9;
  CHECK_NOTHROW(check_batch_values(r, longest, "r", "fix"));
}

TEST_CASE("Ragged data: a float target after integer ones is refused, not truncated", "[batch][ragged][data-check]") {
  CHECK_THROWS_WITH(ragged_batch({torch::ones({2}, torch::kLong), torch::ones({2}, torch::kLong)},
                                 {torch::ones({2}, torch::kLong), torch::full({2}, 0.5)}, -100, "r"),
                    Catch::Contains("r: target 1 is float32 but target 0 is int64"));
}

TEST_CASE("Host memory: an allocation LibTorch's CPU allocator cannot make is recognised with its size",
          "[batch][host-memory]") {
  // 2^45 bytes (32 TiB): more than any machine here; malloc refuses it even with overcommit.
  const int64_t bytes = int64_t{1} << 45;
  try {
    const at::Tensor t = at::empty({bytes}, at::TensorOptions(at::kByte));
    FAIL("allocated " << t.numel() << " bytes");
  } catch (const std::exception& e) {
    const std::optional<int64_t> asked = failed_host_allocation_bytes(e.what());
    REQUIRE(asked.has_value());
    CHECK(*asked == bytes);
    CHECK_THAT(host_out_of_memory(*asked, "reading --data 'd.pt'").what(),
               Catch::Contains("the host ran out of memory reading --data 'd.pt': LibTorch could not allocate 32.0 TiB more"));
  }
  CHECK_FALSE(failed_host_allocation_bytes("RuntimeError: mat1 and mat2 shapes cannot be multiplied").has_value());
}

TEST_CASE("Batch file: a compressed record is refused before anything is inflated", "[batch][host-memory]") {
  // torch.save stores records uncompressed; the central directory says "deflated" here (method 8 at
  // offset 10 of every entry), as a zip bomb's would.
  const std::string path = test::write_torch_save(test::scratch_dir("deflated") + "/d.pt", {torch::zeros({4, 3})});
  std::string zip;
  {
    std::ifstream in(path, std::ios::binary);
    zip.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  int entries = 0;
  for (size_t at = zip.find("PK\x01\x02"); at != std::string::npos; at = zip.find("PK\x01\x02", at + 4), ++entries) zip[at + 10] = 8;
  REQUIRE(entries > 0);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(zip.data(), static_cast<std::streamsize>(zip.size()));
  CHECK_THROWS_WITH(read_torch_save(path, "--data 'd.pt'"),
                    Catch::Contains("--data 'd.pt' is damaged or was not written by torch.save: record '") &&
                        Catch::Contains("is compressed (zip method 8)"));
}

TEST_CASE("Host memory: synthetic data over the host-data limit is refused before anything is made",
          "[batch][host-memory]") {
  ::setenv("ACCUMPLAN_MAX_HOST_DATA", "10kB", 1);
  const TensorSpec tokens = parse_tensor_spec("int64[B,T]:50", "--input");
  // 1 sequence of 1000 tokens: 16 000 bytes at 16 bytes an element (the draw and the padded copy).
  CHECK_THROWS_WITH(synthetic_ragged_batch({tokens}, tokens, {1000}, 1),
                    Catch::Contains("a synthetic int64[B,T]:50 of 1 sample(s) of 1000 tokens would take 15.6 KiB of host memory"));
  CHECK_THROWS_WITH(synthetic_batch({parse_tensor_spec("float32[B,1000]", "--input")}, std::nullopt, 1, 1, torch::kCPU),
                    Catch::Contains("a synthetic float32[B,1000] of 1 sample(s) would take 15.6 KiB"));
  CHECK(synthetic_ragged_batch({tokens}, tokens, {100}, 1).inputs[0].sizes() == at::IntArrayRef({1, 100}));
  ::unsetenv("ACCUMPLAN_MAX_HOST_DATA");
}
