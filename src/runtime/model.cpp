// runtime/model.cpp — TorchScript files and the built-in example models. See model.h.
//
// The built-ins are TorchScript modules built in C++ (register_parameter + define), so the
// README's main command, the tests and the committed example profile need no Python. Their weights
// come from a fixed seed, so the serialized bytes — and therefore the SHA-256 recorded in a
// profile — are the same on every run. What this file is not: a model zoo; the built-ins are small
// on purpose (a CPU step takes milliseconds).
#include "runtime/model.h"

#include "accumplan/setup_rules.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/ATen.h>
#include <torch/script.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <unordered_set>

#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "runtime/sha256.h"

namespace accumplan {
namespace {

constexpr const char* kBuiltinPrefix = "builtin:";
constexpr uint64_t kBuiltinSeed = 20240613;

// PyTorch's default init for Linear/Conv: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
at::Tensor init_uniform(at::IntArrayRef shape, int64_t fan_in, at::Generator& gen) {
  const double k = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return at::empty(shape, at::kFloat).uniform_(-k, k, gen);
}

void ensure_training_attr(torch::jit::Module& m) {
  if (!m.hasattr("training")) m.register_attribute("training", c10::BoolType::get(), true);
}

torch::jit::Module new_module(const std::string& name, const std::shared_ptr<torch::jit::CompilationUnit>& cu) {
  torch::jit::Module m(c10::QualifiedName("__torch__.accumplan.builtin." + name), cu, /*shouldMangle=*/true);
  ensure_training_attr(m);
  return m;
}

// builtin:mlp — 64 → 256 → 256 → 10, ReLU. No batch-dependent layers. About 84 K parameters.
torch::jit::Module build_mlp(at::Generator& gen) {
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module m = new_module("MLP", cu);
  const int64_t dims[] = {64, 256, 256, 10};
  for (int i = 0; i < 3; ++i) {
    m.register_parameter("w" + std::to_string(i + 1), init_uniform({dims[i + 1], dims[i]}, dims[i], gen).requires_grad_(), false);
    m.register_parameter("b" + std::to_string(i + 1), init_uniform({dims[i + 1]}, dims[i], gen).requires_grad_(), false);
  }
  m.define(R"(
def forward(self, x):
    h = torch.relu(torch.addmm(self.b1, x, self.w1.t()))
    h = torch.relu(torch.addmm(self.b2, h, self.w2.t()))
    return torch.addmm(self.b3, h, self.w3.t())
)");
  return m;
}

torch::jit::Module build_batchnorm2d(int64_t channels, const std::shared_ptr<torch::jit::CompilationUnit>& cu) {
  torch::jit::Module bn = new_module("BatchNorm2d", cu);
  bn.register_parameter("weight", at::ones({channels}).requires_grad_(), false);
  bn.register_parameter("bias", at::zeros({channels}).requires_grad_(), false);
  bn.register_buffer("running_mean", at::zeros({channels}));
  bn.register_buffer("running_var", at::ones({channels}));
  bn.register_attribute("track_running_stats", c10::BoolType::get(), true);
  bn.define(R"(
def forward(self, x):
    return torch.batch_norm(x, self.weight, self.bias, self.running_mean, self.running_var,
                            self.training, 0.1, 1e-5, False)
)");
  return bn;
}

// builtin:convnet — CIFAR-sized: conv3x3(3→32)+BN+ReLU, conv3x3(32→64)+ReLU, maxpool 2,
// conv3x3(64→64)+ReLU, global average pool, linear 64→10. One BatchNorm2d (bn1), so the
// batch-dependence warning shows. At 32×32 its activations are about 1.5 MiB per sample, so a
// 256 MiB budget holds on the order of 150 samples and a target batch of 256 needs accumulation.
torch::jit::Module build_convnet(at::Generator& gen) {
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module m = new_module("ConvNet", cu);
  auto conv = [&](const std::string& name, int64_t in, int64_t out) {
    m.register_parameter(name + "_w", init_uniform({out, in, 3, 3}, in * 9, gen).requires_grad_(), false);
    m.register_parameter(name + "_b", init_uniform({out}, in * 9, gen).requires_grad_(), false);
  };
  conv("c1", 3, 32);
  conv("c2", 32, 64);
  conv("c3", 64, 64);
  m.register_parameter("fc_w", init_uniform({10, 64}, 64, gen).requires_grad_(), false);
  m.register_parameter("fc_b", init_uniform({10}, 64, gen).requires_grad_(), false);
  m.register_module("bn1", build_batchnorm2d(32, cu));
  m.define(R"(
def forward(self, x):
    h = torch.conv2d(x, self.c1_w, self.c1_b, [1, 1], [1, 1])
    h = torch.relu(self.bn1.forward(h))
    h = torch.relu(torch.conv2d(h, self.c2_w, self.c2_b, [1, 1], [1, 1]))
    h = torch.max_pool2d(h, [2, 2], [2, 2])
    h = torch.relu(torch.conv2d(h, self.c3_w, self.c3_b, [1, 1], [1, 1]))
    h = torch.mean(h, [2, 3])
    return torch.addmm(self.fc_b, h, self.fc_w.t())
)");
  return m;
}

// builtin:tinylm — token ids [B,32] in [0,1000) → embedding 64 → tanh MLP → logits [B,32,1000]:
// a per-token cross-entropy model (normalization "auto" resolves to tokens).
torch::jit::Module build_tinylm(at::Generator& gen) {
  auto cu = std::make_shared<torch::jit::CompilationUnit>();
  torch::jit::Module m = new_module("TinyLM", cu);
  const int64_t vocab = 1000, dim = 64, hidden = 128;
  m.register_parameter("emb", at::empty({vocab, dim}).normal_(0, 1, gen).requires_grad_(), false);
  m.register_parameter("w1", init_uniform({hidden, dim}, dim, gen).requires_grad_(), false);
  m.register_parameter("b1", init_uniform({hidden}, dim, gen).requires_grad_(), false);
  m.register_parameter("out_w", init_uniform({vocab, hidden}, hidden, gen).requires_grad_(), false);
  m.register_parameter("out_b", init_uniform({vocab}, hidden, gen).requires_grad_(), false);
  m.define(R"(
def forward(self, tokens):
    h = torch.embedding(self.emb, tokens)
    h = torch.tanh(torch.matmul(h, self.w1.t()) + self.b1)
    return torch.matmul(h, self.out_w.t()) + self.out_b
)");
  return m;
}

using Builder = std::function<torch::jit::Module(at::Generator&)>;

const std::map<std::string, std::pair<Builder, ModelDefaults>>& builtins() {
  static const std::map<std::string, std::pair<Builder, ModelDefaults>> table = {
      {"mlp", {build_mlp, {{"float32[B,64]"}, "int64[B]:10", "cross_entropy"}}},
      {"convnet", {build_convnet, {{"float32[B,3,32,32]"}, "int64[B]:10", "cross_entropy"}}},
      {"tinylm", {build_tinylm, {{"int64[B,32]:1000"}, "int64[B,32]:1000", "cross_entropy"}}},
  };
  return table;
}

std::string builtin_name(const std::string& path_or_builtin) {
  return path_or_builtin.substr(std::string(kBuiltinPrefix).size());
}

const std::pair<Builder, ModelDefaults>& find_builtin(const std::string& name) {
  const auto it = builtins().find(name);
  if (it == builtins().end()) {
    std::string names;
    for (const auto& n : builtin_model_names()) names += (names.empty() ? "builtin:" : ", builtin:") + n;
    throw InputError("--model builtin:" + name + " is not a built-in example; choose one of: " + names);
  }
  return it->second;
}

torch::jit::Module build_builtin(const std::string& name) {
  const auto& entry = find_builtin(name);
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(kBuiltinSeed);
  return entry.first(gen);
}

std::string serialize(const torch::jit::Module& m) {
  std::ostringstream out;
  m.save(out);
  return out.str();
}

void add_storage(const at::Tensor& t, std::unordered_set<const void*>& seen, int64_t& bytes) {
  if (!t.defined() || !t.has_storage()) return;
  if (seen.insert(t.storage().unsafeGetStorageImpl()).second) bytes += static_cast<int64_t>(t.storage().nbytes());
}

std::string type_short_name(const torch::jit::Module& m) {
  const auto qn = m.type()->name();
  return qn ? qn->name() : std::string("?");
}

}  // namespace

std::vector<std::string> builtin_model_names() {
  std::vector<std::string> names;
  for (const auto& [name, entry] : builtins()) names.push_back(name);
  return names;
}

bool is_builtin(const std::string& path_or_builtin) { return path_or_builtin.rfind(kBuiltinPrefix, 0) == 0; }

std::optional<ModelDefaults> builtin_defaults(const std::string& path_or_builtin) {
  if (!is_builtin(path_or_builtin)) return std::nullopt;
  return find_builtin(builtin_name(path_or_builtin)).second;
}

void check_model_file(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (!fs::exists(path, ec)) {
    throw InputError("cannot open model file '" + path_for_message(path) +
                     "': no such file. Give a TorchScript file (torch.jit.script(model).save(path)) or one of "
                     "the built-in examples, e.g. builtin:convnet");
  }
  if (fs::is_directory(path, ec)) {
    throw InputError("--model '" + path_for_message(path) + "' is a directory, not a TorchScript file");
  }
  require_regular_file(path, "--model", "a TorchScript file (torch.jit.script(model).save(path))");
}

LoadedModel load_model(const std::string& path_or_builtin, const torch::Device& device) {
  LoadedModel out;
  out.info.path = path_or_builtin;
  if (is_builtin(path_or_builtin)) {
    out.module = build_builtin(builtin_name(path_or_builtin));
    out.info.sha256 = sha256_hex(serialize(out.module));
    if (!device.is_cpu()) out.module.to(device);
  } else {
    check_model_file(path_or_builtin);
    out.info.sha256 = sha256_of_file(path_or_builtin);
    try {
      out.module = torch::jit::load(path_or_builtin, device);
    } catch (const std::exception& e) {
      throw InputError("'" + path_for_message(path_or_builtin) + "' is not a TorchScript model (torch::jit::load: " +
                       first_line(e.what()) +
                       "). Save one from Python with torch.jit.script(model).save(path) or "
                       "torch.jit.trace(model, example).save(path)");
    }
  }
  out.module.train(true);
  int64_t count = 0;
  for (const auto& p : out.module.parameters()) count += p.numel();
  out.info.parameter_count = count;
  out.info.batch_dependent_layers = batch_dependent_layers(out.module);
  return out;
}

void save_builtin_model(const std::string& name, const std::string& path) {
  const std::string n = is_builtin(name) ? builtin_name(name) : name;
  torch::jit::Module m = build_builtin(n);
  try {
    m.save(path);
  } catch (const std::exception& e) {
    throw InputError("cannot write model to '" + path_for_message(path) + "': " + first_line(e.what()));
  }
}

std::vector<at::Tensor> trainable_parameters(const torch::jit::Module& module) {
  std::vector<at::Tensor> params;
  for (const auto& p : module.parameters(/*recurse=*/true)) {
    if (p.requires_grad()) params.push_back(p);
  }
  return params;
}

std::string sha256_file(const std::string& path) {
  if (is_builtin(path)) return sha256_hex(serialize(build_builtin(builtin_name(path))));
  return sha256_of_file(path);
}

int64_t parameter_bytes(const torch::jit::Module& module) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& p : module.parameters(true)) add_storage(p, seen, bytes);
  return bytes;
}

