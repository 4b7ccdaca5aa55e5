// test_cpu_counting_probe.cpp — the cpu-counting probe: exact byte counts, peak semantics,
// budget OOM from eager ops and from TorchScript, injected OOMs, install/uninstall.
// Not tested here: the factory's error messages (test_memory_probe_factory.cpp).
#include <optional>
#include <string>

#include "accumplan/errors.h"
#include "accumplan/host_data.h"
#include "cpu_counting_probe.h"
#include "torch_and_catch.h"  // last: see why there

using accumplan::CpuCountingProbe;
using Catch::Matchers::Contains;

namespace {

// A TorchScript module built in C++ (no Python): y = relu(x @ w), loss = y.sum().
torch::jit::Module make_linear_module(int64_t in_features, int64_t out_features) {
  torch::jit::Module m("Net");
  m.register_parameter("w", torch::randn({in_features, out_features}).requires_grad_(), false);
  m.define(R"(
    def forward(self, x):
        return torch.relu(torch.mm(x, self.w)).sum()
  )");
  return m;
}

// Scripted convolution: the case that needs data == context in the allocator's DataPtr.
torch::jit::Module make_conv_module() {
  torch::jit::Module m("ConvNet");
  m.register_parameter("w", torch::randn({8, 3, 3, 3}).requires_grad_(), false);
  m.define(R"(
    def forward(self, x):
        return torch.relu(torch.conv2d(x, self.w, None, [1, 1], [1, 1])).sum()
  )");
  return m;
}

}  // namespace

TEST_CASE("CPU probe: counts exactly the bytes of the tensors allocated", "[probe][cpu]") {
  CpuCountingProbe probe;
  const int64_t base = probe.current_bytes();
  {
    at::Tensor a = at::empty({1024}, at::kFloat);
    CHECK(probe.current_bytes() == base + 4096);
    at::Tensor b = at::empty({256, 4}, at::kDouble);
    CHECK(probe.current_bytes() == base + 4096 + 8192);
    at::Tensor view = a.view({32, 32});  // a view shares storage: no new bytes
    CHECK(probe.current_bytes() == base + 4096 + 8192);
  }
  CHECK(probe.current_bytes() == base);
}

TEST_CASE("CPU probe: peak holds the maximum and reset_peak sets it to current", "[probe][cpu]") {
  CpuCountingProbe probe;
  probe.reset_peak();
  const int64_t base = probe.current_bytes();
  CHECK(probe.peak_bytes() == base);
  at::Tensor a = at::empty({1024}, at::kFloat);
  {
    at::Tensor b = at::empty({2048}, at::kFloat);
    CHECK(probe.peak_bytes() == base + 4096 + 8192);
  }
  CHECK(probe.current_bytes() == base + 4096);
  CHECK(probe.peak_bytes() == base + 4096 + 8192);
  probe.reset_peak();
  CHECK(probe.peak_bytes() == base + 4096);  // peak := current, not 0
  at::Tensor c = at::empty({10}, at::kFloat);
  CHECK(probe.peak_bytes() == base + 4096 + 40);
}

TEST_CASE("CPU probe: a budget makes eager ops throw c10::OutOfMemoryError and sets the flag",
          "[probe][cpu][oom]") {
  CpuCountingProbe probe(/*budget_bytes=*/64 * 1024);
  CHECK(probe.budget_bytes() == 64 * 1024);
  CHECK(probe.device_total_bytes() == 64 * 1024);  // with a budget, the budget is the device
  at::Tensor a = at::ones({4096}, at::kFloat);     // 16 KiB: fits
  const int64_t before = probe.current_bytes();
  CHECK_FALSE(probe.oom_happened());

  // a.repeat(4) needs 64 KiB more with 16 KiB in use: over the 64 KiB budget.
  REQUIRE_THROWS_AS(a.repeat({4}), c10::OutOfMemoryError);
  CHECK(probe.oom_happened());
  CHECK(probe.current_bytes() == before);  // the failed op left nothing behind

  probe.clear_oom();
  CHECK_FALSE(probe.oom_happened());
  at::Tensor fits = a.repeat({2});  // 32 KiB more: 48 KiB in use, within budget
  CHECK(probe.current_bytes() == before + 32 * 1024);
  CHECK_FALSE(probe.oom_happened());

  probe.set_budget_bytes(std::nullopt);  // removing the budget lets the big op through
  at::Tensor big = a.repeat({4});
  CHECK(probe.current_bytes() == before + 32 * 1024 + 64 * 1024);
  CHECK(probe.device_total_bytes() == accumplan::machine_memory_bytes());
}

