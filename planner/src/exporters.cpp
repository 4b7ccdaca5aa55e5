// exporters.cpp — trainer settings from a plan. See exporters.h.
#include "accumplan/exporters.h"

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"

namespace accumplan {

const std::vector<std::string>& export_targets() {
  static const std::vector<std::string> targets = {"deepspeed", "accelerate", "lightning", "hf", "torchrun"};
  return targets;
}

std::string export_plan(const Plan& plan, const std::string& target, std::string* note) {
  using ojson = nlohmann::ordered_json;
  const int64_t u = plan.uniform.micro_batch;
  const int64_t k = plan.uniform.accumulation_steps;
  const int64_t W = plan.world_size;
  if (u < 1 || k < 1 || u * k * W != plan.target_batch) {
    throw InputError("the plan's uniform split (" + std::to_string(k) + " x " + std::to_string(u) +
                     " on " + std::to_string(W) + " rank(s)) does not make target_batch " +
                     std::to_string(plan.target_batch) + "; re-plan it with `accumplan plan`");
  }
  if (note) {
    note->clear();
    const bool differs = plan.accumulation_steps != k || plan.micro_batch != u;
    if (differs && target != "torchrun") {
      std::string balanced;
      for (size_t i = 0; i < plan.microbatch_sizes.size(); ++i) {
        balanced += (i ? "," : "") + std::to_string(plan.microbatch_sizes[i]);
      }
      *note = target + " needs equal microbatches: exporting the uniform split " + std::to_string(k) +
              " x " + std::to_string(u) + " per rank instead of the balanced window [" + balanced +
              "] (" + std::to_string(k) + " steps instead of " + std::to_string(plan.accumulation_steps) + ")";
    }
  }

  ojson j;
  if (target == "deepspeed") {
    j["train_batch_size"] = plan.target_batch;
    j["train_micro_batch_size_per_gpu"] = u;
    j["gradient_accumulation_steps"] = k;
  } else if (target == "hf") {
    // TrainingArguments keyword arguments (also readable by HfArgumentParser.parse_json_file).
    j["per_device_train_batch_size"] = u;
    j["gradient_accumulation_steps"] = k;
  } else if (target == "accelerate") {
    // Accelerator(gradient_accumulation_steps=...), DataLoader(batch_size=...), launch processes.
    j["gradient_accumulation_steps"] = k;
    j["per_device_train_batch_size"] = u;
    j["num_processes"] = W;
  } else if (target == "lightning") {
    j["trainer"] = ojson{{"accumulate_grad_batches", k}, {"devices", W}};
    j["dataloader"] = ojson{{"batch_size", u}};
  } else if (target == "torchrun") {
    return "--nnodes=1 --nproc-per-node=" + std::to_string(W) + "\n";
  } else {
    std::string known;
    for (const auto& t : export_targets()) known += (known.empty() ? "" : ", ") + t;
    throw InputError("--to '" + target + "' is not a known trainer; choose one of: " + known);
  }
  return j.dump(2) + "\n";
}

}  // namespace accumplan
