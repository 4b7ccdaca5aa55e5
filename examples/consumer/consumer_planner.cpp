// consumer_planner.cpp — plans from a saved profile with the INSTALLED accumplan::planner, as a
// project of its own would: read profile.json, plan 256 samples under 256 MiB, print the split and
// its DeepSpeed export. Exit 0 when the plan's microbatches sum to the target and the installed
// plan schema is where the package says.
#include <accumplan/exporters.h>
#include <accumplan/schema.h>
#include <accumplan/solver.h>
#include <accumplan/units.h>

#include <filesystem>
#include <iostream>
#include <numeric>

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: consumer_planner profile.json\n";
    return 2;
  }
  try {
    const accumplan::Profile profile = accumplan::read_profile_file(argv[1], "profile");
    accumplan::PlanRequest request;
    request.target_batch = 256;
    request.budget.bytes = int64_t{256} << 20;
    const accumplan::Plan plan = accumplan::make_plan(profile, request);
    const int64_t sum = std::accumulate(plan.microbatch_sizes.begin(), plan.microbatch_sizes.end(), int64_t{0});
    std::cout << "plan: " << plan.accumulation_steps << " microbatches [" << accumplan::join_sizes(plan.microbatch_sizes)
              << "]\n";
    accumplan::ExportOptions allow;
    allow.allow_slow = true;
    std::cout << accumplan::export_plan(plan, "deepspeed", nullptr, allow);
    const bool schema = std::filesystem::exists(std::string(ACCUMPLAN_SCHEMA_DIR) + "/plan.schema.json");
    if (sum != 256 || !schema) {
      std::cerr << "consumer_planner: " << (schema ? "microbatches do not sum to 256" : "no installed plan.schema.json")
                << "\n";
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "consumer_planner: " << e.what() << "\n";
    return 1;
  }
}
