// tests/common/catch_main.cpp — the one Catch2 v2 entry point of every test executable.
// What it is not: a test. Catch2's main compiles the whole framework (about 25 s of one core per
// copy), so it is one object linked into each test executable.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
