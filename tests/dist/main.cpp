// tests/dist/main.cpp — Catch2 entry point of the data-parallel tests (accumplan_dist_tests).
// What it is not: a test; the cases live in the test_*.cpp files next to it.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
