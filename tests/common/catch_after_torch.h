// tests/common/catch_after_torch.h — Catch2 for a test file that includes LibTorch headers.
//
// LibTorch pulls in glog, whose CHECK(cond) aborts the process; Catch2's CHECK records a failure
// and continues. Whichever is defined last wins (seen: "Check failed: probe.oom_happened()" and
// SIGABRT instead of a reported failure), so a test file includes its torch headers first and
// Catch2 through this header, which drops glog's CHECK and gives Catch2's back. Not `#pragma once`
// on purpose: in a unity batch (tests/CMakeLists.txt) Catch2 is already in from an earlier file
// while this file's torch headers may be new, so every inclusion restores Catch2's CHECK.
#undef CHECK
#ifdef TWOBLUECUBES_SINGLE_INCLUDE_CATCH_HPP_INCLUDED
#define CHECK(...) INTERNAL_CATCH_TEST("CHECK", Catch::ResultDisposition::ContinueOnFailure, __VA_ARGS__)
#else
#include <catch2/catch.hpp>
#endif
