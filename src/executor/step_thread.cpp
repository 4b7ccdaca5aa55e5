// executor/step_thread.cpp — see step_thread.h.
#include "executor/step_thread.h"

#include <ATen/ThreadLocalState.h>
#include <c10/core/DeviceGuard.h>

#include <optional>
#include <utility>

namespace accumplan {

StepThread::StepThread(c10::Device device) : device_(device), thread_([this] { loop(); }) {}

StepThread::~StepThread() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void StepThread::run(const std::function<void()>& task) {
  // Grad mode, inference mode and dispatch-key state are thread-local in LibTorch: the task sees
  // the caller's, as if it ran on the caller's thread.
  const at::ThreadLocalState state;
  std::unique_lock<std::mutex> lock(mutex_);
  task_ = [&task, &state] {
    at::ThreadLocalStateGuard guard(state);
    task();
  };
  has_task_ = true;
  done_ = false;
  wake_.notify_all();
  wake_.wait(lock, [this] { return done_; });
  task_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void StepThread::loop() {
  // The device current on this thread (CUDA's current device is per thread); a no-op on the CPU.
  std::optional<c10::DeviceGuard> device;
  if (!device_.is_cpu()) device.emplace(device_);
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return has_task_ || stop_; });
    if (stop_) return;
    has_task_ = false;
    lock.unlock();
    std::exception_ptr error;
    try {
      task_();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    done_ = true;
    wake_.notify_all();
  }
}

}  // namespace accumplan
