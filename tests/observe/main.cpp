// Catch2 main for the progress-line and trace-writer tests (src/observe/): torch-free, so they
// run in the planner-only build too.
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
