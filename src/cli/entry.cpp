// cli/entry.cpp — main() of the accumplan executables: hand the command line over when another
// executable runs it (front_dispatch.cpp), else run it here with the device commands.
#include "cli/commands.h"

int main(int argc, char** argv) {
  accumplan::cli::hand_over_device_commands(argc, argv);  // returns only for a command this executable runs
  return accumplan::cli::run_command_line(argc, argv, &accumplan::cli::add_device_commands);
}
