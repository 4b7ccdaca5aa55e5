// accumplan/exporters.h — a plan rendered as the settings of the trainers people use, in a form
// each of them accepts as pasted.
//
// What it is (docs/exports.md):
//   deepspeed   a ds_config JSON (train_batch_size, train_micro_batch_size_per_gpu,
//               gradient_accumulation_steps) plus an "accumplan" object DeepSpeed ignores;
//   accelerate  {"Accelerator": {...}, "DataLoader": {...}, "launch": "accelerate launch
//               --num_machines 1 --num_processes W ...", "accumplan": {...}}:
//               Accelerator(**cfg["Accelerator"]), DataLoader(ds, **cfg["DataLoader"]);
//   hf          {"TrainingArguments": {...}, "launch": ..., "accumplan": {...}}:
//               TrainingArguments(output_dir=..., **cfg["TrainingArguments"]);
//   lightning   a LightningCLI config (YAML): trainer: {accumulate_grad_batches, devices,
//               num_nodes}, data: {batch_size}, with comment lines saying what it departs from;
//   torchrun    a full command line launching `accumplan run` with spellings torchrun 1.13 and
//               2.x both accept (--nnodes=1 --nproc_per_node=W --no_python), comment lines first.
// Trainers other than accumplan need equal microbatches, so those exports use the plan's uniform
// split; when it differs from the plan (another k, or equal instead of balanced sizes) the output
// itself says so ("accumplan" object or comment lines). When the uniform split is predicted more
// than 25% slower per window than the plan (by the profile's step times, or without them by the
// number of microbatches), export_plan throws InfeasibleError naming the nearest target batches
// that split evenly under max_micro_batch (251 -> 245 or 252) unless allow_slow is set.
// What it is not: a launcher; nothing is run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "accumplan/schema.h"

namespace accumplan {

const std::vector<std::string>& export_targets();  // deepspeed accelerate lightning hf torchrun

struct ExportOptions {
  std::string plan_path = "plan.json";   // what the torchrun line passes to --plan
  std::string binary = "accumplan";      // what the torchrun line launches
  bool allow_slow = false;               // export a uniform split predicted > 25% slower anyway
};

// Uniform window seconds / plan window seconds (by step times when the plan's profile has them,
// else by microbatch counts); `by_time` says which. 1.0 when the uniform split is the plan's.
double uniform_slowdown(const Plan& plan, bool* by_time = nullptr);

// The nearest target batches below and above plan.target_batch (0 when none) whose per-rank
// batch splits into equal microbatches as few as the balanced split needs, under max_micro_batch
// and multiple_of: 251 with max_micro_batch 36 gives {245, 252}.
std::pair<int64_t, int64_t> nearest_even_targets(const Plan& plan);

// Throws InputError for an unknown target (listing the known ones), InfeasibleError for a slow
// uniform split without allow_slow. `note` (optional) receives a sentence for stderr, or is left
// empty.
std::string export_plan(const Plan& plan, const std::string& target, std::string* note,
                        const ExportOptions& options = {});

}  // namespace accumplan