TEST_CASE("CPU probe: the OOM message says what was asked for and the budget",
          "[probe][cpu][oom]") {
  CpuCountingProbe probe(/*budget_bytes=*/1024);
  try {
    at::Tensor t = at::empty({1024}, at::kFloat);
    FAIL("4 KiB under a 1 KiB budget should have thrown");
  } catch (const c10::OutOfMemoryError& e) {
    CHECK_THAT(e.what(), Contains("out of memory"));
    CHECK_THAT(e.what(), Contains("4.0 KiB"));
    CHECK_THAT(e.what(), Contains("1.0 KiB budget"));
    // In LibTorch's CPU allocator's words, which is how Accelerate's find_executable_batch_size
    // (" out of memory.") and Lightning's is_oom_error ("DefaultCPUAllocator: can't allocate
    // memory") recognise an out-of-memory; the probe's name tells it from the machine running out.
    CHECK_THAT(e.what(), Contains("CPU out of memory. DefaultCPUAllocator: can't allocate memory: you tried to allocate "
                                  "4096 bytes (accumplan cpu-counting probe"));
    CHECK_FALSE(accumplan::failed_host_allocation_bytes(e.what()).has_value());
  }
}

TEST_CASE("CPU probe: OOM inside a TorchScript forward sets the flag though the type differs",
          "[probe][cpu][oom][torchscript]") {
  CpuCountingProbe probe;
  torch::jit::Module m = make_linear_module(64, 64);
  at::Tensor x = torch::randn({256, 64});
  const int64_t baseline = probe.current_bytes();

  // Unconstrained, the forward runs and its temporaries are counted.
  probe.reset_peak();
  m.forward({x});
  const int64_t forward_peak = probe.peak_bytes() - baseline;
  CHECK(forward_peak >= 256 * 64 * 4);  // at least the [256, 64] float product
  CHECK(probe.current_bytes() == baseline);

  // 1 KiB of headroom cannot hold the 64 KiB product.
  probe.set_budget_bytes(baseline + 1024);
  std::string message;
  try {
    m.forward({x});
    FAIL("the forward should have run out of memory");
  } catch (const std::exception& e) {
    message = e.what();
  }
  // TorchScript rewraps the OutOfMemoryError (as std::runtime_error in 1.13), so the flag is
  // how callers know; the original text survives in the message.
  CHECK(probe.oom_happened());
  CHECK_THAT(message, Contains("out of memory"));
  CHECK(probe.current_bytes() == baseline);  // back to baseline after the OOM
}

TEST_CASE("CPU probe: scripted conv forward and backward run and are counted",
          "[probe][cpu][torchscript]") {
  CpuCountingProbe probe;
  torch::jit::Module m = make_conv_module();
  at::Tensor x = torch::randn({2, 3, 16, 16});
  const int64_t baseline = probe.current_bytes();
  probe.reset_peak();
  {
    at::Tensor loss = m.forward({x}).toTensor();
    loss.backward();
  }
  // Activations: at least the [2, 8, 16, 16] float conv output (16 KiB).
  CHECK(probe.peak_bytes() - baseline >= 2 * 8 * 16 * 16 * 4);
  // What stays is the parameter's .grad, exactly the parameter's bytes.
  const int64_t grad_bytes = 8 * 3 * 3 * 3 * 4;
  CHECK(probe.current_bytes() == baseline + grad_bytes);
  CHECK_FALSE(probe.oom_happened());
}

