// torch_allocator_shim.h — the c10::Allocator differences between LibTorch versions that the
// counting CPU allocator must follow.
//
// What it is: two macros, so cpu_counting_probe.cpp has no version #if of its own.
//   1.13 (checked here): `DataPtr allocate(size_t) const` is the only pure virtual.
//   2.3 and later (from the PyTorch sources, not compiled here): `allocate` is non-const and
//   `copy_data(void*, const void*, size_t) const` is pure virtual too.
// What it is not: the CUDA shim (cuda_allocator_shim.h).
#pragma once

#include <torch/version.h>

#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
#define ACCUMPLAN_ALLOCATE_CONST
#define ACCUMPLAN_ALLOCATOR_HAS_COPY_DATA 1
#else
#define ACCUMPLAN_ALLOCATE_CONST const
#define ACCUMPLAN_ALLOCATOR_HAS_COPY_DATA 0
#endif
