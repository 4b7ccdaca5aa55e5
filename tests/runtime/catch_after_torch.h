// tests/runtime/catch_after_torch.h — include Catch2 after LibTorch headers.
//
// LibTorch pulls in glog, whose CHECK(cond) aborts the process; Catch2's CHECK records a failure
// and continues. Whichever is defined last wins, so every test file in this folder includes its
// torch headers first and Catch2 through this header, which removes glog's CHECK first.
#pragma once

#ifdef CHECK
#undef CHECK
#endif
#include <catch2/catch.hpp>
