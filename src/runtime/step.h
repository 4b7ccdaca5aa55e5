// runtime/step.h — the ONE microbatch step of accumplan: forward (under autocast), the model's
// output, the loss as a sum over its units, and the backward of that sum divided by the window's
// units (times the fp16 loss scale).
//
// What it is: the only place in accumplan that calls a model's forward. The executor runs it for
// every microbatch of a window; the profiler measures by running the executor, and `verify`
// computes its combined-batch reference with forward_loss, so profiling, training and
// verification cannot disagree about what a step is.
// The output rule (what a forward may return):
//   - a tensor: the output (logits, predictions), or with --loss model the mean loss;
//   - a tuple or list: its FIRST element is that tensor (e.g. `return logits, hidden`);
//   - a dict with string keys: with --loss model its "loss" entry, otherwise its "logits" entry.
// Anything else is an InputError that names what came back.
// Errors: an out-of-memory (recognised by the probe's flag, because TorchScript rewraps
// c10::OutOfMemoryError as a std::runtime_error, or by the type) propagates unchanged, for the
// caller to recover from; any other failure of the forward is an InputError that names the input
// shapes and gives the model's own first error lines.
// What it is not: a window. Weighting across microbatches, gradient lifetime, clipping and the
// optimizer step are the executor's (executor/executor.h).
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <utility>

#include <ATen/ATen.h>

#include "accumplan/errors.h"
#include "runtime/amp.h"
#include "runtime/batch.h"
#include "runtime/loss.h"

namespace torch::jit {
struct Module;
}

namespace accumplan {

class MemoryProbe;

// The model's forward failed on these inputs (not an out-of-memory): an input problem, exit 2.
// Carries the parts so a caller that knows where the inputs came from can say so.
// The message is one line ending in the model's own error line ("RuntimeError: mat1 and mat2
// shapes cannot be multiplied (4x9 and 8x16)"); the TorchScript traceback is the detail that
// --verbose prints.
class ModelRejectedInputError : public InputError {
 public:
  ModelRejectedInputError(std::string shapes, std::string model_error, const std::string& source = "")
      : InputError("the model rejected inputs of shape " + shapes + (source.empty() ? "" : " (from " + source + ")") +
                       "; its forward failed with: " + model_error_line(model_error),
                   model_error),
        shapes_(std::move(shapes)),
        model_error_(std::move(model_error)) {}
  const std::string& shapes() const { return shapes_; }
  const std::string& model_error() const { return model_error_; }

  // The line of a (TorchScript) error that states it: the last "XxxError: ..." line, else the
  // first non-empty one; cut to 200 characters.
  static std::string model_error_line(const std::string& text);

 private:
  std::string shapes_;
  std::string model_error_;
};

struct StepConfig {
  LossConfig loss;
  AmpMode amp = AmpMode::None;
  at::Device device = at::kCPU;
  const MemoryProbe* probe = nullptr;  // not owned; its flag identifies an out-of-memory
  // Ragged data: pass padding_mask(batch) (bool [b, T], true at padding) as one more forward
  // argument after the inputs, for models whose valid positions would otherwise see the padding
  // (attention: nn.TransformerEncoder's src_key_padding_mask). InputError for a batch that is
  // not ragged.
  bool padding_mask = false;
};

// True when `e` is an out-of-memory: c10::OutOfMemoryError, or any exception while the probe's
// out-of-memory flag is set.
bool is_out_of_memory(const std::exception& e, const MemoryProbe* probe);

// Forward of `batch` (moved to the device) under autocast, the output rule above, and the loss
// sum. `count_tokens` as in loss_sum. `output`, when given, receives the output the rule took
// (an evaluation that keeps its outputs).
LossSum forward_loss(torch::jit::Module& module, const Batch& batch, const StepConfig& config,
                     bool count_tokens = true, at::Tensor* output = nullptr);

// One microbatch of a window: forward_loss, then backward of loss_sum / window_units (× scale when
// `scale` is defined: fp16). Returns the microbatch's loss sum, detached, as a float64 scalar on
// the device: the caller adds these up and reads the window's loss once (one host sync per window).
at::Tensor microbatch_step(torch::jit::Module& module, const Batch& microbatch, const StepConfig& config,
                           double window_units, const at::Tensor& scale);

}  // namespace accumplan
