// planner/src/export/deepspeed.cpp — the deepspeed export: a ds_config JSON.
//
// What it is: batch, micro batch per GPU and accumulation; bf16/fp16, gradient_clipping, the
// optimizer as torch.optim's update ({type, params}), ZeRO stage 1 for a sharded plan, and an
// "accumplan" object DeepSpeed ignores (provenance, notes, the eval batch).
// What it is not: the shared refusals and notes (common.cpp), nor a launcher.
#include "common.h"

#include "accumplan/json_io.h"

namespace accumplan::exporting {
namespace {

class DeepSpeedExporter final : public TrainerExporter {
 public:
  const char* name() const override { return "deepspeed"; }
  const char* trainer() const override { return "DeepSpeed"; }
  std::string write(ExportContext& c) const override;
};

std::string DeepSpeedExporter::write(ExportContext& c) const {
  ojson j;
  j["train_batch_size"] = c.plan.target_batch;
  j["train_micro_batch_size_per_gpu"] = c.u;
  j["gradient_accumulation_steps"] = c.k;
  if (c.t.amp == "bf16") j["bf16"] = ojson{{"enabled", true}};
  if (c.t.amp == "fp16") j["fp16"] = ojson{{"enabled", true}, {"loss_scale", 0}};  // 0: dynamic, as run scales
  j["gradient_clipping"] = c.t.max_grad_norm.value_or(0.0);                          // 0: off
  auto [torch_class, params] = torch_optimizer(c.t);
  // DeepSpeed's own Adam is AdamW unless told (adam_w_mode) and fused unless torch_adam: both
  // set, so the update is torch.optim's, as measured. Other names fall back to torch.optim.
  if (torch_class == "Adam" || torch_class == "AdamW") {
    params["torch_adam"] = true;
    params["adam_w_mode"] = torch_class == "AdamW";
  }
  j["optimizer"] = ojson{{"type", torch_class}, {"params", params}};
  if (c.plan.sharding) j["zero_optimization"] = zero_stage_1();
  if (!c.t.cuda) c.notes.push_back("the plan was measured on the CPU device; DeepSpeed trains on GPUs, where the memory differs");
  const std::string loss = per_token_note(c.t, "DeepSpeed", "divides each microbatch's loss by gradient_accumulation_steps and averages gradients over ranks");
  if (!loss.empty()) c.notes.push_back(loss);
  const std::string eval = eval_note(c.plan, "DeepSpeed's config has no evaluation batch; give your eval DataLoader "
                                             "that batch_size (accumplan.eval_micro_batch here)");
  if (!eval.empty()) c.notes.push_back(eval);
  j["accumplan"] = about_of(c);  // DeepSpeed reads the keys it knows and ignores this one
  if (eval_micro_batch(c.plan) > 0) j["accumplan"]["eval_micro_batch"] = eval_micro_batch(c.plan);
  return json_text(j);
}

}  // namespace

const Exporter& deepspeed_exporter() {
  static const DeepSpeedExporter exporter;
  return exporter;
}

}  // namespace accumplan::exporting
