// caching_device.h — a test double of a GPU's caching allocator, a model training on it, and the
// search's and window loop's runners over them, so the rules between reserved and allocated bytes
// are tested without a GPU.
//
// What it is: the rules of PyTorch's CUDA caching allocator that set reserved bytes apart from
// allocated ones, kept small:
//   - a request is rounded up to 512 B; one of at most 1 MiB is cut from a 2 MiB segment (the small
//     pool), one under 10 MiB from a 20 MiB segment, a larger one gets its own segment rounded up to
//     2 MiB (the large pool);
//   - a block is taken best-fit from the free blocks of its pool and split when what remains is
//     at least 512 B (small pool) or more than 1 MiB (large pool);
//   - a freed block stays cached in its segment, merged with free neighbours: allocated bytes fall,
//     reserved bytes do not, across windows;
//   - a new segment that would take reserved bytes past the cap (set_per_process_memory_fraction)
//     first releases every wholly free segment and retries; only then is it an out-of-memory.
// Allocated bytes count whole blocks (a request's rounded size, or the unsplit block it took), as
// the allocator's statistics do.
// What it is not: streams, events, expandable segments, the oversize threshold or garbage
// collection; nor a model of any real network's sizes.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <utility>
#include <vector>

#include "accumplan/search.h"
#include "accumplan/solver.h"
#include "accumplan/window_loop.h"

namespace accumplan::test {

class CachingAllocatorDouble {
 public:
  static constexpr int64_t kMiB = int64_t{1} << 20;
  static constexpr int64_t kRoundBytes = 512;
  static constexpr int64_t kSmallRequestBytes = kMiB;
  static constexpr int64_t kSmallSegmentBytes = 2 * kMiB;
  static constexpr int64_t kMidRequestBytes = 10 * kMiB;
  static constexpr int64_t kMidSegmentBytes = 20 * kMiB;

  explicit CachingAllocatorDouble(int64_t cap_bytes) : cap_bytes_(cap_bytes) {}

  static int64_t rounded_bytes(int64_t bytes) {
    return std::max(kRoundBytes, (bytes + kRoundBytes - 1) / kRoundBytes * kRoundBytes);
  }
  static int64_t segment_bytes(int64_t rounded) {
    if (rounded <= kSmallRequestBytes) return kSmallSegmentBytes;
    if (rounded < kMidRequestBytes) return kMidSegmentBytes;
    return (rounded + 2 * kMiB - 1) / (2 * kMiB) * (2 * kMiB);
  }

  void set_cap_bytes(int64_t cap_bytes) { cap_bytes_ = cap_bytes; }

  // A block of at least `bytes`; nullopt: out of memory even after releasing the cache.
  std::optional<int> allocate(int64_t bytes) {
    const int64_t size = rounded_bytes(bytes);
    const bool small = size <= kSmallRequestBytes;
    std::optional<Where> at = best_fit(size, small);
    if (!at) at = new_segment(size, small);
    if (!at) return std::nullopt;
    Segment& s = segments_[at->segment];
    split(s, at->block, size, small);
    s.blocks[at->block].id = next_id_;
    allocated_bytes_ += s.blocks[at->block].size;
    allocated_peak_bytes_ = std::max(allocated_peak_bytes_, allocated_bytes_);
    return next_id_++;
  }

  void free(int id) {
    for (Segment& s : segments_) {
      for (size_t i = 0; i < s.blocks.size(); ++i) {
        if (s.blocks[i].id != id) continue;
        s.blocks[i].id = kFree;
        allocated_bytes_ -= s.blocks[i].size;
        merge_free_neighbours(s, i);
        return;
      }
    }
    throw std::logic_error("caching allocator double: free of an unknown block");
  }

  // Every wholly free segment back to the device (emptyCache).
  void empty_cache() {
    segments_.erase(std::remove_if(segments_.begin(), segments_.end(),
                                   [&](const Segment& s) {
                                     const bool whole = s.blocks.size() == 1 && s.blocks[0].id == kFree;
                                     if (whole) reserved_bytes_ -= s.bytes;
                                     return whole;
                                   }),
                    segments_.end());
  }

