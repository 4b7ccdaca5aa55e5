// accumplan/exporters.h — a plan rendered as the settings of the trainers people use, in a form
// each of them accepts as pasted, carrying the whole plan: the split, and the precision,
// optimizer (class and hyperparameters), clipping, device and world size it was measured under.
//
// What it is (docs/exports.md):
//   deepspeed          a ds_config JSON: batch, micro batch and accumulation; bf16/fp16,
//                      gradient_clipping, optimizer {type, params} (torch.optim's update); plus an
//                      "accumplan" object DeepSpeed ignores;
//   accelerate         {"Accelerator": {gradient_accumulation_steps, mixed_precision, cpu},
//                      "DataLoader": {batch_size}, "optimizer": {class, kwargs},
//                      "clip_grad_norm": {...}, "launch": ..., "accumplan": {...}};
//   accelerate-config  the YAML `accelerate launch --config_file` reads (processes, precision, CPU);
//   hf                 {"TrainingArguments": {batch, accumulation, bf16/fp16, max_grad_norm,
//                      learning_rate, weight_decay, optim, adam_*, use_cpu,
//                      average_tokens_across_devices}, "optimizer": {class, kwargs}, ...};
//   lightning          a LightningCLI config (YAML): trainer: {accelerator, devices, num_nodes,
//                      precision, accumulate_grad_batches, gradient_clip_*}, optimizer:
//                      {class_path, init_args}, data: {batch_size} or, with a data module named,
//                      {class_path, init_args: {batch_size}};
//   torchrun           a full command line launching `accumplan run` with spellings torchrun 1.13 and
//                      2.x both accept (--nnodes=1 --nproc_per_node=W --no_python), comment lines first.
// What a trainer cannot express — unequal microbatches, per-token weighting across microbatches
// and ranks, an optimizer its config cannot name — is said inside the output ("accumplan".notes in
// JSON, "# NOTE:" lines in YAML) and returned for stderr. Every value of the plan's optimizer
// (setup.param_groups, flags: nesterov, amsgrad, ...) is carried in the trainer's terms or the
// export is refused naming it (InputError), unless allow_lossy: parameter groups with different
// values do not fit a trainer's one optimizer config, and torchrun refuses what accumplan run
// cannot run (libtorch_cannot_run, accumplan/setup_rules.h). Trainers other than accumplan need equal
// microbatches, so those exports use the plan's uniform split; when it is predicted more than 25%
// slower per window than the plan (by the profile's step times, or without them by the number of
// microbatches), export_plan throws InfeasibleError naming the nearest target batches that split
// evenly under max_micro_batch (251 -> 245 or 252) unless allow_slow is set.
// What it is not: a launcher; nothing is run.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "accumplan/schema.h"

namespace accumplan {

// deepspeed accelerate accelerate-config lightning hf torchrun
const std::vector<std::string>& export_targets();

// How refusals name the switches that change them: the CLI's options by default; the Python
// package (Plan.export) passes its arguments' names.
struct ExportSwitchNames {
  std::string allow_slow = "--allow-slow";
  std::string allow_lossy = "--allow-lossy";
  std::string lightning_datamodule = "--lightning-datamodule";
  std::string lightning_target = "--to lightning";
};

struct ExportOptions {
  std::string plan_path = "plan.json";   // what the torchrun line passes to --plan
  std::string binary = "accumplan";      // what the torchrun line launches
  bool allow_slow = false;               // export a uniform split predicted > 25% slower anyway
  // Write an export that cannot carry every value of the plan's optimizer anyway (parameter groups
  // with different values: the first group's are written); the loss is named inside the output
  // ("accumplan".lossy in JSON, "# LOSSY:" lines in YAML) and in `note`.
  bool allow_lossy = false;
  std::string lightning_datamodule;      // lightning: data as {class_path: this, init_args: {batch_size}}
  ExportSwitchNames names;
};

// InputError unless `class_path` is empty or a dotted Python name (my_project.data.TextDataModule);
// `what` names it in the message.
void check_lightning_datamodule(const std::string& class_path, const std::string& what = "--lightning-datamodule");

// Uniform window seconds / plan window seconds (by step times when the plan's profile has them,
// else by microbatch counts); `by_time` says which. 1.0 when the uniform split is the plan's.
double uniform_slowdown(const Plan& plan, bool* by_time = nullptr);

// The nearest target batches below and above plan.target_batch (0 when none) whose per-rank
// batch splits into equal microbatches as few as the balanced split needs, under max_micro_batch
// and multiple_of: 251 with max_micro_batch 36 gives {245, 252}.
std::pair<int64_t, int64_t> nearest_even_targets(const Plan& plan);

// Throws InputError for an unknown target (listing the known ones) or an optimizer value the
// target cannot carry (without allow_lossy), InfeasibleError for a slow uniform split without
// allow_slow; all before any text is made. `note` (optional) receives what the output says it cannot
// express, one sentence a line (the departure from the plan first), or is left empty.
std::string export_plan(const Plan& plan, const std::string& target, std::string* note,
                        const ExportOptions& options = {});

}  // namespace accumplan
