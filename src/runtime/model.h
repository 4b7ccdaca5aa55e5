// runtime/model.h — loading the model to train: a TorchScript file, or a built-in example.
//
// What it is: `load_model("m.pt", device)` (torch::jit::load, with clear errors for a missing file
// or a file that is not TorchScript) and `load_model("builtin:NAME", device)` for the example
// models built in C++ without Python (used by the README's main command and by tests). It fills
// the profile's ModelInfo: path, SHA-256 of the file, parameter count, batch-dependent layers.
// What it is not: a trainer. Training steps live in the probe runner and the executor.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <torch/script.h>

#include "accumplan/schema.h"

namespace accumplan {

struct LoadedModel {
  torch::jit::Module module;
  ModelInfo info;
};

// The names accepted after "builtin:", e.g. "mlp", "convnet".
std::vector<std::string> builtin_model_names();

// Throws InputError for a missing file, a file that is not TorchScript, or an unknown builtin.
// The module is moved to `device` and put in training mode.
LoadedModel load_model(const std::string& path_or_builtin, const torch::Device& device);

// InputError unless `path` (not a builtin) is a regular file: missing, a directory, a FIFO (it
// blocked torch::jit::load for ever) or a device (/dev/zero: read for ever). Called before
// anything else is checked, so a wrong --model is what the user hears about first.
void check_model_file(const std::string& path);

// Saves a built-in example model as TorchScript (for `accumplan example-model` and tests).
void save_builtin_model(const std::string& name, const std::string& path);

// Trainable parameters, in module order.
std::vector<at::Tensor> trainable_parameters(const torch::jit::Module& module);

// Hex SHA-256 of a file's bytes ("builtin:NAME" hashes the serialized example).
std::string sha256_file(const std::string& path);

// True for "builtin:NAME" (whether or not NAME exists).
bool is_builtin(const std::string& path_or_builtin);

// What a built-in example is trained on when the user gives no --input/--target/--loss.
struct ModelDefaults {
  std::vector<std::string> inputs;  // tensor specs, one per forward argument
  std::string target;               // tensor spec
  std::string loss;                 // cross_entropy | mse | model
};
// nullopt for a file; InputError for an unknown builtin.
std::optional<ModelDefaults> builtin_defaults(const std::string& path_or_builtin);

// Bytes of all parameters / parameters plus buffers (storage bytes, each storage counted once).
int64_t parameter_bytes(const torch::jit::Module& module);
int64_t parameter_and_buffer_bytes(const torch::jit::Module& module);

// Submodules whose running statistics depend on the batch (BatchNorm*, SyncBatchNorm, InstanceNorm*
// with track_running_stats), as "path.to.bn1 (BatchNorm2d)".
std::vector<std::string> batch_dependent_layers(const torch::jit::Module& module);
// Puts those layers (the same rule) in eval mode, so they normalise with their running statistics
// and update none: what `verify --freeze-batch-dependent` does to check the weighting alone. The
// rest of the module keeps its mode. Returns how many layers it froze.
int freeze_batch_dependent_layers(torch::jit::Module& module);

}  // namespace accumplan