  void reset_peaks() {
    allocated_peak_bytes_ = allocated_bytes_;
    reserved_peak_bytes_ = reserved_bytes_;
  }
  int64_t allocated_bytes() const { return allocated_bytes_; }
  int64_t reserved_bytes() const { return reserved_bytes_; }
  int64_t allocated_peak_bytes() const { return allocated_peak_bytes_; }
  int64_t reserved_peak_bytes() const { return reserved_peak_bytes_; }
  int64_t segment_count() const { return static_cast<int64_t>(segments_.size()); }

 private:
  static constexpr int kFree = -1;
  struct Block {
    int64_t size = 0;
    int id = kFree;
  };
  struct Segment {
    int64_t bytes = 0;
    bool small = false;
    std::vector<Block> blocks;  // in address order
  };
  struct Where {
    size_t segment = 0;
    size_t block = 0;
  };

  std::optional<Where> best_fit(int64_t size, bool small) const {
    std::optional<Where> best;
    for (size_t s = 0; s < segments_.size(); ++s) {
      if (segments_[s].small != small) continue;
      for (size_t b = 0; b < segments_[s].blocks.size(); ++b) {
        const Block& blk = segments_[s].blocks[b];
        if (blk.id != kFree || blk.size < size) continue;
        if (!best || blk.size < segments_[best->segment].blocks[best->block].size) best = Where{s, b};
      }
    }
    return best;
  }

  std::optional<Where> new_segment(int64_t size, bool small) {
    const int64_t bytes = segment_bytes(size);
    if (reserved_bytes_ + bytes > cap_bytes_) empty_cache();  // free and retry
    if (reserved_bytes_ + bytes > cap_bytes_) return std::nullopt;
    segments_.push_back(Segment{bytes, small, {Block{bytes, kFree}}});
    reserved_bytes_ += bytes;
    reserved_peak_bytes_ = std::max(reserved_peak_bytes_, reserved_bytes_);
    return Where{segments_.size() - 1, 0};
  }

  static void split(Segment& s, size_t b, int64_t size, bool small) {
    const int64_t remaining = s.blocks[b].size - size;
    if (small ? remaining < kRoundBytes : remaining <= kSmallRequestBytes) return;
    s.blocks[b].size = size;
    s.blocks.insert(s.blocks.begin() + static_cast<std::ptrdiff_t>(b) + 1, Block{remaining, kFree});
  }

  static void merge_free_neighbours(Segment& s, size_t i) {
    if (i + 1 < s.blocks.size() && s.blocks[i + 1].id == kFree) {
      s.blocks[i].size += s.blocks[i + 1].size;
      s.blocks.erase(s.blocks.begin() + static_cast<std::ptrdiff_t>(i) + 1);
    }
    if (i > 0 && s.blocks[i - 1].id == kFree) {
      s.blocks[i - 1].size += s.blocks[i].size;
      s.blocks.erase(s.blocks.begin() + static_cast<std::ptrdiff_t>(i));
    }
  }

  int64_t cap_bytes_;
  std::vector<Segment> segments_;
  int64_t allocated_bytes_ = 0;
  int64_t reserved_bytes_ = 0;
  int64_t allocated_peak_bytes_ = 0;
  int64_t reserved_peak_bytes_ = 0;
  int next_id_ = 0;
};

// One layer of the double's network: its weights, the activation it keeps for backward, and a
// workspace its forward takes and frees (a convolution's).
struct LayerBytes {
  int64_t weight_bytes = 0;
  int64_t activation_bytes_per_sample = 0;
  int64_t workspace_bytes_per_sample = 0;
  int64_t workspace_fixed_bytes = 0;
};

// A network of `layers` training with Adam (two state tensors per weight, made by the first step)
// on a CachingAllocatorDouble. Every failed allocation unwinds what the step held, as an exception
// would; gradients and cache are the caller's to drop and release.
class TrainingDouble {
 public:
  TrainingDouble(std::vector<LayerBytes> layers, int64_t cap_bytes) : layers_(std::move(layers)), allocator_(cap_bytes) {
    for (const LayerBytes& l : layers_) weights_.push_back(must(allocator_.allocate(l.weight_bytes)));
  }

  CachingAllocatorDouble& allocator() { return allocator_; }
  bool has_gradients() const { return !grads_.empty(); }
  bool has_state() const { return !state_.empty(); }

