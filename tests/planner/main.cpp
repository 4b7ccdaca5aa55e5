// Catch2 v2 main for the torch-free planner tests.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
