// cli/in_process.cpp — hand_over_device_commands for an executable that runs every command itself:
// accumplan-device (the whole CLI, with LibTorch) and the planner-only build's accumplan.
#include "cli/commands.h"

namespace accumplan::cli {

void hand_over_device_commands(int /*argc*/, char** /*argv*/) {}

}  // namespace accumplan::cli
