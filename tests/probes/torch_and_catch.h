// torch_and_catch.h — include LibTorch, then Catch2, in the one order that works.
//
// Why: LibTorch 1.13 includes glog, whose CHECK(cond) aborts the process. Included after
// catch.hpp it silently replaces Catch's CHECK, so a failed check kills the test binary instead
// of being reported (seen here: "Check failed: probe.oom_happened()" and SIGABRT). Including
// torch first and dropping glog's CHECK lets Catch define its own. Test files that use LibTorch
// include this instead of <catch2/catch.hpp> and include no torch header after it.
#pragma once

#include <c10/core/CPUAllocator.h>
#include <torch/script.h>
#include <torch/torch.h>

#undef CHECK
#include <catch2/catch.hpp>