TEST_CASE("CPU probe: fail_allocation_after(n) fires once, at the n-th allocation",
          "[probe][cpu][oom]") {
  CpuCountingProbe probe;
  const int64_t count0 = probe.allocation_count();
  probe.fail_allocation_after(3);
  at::Tensor a = at::empty({8}, at::kFloat);
  at::Tensor b = at::empty({8}, at::kFloat);
  CHECK_FALSE(probe.oom_happened());
  const int64_t before = probe.current_bytes();
  REQUIRE_THROWS_AS(at::empty({8}, at::kFloat), c10::OutOfMemoryError);
  CHECK(probe.oom_happened());
  CHECK(probe.current_bytes() == before);
  CHECK(probe.allocation_count() == count0 + 2);  // the failed one was not made
  probe.clear_oom();
  // Once only: the following allocations succeed.
  at::Tensor c = at::empty({8}, at::kFloat);
  at::Tensor d = at::empty({8}, at::kFloat);
  at::Tensor e = at::empty({8}, at::kFloat);
  CHECK_FALSE(probe.oom_happened());
  CHECK(probe.allocation_count() == count0 + 5);

  SECTION("n = 1 is the next allocation; n = 0 disarms; n < 0 is an input error") {
    probe.fail_allocation_after(1);
    CHECK_THROWS_AS(at::empty({1}, at::kFloat), c10::OutOfMemoryError);
    probe.fail_allocation_after(1);
    probe.fail_allocation_after(0);
    CHECK_NOTHROW(at::empty({1}, at::kFloat));
    CHECK_THROWS_AS(probe.fail_allocation_after(-1), accumplan::InputError);
  }
}

TEST_CASE("CPU probe: destroying the probe restores the previous allocator", "[probe][cpu]") {
  c10::Allocator* previous = c10::GetCPUAllocator();
  at::Tensor survivor;
  {
    CpuCountingProbe probe;
    CHECK(c10::GetCPUAllocator() != previous);
    survivor = at::ones({1000}, at::kFloat);
    CHECK(probe.current_bytes() >= 4000);
  }
  CHECK(c10::GetCPUAllocator() == previous);
  // A tensor allocated under the probe outlives it and is still usable and freeable.
  CHECK(survivor.sum().item<float>() == 1000.0f);
  {
    CpuCountingProbe second;
    CHECK(second.current_bytes() == 0);  // counts from its own installation
    survivor = at::Tensor();             // freeing an older block does not go negative
    CHECK(second.current_bytes() == 0);
  }
  CHECK(c10::GetCPUAllocator() == previous);
}

TEST_CASE("CPU probe: a second probe at the same time is an internal error", "[probe][cpu]") {
  CpuCountingProbe first;
  try {
    CpuCountingProbe second;
    FAIL("a second concurrent cpu-counting probe should be refused");
  } catch (const accumplan::InternalError& e) {
    CHECK_THAT(e.what(), Contains("already installed"));
  }
  // The first is still the one installed and still counting.
  const int64_t before = first.current_bytes();
  at::Tensor t = at::empty({16}, at::kFloat);
  CHECK(first.current_bytes() == before + 64);
}

TEST_CASE("CPU probe: names, machine memory, and budget validation", "[probe][cpu]") {
  CpuCountingProbe probe;
  CHECK(probe.name() == "cpu-counting");
  CHECK_THAT(probe.device_name(), Contains("counting allocator"));
  CHECK_FALSE(probe.budget_bytes().has_value());
  CHECK_FALSE(probe.reserved_peak_bytes().has_value());
  // Without a budget the total is the machine's memory: more than 64 MiB on any CI machine.
  CHECK(probe.device_total_bytes() == accumplan::machine_memory_bytes());
  CHECK(probe.device_total_bytes() > (int64_t{64} << 20));
  CHECK_THROWS_AS(probe.set_budget_bytes(0), accumplan::InputError);
  CHECK_THROWS_AS(probe.set_budget_bytes(-5), accumplan::InputError);
  CHECK_NOTHROW(probe.release_cached());  // nothing cached on CPU
}
