// tests/runtime/main.cpp — Catch2 main for the runtime and profiler tests (LibTorch, CPU).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