  // Forward, loss and backward of b samples; gradients created or accumulated. False: out of memory.
  bool microbatch(int64_t b) {
    std::vector<int> held;
    auto unwind = [&] {
      for (int id : held) allocator_.free(id);
      return false;
    };
    for (const LayerBytes& l : layers_) {
      const auto act = allocator_.allocate(l.activation_bytes_per_sample * b);
      if (!act) return unwind();
      held.push_back(*act);
      const auto ws = allocator_.allocate(l.workspace_fixed_bytes + l.workspace_bytes_per_sample * b);
      if (!ws) return unwind();
      allocator_.free(*ws);
    }
    const bool first = grads_.empty();
    std::vector<int> made;
    for (size_t i = layers_.size(); i-- > 0;) {
      const auto grad_input = allocator_.allocate(layers_[i].activation_bytes_per_sample * b);
      const auto grad = grad_input ? allocator_.allocate(layers_[i].weight_bytes) : std::nullopt;
      if (!grad) {
        if (grad_input) allocator_.free(*grad_input);
        for (int id : made) allocator_.free(id);
        return unwind();
      }
      if (first) made.push_back(*grad);
      else allocator_.free(*grad);  // accumulated into the resident gradient
      allocator_.free(held.back());  // this layer's activation
      held.pop_back();
      allocator_.free(*grad_input);
    }
    if (first) grads_.assign(made.rbegin(), made.rend());
    return true;
  }

  // Adam's step: its state made the first time, one temporary per weight. False: out of memory
  // (no state made).
  bool step() {
    const bool first = state_.empty();
    for (size_t k = 0; first && k < 2 * layers_.size(); ++k) {
      const auto s = allocator_.allocate(layers_[k / 2].weight_bytes);
      if (!s) return drop_state();
      state_.push_back(*s);
    }
    for (const LayerBytes& l : layers_) {
      const auto t = allocator_.allocate(l.weight_bytes);
      if (!t) return first ? drop_state() : false;
      allocator_.free(*t);
    }
    return true;
  }

  void drop_gradients() {
    for (int id : grads_) allocator_.free(id);
    grads_.clear();
  }

 private:
  bool drop_state() {
    for (int id : state_) allocator_.free(id);
    state_.clear();
    return false;
  }
  static int must(std::optional<int> id) {
    if (!id) throw std::logic_error("caching allocator double: the weights do not fit the cap");
    return *id;
  }

  std::vector<LayerBytes> layers_;
  CachingAllocatorDouble allocator_;
  std::vector<int> weights_, grads_, state_;
};

struct DoubleOutOfMemory : std::runtime_error {
  DoubleOutOfMemory() : std::runtime_error("caching allocator double: out of memory") {}
};

// The window loop's backend on the double, as an executor on CUDA: an out-of-memory thrown, after
// it the gradients dropped and the cache released; each microbatch's and the step's allocated peak
// and the reserved peak recorded. No numbers train.
class CachingDeviceBackend final : public WindowBackend {
 public:
  CachingDeviceBackend(TrainingDouble& model, int64_t samples) : model_(model), samples(samples) {}

  int64_t samples;
  std::vector<Microbatch> ran;                  // microbatches that completed, in order
  std::vector<int64_t> microbatch_peak_bytes;   // allocated, each completed microbatch's
  int64_t step_peak_bytes = 0;                  // allocated, the last optimizer step's
  int64_t reserved_peak_bytes = 0;              // since the last clear_peaks()
  std::vector<int64_t> reserved_after_release;  // reserved bytes right after each out-of-memory

  void clear_peaks() {
    microbatch_peak_bytes.clear();
    step_peak_bytes = 0;
    reserved_peak_bytes = model_.allocator().reserved_bytes();
  }

