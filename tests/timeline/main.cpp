// Catch2 main for the CUPTI memory-timeline tests: torch-free and CUPTI-free, so they run in the
// planner-only build too.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
