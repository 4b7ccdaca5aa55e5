// torch_and_catch.h — include LibTorch, then Catch2, in the one order that works.
//
// Test files of this folder that use LibTorch include this instead of <catch2/catch.hpp> and
// include no torch header after it (common/catch_after_torch.h says why).
#include <c10/core/CPUAllocator.h>
#include <torch/script.h>
#include <torch/torch.h>

#include "catch_after_torch.h"
