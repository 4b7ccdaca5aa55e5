// runtime/step.cpp — the one microbatch step. See step.h for the contract and the output rule.
#include "runtime/step.h"

#include <c10/util/Exception.h>
#include <torch/script.h>

#include <string>
#include <vector>

#include "accumplan/errors.h"
#include "accumplan/memory_probe.h"

namespace accumplan {
namespace {

std::string shapes_of_tensor(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i) s += (i ? "," : "") + std::to_string(t.size(i));
  return s + "]";
}

// The inputs' shapes, the first 8 of them: a batch file of 10^5 tensors once made a 500 KB line.
std::string shapes_of(const Batch& b) {
  constexpr size_t kShown = 8;
  std::string s;
  for (size_t i = 0; i < b.inputs.size() && i < kShown; ++i) s += (s.empty() ? "" : ", ") + shapes_of_tensor(b.inputs[i]);
  if (b.inputs.size() > kShown) s += ", ... (" + std::to_string(b.inputs.size()) + " input tensors)";
  return s;
}

// A TorchScript error carries the script traceback (useful) and sometimes a C++ backtrace after
// "Exception raised from" (not useful to a user); keep the former.
std::string model_error_text(const std::string& what) {
  std::string text = what;
  const auto cut = text.find("\nException raised from");
  if (cut != std::string::npos) text = text.substr(0, cut);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

}  // namespace

std::string ModelRejectedInputError::model_error_line(const std::string& text) {
  std::string first, stated;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(start, end - start);
    const size_t lead = line.find_first_not_of(' ');
    line = lead == std::string::npos ? "" : line.substr(lead);
    if (first.empty() && !line.empty()) first = line;
    // "RuntimeError: ...", "torch.jit.Error: ...", "ValueError: ..." (the statement of the error)
    const size_t colon = line.find(": ");
    const auto ends_with = [&](const char* word, size_t n) { return colon >= n && line.compare(colon - n, n, word) == 0; };
    if (colon != std::string::npos && line.find(' ') == colon + 1 &&
        (ends_with("Error", 5) || ends_with("Exception", 9))) {
      stated = line;
    }
    start = end + 1;
  }
  return cut_for_message(stated.empty() ? first : stated, 200);
}

namespace {

at::Tensor on(const at::Tensor& t, const at::Device& device) {
  return !t.defined() || t.device() == device ? t : t.to(device);
}

// The output rule of step.h.
at::Tensor output_of(const c10::IValue& out, const LossConfig& loss) {
  if (out.isTensor()) return out.toTensor();
  if (out.isTuple() || out.isList()) {
    const c10::IValue first = out.isTuple() ? out.toTupleRef().elements().at(0) : out.toListRef().at(0);
    if (first.isTensor()) return first.toTensor();
    throw InputError(std::string("the model's forward returned a ") + out.tagKind() + " whose first element is a " +
                     first.tagKind() + "; accumplan trains on the first element, which must be a tensor");
  }
  if (out.isGenericDict()) {
    const std::string key = loss.kind == "model" ? "loss" : "logits";
    for (const auto& entry : out.toGenericDict()) {
      if (entry.key().isString() && entry.key().toStringRef() == key && entry.value().isTensor()) {
        return entry.value().toTensor();
      }
    }
    throw InputError("the model's forward returned a dict without a tensor entry \"" + key + "\"; accumplan takes " +
                     "\"loss\" with --loss model and \"logits\" otherwise");
  }
  throw InputError(std::string("the model's forward returned a ") + out.tagKind() +
                   "; accumplan needs a tensor (the logits or outputs, or the loss with --loss model), a tuple or "
                   "list whose first element is one, or a dict with \"logits\" or \"loss\"");
}

}  // namespace

bool is_out_of_memory(const std::exception& e, const MemoryProbe* probe) {
  if (dynamic_cast<const c10::OutOfMemoryError*>(&e) != nullptr) return true;
  return probe != nullptr && probe->oom_happened();
}

LossSum forward_loss(torch::jit::Module& module, const Batch& batch, const StepConfig& config, bool count_tokens,
                     at::Tensor* output_out) {
  std::vector<c10::IValue> args;
  args.reserve(batch.inputs.size() + 1);
  for (const auto& t : batch.inputs) args.emplace_back(on(t, config.device));
  if (config.padding_mask) {
    if (!batch.ragged()) {
      throw InputError("--padding-mask needs ragged data (a file of [list_of_1d_token_tensors, targets]); these "
                       "inputs " + shapes_of(batch) + " have no sequence lengths");
    }
    args.emplace_back(on(padding_mask(batch), config.device));
  }
  const at::Tensor target = on(batch.target, config.device);
  if (config.loss.kind == "model" && target.defined()) args.emplace_back(target);

  AutocastGuard autocast(config.amp, config.device);
  c10::IValue out;
  try {
    out = module.forward(std::move(args));
  } catch (const std::exception& e) {
    if (is_out_of_memory(e, config.probe)) throw;
    throw ModelRejectedInputError(shapes_of(batch), model_error_text(e.what()));
  }
  const at::Tensor output = output_of(out, config.loss);
  if (output_out != nullptr) *output_out = output;
  try {
    return loss_sum(output, target, batch.size(), config.loss, count_tokens);
  } catch (const InputError&) {
    throw;
  } catch (const std::exception& e) {
    if (is_out_of_memory(e, config.probe)) throw;
    // LibTorch's own refusal (a dtype or shape its kernel does not take): the user's data or
    // model, exit 2, one line; the full text with --verbose.
    throw InputError("the loss " + config.loss.kind + " failed on the model's output " + shapes_of_tensor(output) +
                         (target.defined() ? " and the target " + shapes_of_tensor(target) : std::string()) + ": " +
                         ModelRejectedInputError::model_error_line(model_error_text(e.what())),
                     model_error_text(e.what()));
  }
}

at::Tensor microbatch_step(torch::jit::Module& module, const Batch& microbatch, const StepConfig& config,
                           double window_units, const at::Tensor& scale) {
  at::Tensor objective;
  at::Tensor loss_sum_value;
  {
    const LossSum ls = forward_loss(module, microbatch, config, /*count_tokens=*/false);
    loss_sum_value = ls.sum.detach().to(at::kDouble);
    // Exact weighting: every microbatch contributes its SUM over units divided by the window's
    // units N, so sum_i (sum_i / N) = (sum over the window) / N = the combined batch's mean loss.
    // 8,8,8,2 samples: weights 8/26, 8/26, 8/26, 2/26 of each microbatch mean, not 1/4 each.
    objective = ls.sum / window_units;
  }
  if (scale.defined()) objective = objective * scale.reshape({});
  objective.backward();
  return loss_sum_value;
}

}  // namespace accumplan
