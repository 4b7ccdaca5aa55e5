// Catch2 v2 main for the memory-probe tests (accumplan_probe_tests).
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
