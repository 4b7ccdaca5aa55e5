// accumplan/exporters.h — a plan rendered as the settings of the trainers people use.
//
// What it is: DeepSpeed config JSON, Hugging Face Trainer arguments, Accelerate settings,
// Lightning Trainer/DataLoader settings, torchrun flags. Those trainers need equal microbatches,
// so every export uses the plan's `uniform` split (largest divisor of the per-rank batch that fits)
// and `note` says so when it differs from the balanced window.
// What it is not: a launcher. The text is what a user pastes into their config.
#pragma once

#include <string>
#include <vector>

#include "accumplan/schema.h"

namespace accumplan {

const std::vector<std::string>& export_targets();  // deepspeed accelerate lightning hf torchrun

// Throws InputError for an unknown target (listing the known ones). `note` receives a sentence
// for stderr, or is left empty.
std::string export_plan(const Plan& plan, const std::string& target, std::string* note);

}  // namespace accumplan