  ShareCounts count_share() override { return ShareCounts{samples, samples, 0, {}, "samples"}; }
  void begin_attempt() override {
    model_.drop_gradients();
    loss_ = 0;
  }
  void run_microbatch(const Microbatch& mb, int64_t) override {
    CachingAllocatorDouble& a = model_.allocator();
    a.reset_peaks();
    const bool ran_ok = model_.microbatch(mb.where.size);
    reserved_peak_bytes = std::max(reserved_peak_bytes, a.reserved_peak_bytes());
    if (!ran_ok) throw DoubleOutOfMemory();
    microbatch_peak_bytes.push_back(a.allocated_peak_bytes());
    ran.push_back(mb);
    loss_ += static_cast<double>(mb.where.size);
  }
  bool is_out_of_memory(const std::exception& e) const override {
    return dynamic_cast<const DoubleOutOfMemory*>(&e) != nullptr;
  }
  void after_out_of_memory() override {
    model_.drop_gradients();
    model_.allocator().empty_cache();
    reserved_after_release.push_back(model_.allocator().reserved_bytes());
  }
  double loss_sum() override { return loss_; }
  double gradient_norm() override { return 1.0; }
  void scale_gradients(double) override {}
  void optimizer_step(int64_t) override {
    CachingAllocatorDouble& a = model_.allocator();
    a.reset_peaks();
    const bool ran_ok = model_.step();
    reserved_peak_bytes = std::max(reserved_peak_bytes, a.reserved_peak_bytes());
    if (!ran_ok) throw DoubleOutOfMemory();
    step_peak_bytes = a.allocated_peak_bytes();
  }
  void release_cached() override { model_.allocator().empty_cache(); }
  void drop_gradients() override { model_.drop_gradients(); }
  bool optimizer_state_exists() const override { return model_.has_state(); }
  bool wall_time_is_device_time() const override { return false; }

 private:
  TrainingDouble& model_;
  double loss_ = 0;
};

// The search's runner on the double, as the CUDA runners run a window: through the window loop
// (recovery off) with the cap set to the budget asked for; after an out-of-memory the gradients
// dropped and the cache released. Between windows that fit, the cache stays.
class CachingDeviceRunner final : public WindowRunner {
 public:
  CachingDeviceRunner(std::vector<LayerBytes> layers, int64_t budget_bytes, int64_t device_total_bytes)
      : model_(std::move(layers), budget_bytes), backend_(model_, 0), budget_bytes_(budget_bytes),
        device_total_bytes_(device_total_bytes) {}

  TrainingDouble& model() { return model_; }
  int64_t budget_bytes() const { return budget_bytes_; }

  WindowMeasurement run_window(const std::vector<int64_t>& sizes, int64_t, std::optional<int64_t> limit) override {
    CachingAllocatorDouble& a = model_.allocator();
    a.set_cap_bytes(limit.value_or(device_total_bytes_));
    Plan plan;
    plan.per_rank_batch = plan.target_batch = std::accumulate(sizes.begin(), sizes.end(), int64_t{0});
    set_window(plan, sizes, *std::max_element(sizes.begin(), sizes.end()));
    plan.reason = "one window of the caching device's runner.";
    WindowLoop loop(plan);
    WindowOptions options;
    options.oom_recovery = false;
    backend_.samples = plan.per_rank_batch;
    backend_.clear_peaks();
    WindowMeasurement m;
    m.sizes = sizes;
    try {
      WindowStats st = loop.accumulate(backend_, options, sizes);
      loop.apply(backend_, options, st);
    } catch (const ExecutorOomError&) {
      m.oom = true;
    }
    a.set_cap_bytes(budget_bytes_);
    if (m.oom) return m;
    const std::vector<int64_t>& peaks = backend_.microbatch_peak_bytes;
    m.first_microbatch_peak_bytes = peaks.front();
    m.steady_peak_bytes = peaks.size() > 1 ? *std::max_element(peaks.begin() + 1, peaks.end()) : 0;
    m.peak_bytes = std::max(m.first_microbatch_peak_bytes, m.steady_peak_bytes);
    m.optimizer_step_peak_bytes = backend_.step_peak_bytes;
    m.max_peak_bytes = std::max(m.peak_bytes, m.optimizer_step_peak_bytes);
    m.reserved_peak_bytes = backend_.reserved_peak_bytes;
    m.step_seconds = 1e-4 * static_cast<double>(sizes.front());
    m.seconds = m.step_seconds * static_cast<double>(sizes.size());
    return m;
  }

 private:
  TrainingDouble model_;
  CachingDeviceBackend backend_;
  int64_t budget_bytes_;
  int64_t device_total_bytes_;
};

}  // namespace accumplan::test
