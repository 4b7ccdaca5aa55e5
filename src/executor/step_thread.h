// executor/step_thread.h — the thread the executor's microbatch steps run on, replaced after an
// out-of-memory.
//
// What it is: one worker thread that runs a task (a microbatch's forward, loss and backward) and
// hands back its result or exception, with the caller's LibTorch thread-local state (grad mode,
// dispatch keys) and the device set on it. Why a thread of its own: LibTorch's autograd engine
// queues a backward's pending work in a THREAD-LOCAL ready queue, and an exception inside
// backward (an out-of-memory) leaves the rest of that backward's tasks there, holding their
// gradient buffers and their nodes' saved activations, until the thread exits (PyTorch issue
// #82218). Measured on the CPU device: squeezenet1_1, two microbatches of 15 under 23.5 MiB, ran
// out of memory in backward and left 21.7 MB allocated for good, after which every window on that
// thread ran out of memory even at b = 2. Joining the thread frees them; the executor does that
// after every out-of-memory and starts a fresh one.
// What it is not: parallelism. The caller waits for every task; one task runs at a time.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include <c10/core/Device.h>

namespace accumplan {

class StepThread {
 public:
  explicit StepThread(c10::Device device);
  ~StepThread();  // joins: the thread's autograd queue and whatever it still held go with it
  StepThread(const StepThread&) = delete;
  StepThread& operator=(const StepThread&) = delete;

  // Runs `task` on the thread with the caller's thread-local state and waits; rethrows what it threw.
  void run(const std::function<void()>& task);

 private:
  void loop();

  c10::Device device_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::function<void()> task_;
  bool has_task_ = false;
  bool done_ = false;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace accumplan
