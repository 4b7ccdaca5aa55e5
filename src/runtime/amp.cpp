// runtime/amp.cpp — autocast guard and loss scaler. See amp.h for the contract.
//
// The two version/device differences are kept in the small shims at the top of this file:
//   autocast_*     LibTorch 2.4 replaced at::autocast::{is,set}_{cpu_,}enabled and
//                  {get,set}_autocast_{cpu,gpu}_dtype with per-DeviceType functions (the old ones
//                  are deprecated there); 1.13 has only the old ones.
//   amp ops        ATen's `_amp_*` scaler ops have CUDA kernels only in 1.13; CPU uses the
//                  arithmetic they implement, written with ordinary tensor ops.
#include "runtime/amp.h"

#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cmath>

#include "accumplan/errors.h"

namespace accumplan {
namespace {

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool autocast_enabled(bool cuda) { return at::autocast::is_autocast_enabled(cuda ? at::kCUDA : at::kCPU); }
void autocast_set_enabled(bool cuda, bool on) { at::autocast::set_autocast_enabled(cuda ? at::kCUDA : at::kCPU, on); }
at::ScalarType autocast_dtype(bool cuda) { return at::autocast::get_autocast_dtype(cuda ? at::kCUDA : at::kCPU); }
void autocast_set_dtype(bool cuda, at::ScalarType t) { at::autocast::set_autocast_dtype(cuda ? at::kCUDA : at::kCPU, t); }
#else
bool autocast_enabled(bool cuda) { return cuda ? at::autocast::is_enabled() : at::autocast::is_cpu_enabled(); }
void autocast_set_enabled(bool cuda, bool on) {
  if (cuda) {
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_cpu_enabled(on);
  }
}
at::ScalarType autocast_dtype(bool cuda) {
  return cuda ? at::autocast::get_autocast_gpu_dtype() : at::autocast::get_autocast_cpu_dtype();
}
void autocast_set_dtype(bool cuda, at::ScalarType t) {
  if (cuda) {
    at::autocast::set_autocast_gpu_dtype(t);
  } else {
    at::autocast::set_autocast_cpu_dtype(t);
  }
}
#endif

// found_inf := 1 if any gradient holds inf/NaN; every gradient *= inv_scale. Same contract as
// at::_amp_foreach_non_finite_check_and_unscale_, which only has a CUDA kernel in 1.13.
void non_finite_check_and_unscale(std::vector<at::Tensor>& grads, at::Tensor& found_inf, const at::Tensor& inv_scale) {
  if (grads.empty()) return;
  if (grads.front().is_cuda()) {
    at::_amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale);
    return;
  }
  for (auto& g : grads) {
    // Check before multiplying: a finite value times inv_scale stays finite, but a NaN/inf stays
    // non-finite either way, so the order only matters for readability.
    if (g.isfinite().logical_not().any().item<bool>()) found_inf.fill_(1.0);
    g.mul_(inv_scale.to(g.scalar_type()));
  }
}

// The arithmetic of at::_amp_update_scale_ (CUDA-only in 1.13) on one-element tensors.
void update_scale(at::Tensor& scale, at::Tensor& growth_tracker, const at::Tensor& found_inf, double growth,
                  double backoff, int64_t interval) {
  if (scale.is_cuda()) {
    at::_amp_update_scale_(scale, growth_tracker, found_inf, growth, backoff, interval);
    return;
  }
  if (found_inf.item<float>() > 0) {
    scale.mul_(backoff);
    growth_tracker.zero_();
    return;
  }
  const int64_t successful = growth_tracker.item<int32_t>() + 1;
  if (successful == interval) {
    const double grown = scale.item<float>() * growth;
    // PyTorch grows only while the result stays finite in float32 (max about 3.4e38).
    if (std::isfinite(static_cast<float>(grown))) scale.fill_(grown);
    growth_tracker.zero_();
  } else {
    growth_tracker.fill_(successful);
  }
}

}  // namespace

AmpMode parse_amp_mode(const std::string& name, const std::string& what) {
  if (name == "none") return AmpMode::None;
  if (name == "bf16") return AmpMode::BF16;
  if (name == "fp16") return AmpMode::FP16;
  throw InputError(what + " '" + name + "' is unknown; use none, bf16 or fp16");
}

std::string to_string(AmpMode mode) {
  switch (mode) {
    case AmpMode::BF16: return "bf16";
    case AmpMode::FP16: return "fp16";
    default: return "none";
  }
}

bool cpu_autocast_enabled() { return autocast_enabled(false); }

AutocastGuard::AutocastGuard(AmpMode mode, const at::Device& device) {
  cuda_ = device.is_cuda();
  if (mode == AmpMode::None || (mode == AmpMode::FP16 && !cuda_)) return;
  was_enabled_ = autocast_enabled(cuda_);
  previous_dtype_ = autocast_dtype(cuda_);
  autocast_set_enabled(cuda_, true);
  autocast_set_dtype(cuda_, mode == AmpMode::BF16 ? at::kBFloat16 : at::kHalf);
  at::autocast::increment_nesting();
  active_ = true;
}

AutocastGuard::~AutocastGuard() {
  if (!active_) return;
  // Leaving the outermost autocast region drops its cache of casted weights, as Python's
  // torch.autocast.__exit__ does; otherwise the bf16 copies of the weights would stay allocated.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  autocast_set_enabled(cuda_, was_enabled_);
  autocast_set_dtype(cuda_, previous_dtype_);
}

LossScaler::LossScaler(const LossScalerOptions& options, const at::Device& device) : options_(options) {
  if (!(options.init_scale > 0) || !(options.growth_factor > 1) || !(options.backoff_factor > 0 && options.backoff_factor < 1) ||
      options.growth_interval < 1) {
    throw InputError("loss scaler needs init_scale > 0, growth_factor > 1, 0 < backoff_factor < 1, growth_interval >= 1");
  }
  scale_ = at::full({1}, options.init_scale, at::TensorOptions().dtype(at::kFloat).device(device));
  growth_tracker_ = at::zeros({1}, at::TensorOptions().dtype(at::kInt).device(device));
}

double LossScaler::scale() const { return scale_.item<float>(); }

bool LossScaler::unscale_and_check(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  at::Tensor found_inf = at::zeros({1}, scale_.options());
  // 1/scale computed in double and then rounded once to float32, as torch.cuda.amp.GradScaler does.
  const at::Tensor inv_scale = scale_.to(at::kDouble).reciprocal().to(at::kFloat);
  non_finite_check_and_unscale(grads, found_inf, inv_scale);
  return found_inf.item<float>() > 0;
}

void LossScaler::update(bool found_non_finite) {
  const at::Tensor found = at::full({1}, found_non_finite ? 1.0 : 0.0, scale_.options());
  update_scale(scale_, growth_tracker_, found, options_.growth_factor, options_.backoff_factor,
               options_.growth_interval);
}

}  // namespace accumplan
