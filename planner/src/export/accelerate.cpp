// planner/src/export/accelerate.cpp — the accelerate and accelerate-config exports: the two halves
// of one Accelerate setup.
//
// What it is: accelerate, a JSON of what the training script passes (Accelerator's accumulation,
// mixed precision and device, the DataLoader's batch, the optimizer, clipping, DeepSpeedPlugin for
// a sharded plan) and how to launch it; accelerate-config, the YAML `accelerate launch
// --config_file` reads (processes, precision, CPU, DeepSpeed). Each names the other: the JSON's
// config_file line makes the YAML, which leaves accumulation to the JSON's Accelerator.
// What it is not: the shared refusals and notes (common.cpp), nor a launcher.
#include "common.h"

#include <sstream>

#include "accumplan/json_io.h"

namespace accumplan::exporting {
namespace {

class AccelerateExporter final : public TrainerExporter {
 public:
  const char* name() const override { return "accelerate"; }
  const char* trainer() const override { return "Accelerate"; }
  std::string write(ExportContext& c) const override;
};

class AccelerateConfigExporter final : public TrainerExporter {
 public:
  const char* name() const override { return "accelerate-config"; }
  const char* trainer() const override { return "accelerate-config"; }
  bool carries_optimizer() const override { return false; }  // the accelerate export carries it
  std::string write(ExportContext& c) const override;
};

std::string AccelerateExporter::write(ExportContext& c) const {
  const Training& t = c.t;
  const auto [torch_class, kwargs] = torch_optimizer(t);
  ojson j;
  j["Accelerator"] = ojson{{"gradient_accumulation_steps", c.k},
                           {"mixed_precision", precision_name(t.amp, "no", "bf16", "fp16")},
                           {"cpu", !t.cuda}};
  if (c.plan.sharding) {
    j["DeepSpeedPlugin"] = ojson{{"zero_stage", 1}, {"gradient_accumulation_steps", c.k}};
    c.notes.push_back("the optimizer state is sharded (ZeRO stage 1): pass Accelerator(deepspeed_plugin="
                      "DeepSpeedPlugin(**cfg[\"DeepSpeedPlugin\"])), or launch with the accelerate-config export");
  }
  j["DataLoader"] = ojson{{"batch_size", c.u}};
  if (eval_micro_batch(c.plan) > 0) {
    j["EvalDataLoader"] = ojson{{"batch_size", eval_micro_batch(c.plan)}};
    c.notes.push_back(eval_note(c.plan, "Accelerate has no setting for it; build the eval DataLoader with "
                                        "cfg[\"EvalDataLoader\"][\"batch_size\"] and evaluate under torch.no_grad() "
                                        "with model.eval()"));
  }
  j["optimizer"] = ojson{{"class", "torch.optim." + torch_class}, {"kwargs", kwargs}};
  if (t.max_grad_norm) {
    // Accelerate has no clipping setting: the training loop calls it, once per window.
    j["clip_grad_norm"] = ojson{{"max_norm", *t.max_grad_norm}, {"norm_type", 2.0}};
    c.notes.push_back("clip in your loop: if accelerator.sync_gradients: accelerator.clip_grad_norm_(model.parameters(), "
                      "cfg[\"clip_grad_norm\"][\"max_norm\"])");
  }
  const std::string loss = per_token_note(t, "Accelerate", "divides each microbatch's loss by gradient_accumulation_steps and averages gradients over ranks");
  if (!loss.empty()) c.notes.push_back(loss + " (count them with accelerator.gather(count).sum())");
  j["config_file"] = "accumplan export --plan " + shell_quote(c.options.plan_path) +
                     " --to accelerate-config --out accelerate_config.yaml";
  j["launch"] = "accelerate launch --config_file accelerate_config.yaml YOUR_SCRIPT.py";
  j["accumplan"] = about_of(c);
  return json_text(j);
}

// The fields of accelerate's ClusterConfig that say where and how the processes run. 'NO' and
// 'no' are quoted: YAML 1.1 reads a bare NO as false.
std::string AccelerateConfigExporter::write(ExportContext& c) const {
  const Training& t = c.t;
  const int64_t W = c.plan.world_size;
  const std::string distributed = c.plan.sharding ? "DEEPSPEED" : W == 1 ? "'NO'" : t.cuda ? "MULTI_GPU" : "MULTI_CPU";
  std::ostringstream s;
  s << "# accumplan export accelerate-config (accelerate launch --config_file THIS): " << W << " process(es), "
    << precision_name(t.amp, "float32", "bf16 autocast", "fp16 autocast") << ", on " << (t.cuda ? "GPUs" : "the CPU") << "\n"
    << "# gradient_accumulation_steps is not a key of this file: it goes to Accelerator(...) (--to accelerate)\n";
  for (const std::string& n : c.notes) s << "# NOTE: " << comment_text(n) << "\n";
  s << "compute_environment: LOCAL_MACHINE\n"
    << "debug: false\n";
  if (c.plan.sharding) {
    s << "deepspeed_config:\n"
      << "  gradient_accumulation_steps: " << c.k << "\n"
      << "  zero_stage: 1\n";
  }
  s << "distributed_type: " << distributed << "\n"
    << "machine_rank: 0\n"
    << "main_training_function: main\n"
    << "mixed_precision: " << precision_name(t.amp, "'no'", "bf16", "fp16") << "\n"
    << "num_machines: 1\n"
    << "num_processes: " << W << "\n"
    << "rdzv_backend: static\n"
    << "same_network: true\n"
    << "use_cpu: " << (t.cuda ? "false" : "true") << "\n";
  return s.str();
}

}  // namespace

const Exporter& accelerate_exporter() {
  static const AccelerateExporter exporter;
  return exporter;
}

const Exporter& accelerate_config_exporter() {
  static const AccelerateConfigExporter exporter;
  return exporter;
}

}  // namespace accumplan::exporting
