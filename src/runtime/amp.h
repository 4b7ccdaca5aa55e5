// runtime/amp.h — mixed precision for the executor: an autocast guard (bf16, and fp16 on CUDA)
// and a dynamic loss scaler for fp16.
//
// What it is:
//   AutocastGuard  turns autocast on for one forward (CPU or CUDA) and restores the previous
//                  state on exit; the LibTorch 1.13 / 2.x API difference lives in amp.cpp only.
//   LossScaler     PyTorch's GradScaler rules applied once per accumulation window: the scale is
//                  constant through the window, gradients are unscaled once after the last
//                  backward, a non-finite gradient skips the step and multiplies the scale by the
//                  backoff factor (0.5), and `growth_interval` (2000) finite windows in a row
//                  multiply it by the growth factor (2). On CUDA it calls ATen's fused
//                  `_amp_foreach_non_finite_check_and_unscale_` and `_amp_update_scale_`; on CPU
//                  (LibTorch 1.13 has no CPU kernels for them) an equivalent isfinite / mul_
//                  fallback with the same arithmetic, so the logic is testable without a GPU.
// What it is not: a policy for which ops run in reduced precision (that is autocast's list), nor
// fp16 autocast on CPU: LibTorch 1.13's CPU autocast supports bfloat16 only, so `fp16` on CPU
// keeps the forward in float32 and exercises the scaler alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>

namespace accumplan {

enum class AmpMode { None, BF16, FP16 };

// "none" | "bf16" | "fp16"; InputError naming `what` otherwise.
AmpMode parse_amp_mode(const std::string& name, const std::string& what = "--amp");
std::string to_string(AmpMode mode);

// Autocast for one region. Does nothing for AmpMode::None, and for FP16 on a CPU device (see the
// file comment). Not copyable; restores the enabled flag and dtype it found.
class AutocastGuard {
 public:
  AutocastGuard(AmpMode mode, const at::Device& device);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  bool cuda_ = false;
  bool was_enabled_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

// Whether CPU autocast is on right now (for tests that check the guard restored it).
bool cpu_autocast_enabled();

struct LossScalerOptions {
  double init_scale = 65536.0;     // 2^16, PyTorch's default
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // finite windows in a row before the scale grows
};

class LossScaler {
 public:
  LossScaler(const LossScalerOptions& options, const at::Device& device);

  // The scale as a one-element float32 tensor on the device, constant through a window.
  const at::Tensor& scale_tensor() const { return scale_; }
  double scale() const;

  // Multiplies every defined gradient by 1/scale in place and reports whether any gradient holds
  // an inf or NaN (before or after unscaling). Call once per window, after the last backward.
  bool unscale_and_check(const std::vector<at::Tensor>& params);

  // The window boundary: back off after a non-finite window, else count towards growth.
  void update(bool found_non_finite);

 private:
  LossScalerOptions options_;
  at::Tensor scale_;           // float32 [1]
  at::Tensor growth_tracker_;  // int32 [1]
};

}  // namespace accumplan