int64_t parameter_and_buffer_bytes(const torch::jit::Module& module) {
  std::unordered_set<const void*> seen;
  int64_t bytes = 0;
  for (const auto& p : module.parameters(true)) add_storage(p, seen, bytes);
  for (const auto& b : module.buffers(true)) add_storage(b, seen, bytes);
  return bytes;
}

namespace {

// is_batch_dependent_type (accumplan/setup_rules.h) on a TorchScript module.
bool is_batch_dependent(const torch::jit::Module& m, const std::string& type) {
  const bool tracks = m.hasattr("track_running_stats") && m.attr("track_running_stats").isBool() &&
                      m.attr("track_running_stats").toBool();
  return is_batch_dependent_type(type, tracks);
}

}  // namespace

std::vector<std::string> batch_dependent_layers(const torch::jit::Module& module) {
  std::vector<std::string> found;
  for (const auto& item : module.named_modules()) {
    const std::string type = type_short_name(item.value);
    if (is_batch_dependent(item.value, type)) {
      found.push_back((item.name.empty() ? std::string("(root)") : item.name) + " (" + type + ")");
    }
  }
  return found;
}

int freeze_batch_dependent_layers(torch::jit::Module& module) {
  int frozen = 0;
  for (const auto& item : module.named_modules()) {
    if (!is_batch_dependent(item.value, type_short_name(item.value))) continue;
    torch::jit::Module layer = item.value;  // a handle: eval() sets the shared module's flag
    layer.eval();
    ++frozen;
  }
  return frozen;
}

}  // namespace accumplan
