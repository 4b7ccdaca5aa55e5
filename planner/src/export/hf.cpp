// planner/src/export/hf.cpp — the hf export: the Hugging Face Trainer's settings as JSON.
//
// What it is: {"TrainingArguments": batch, accumulation, eval batch, bf16/fp16, max_grad_norm,
// learning_rate, weight_decay, optim and its arguments, use_cpu, gradient checkpointing,
// average_tokens_across_devices, a DeepSpeed config for a sharded plan}, the optimizer as
// torch.optim's class and kwargs (for optimizer_cls_and_kwargs), the torchrun launch line and the
// "accumplan" object; notes for what Trainer's `optim` word cannot say.
// What it is not: the shared refusals and notes (common.cpp), nor a launcher.
#include "common.h"

#include <algorithm>
#include <optional>

#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/setup_rules.h"

namespace accumplan::exporting {
namespace {

class HfExporter final : public TrainerExporter {
 public:
  const char* name() const override { return "hf"; }
  const char* trainer() const override { return "Hugging Face Trainer"; }
  bool says_checkpointing() const override { return true; }  // gradient_checkpointing, or a note of its own
  std::string write(ExportContext& c) const override;
};

// The Hugging Face Trainer's launch on W processes.
std::string torchrun_launch_line(int64_t world) {
  return "torchrun --nnodes=1 --nproc_per_node=" + std::to_string(world) + " YOUR_SCRIPT.py";
}

// Hugging Face names the optimizer by one word (optimizer_table's hf_optim) and passes it only lr,
// weight_decay and the row's hf_arguments; the rest of a plan's optimizer goes through
// Trainer(optimizer_cls_and_kwargs=...), which the notes say.
std::string hf_optim(const Training& t, std::vector<std::string>& notes) {
  const OptimizerInfo& row = optimizer_info(t.optimizer);
  const std::string exact = "; for the plan's optimizer exactly pass Trainer(optimizer_cls_and_kwargs=(torch.optim." +
                            row.torch_class + ", cfg[\"optimizer\"][\"kwargs\"]))";
  if (row.hf_optim.empty()) {
    throw InputError("Hugging Face Trainer has no optim for the plan's optimizer " + t.optimizer +
                     "; export the plan to lightning or accelerate, which take torch.optim." + row.torch_class);
  }
  const bool decays = t.hp.count("weight_decay") > 0 && t.hp.at("weight_decay") > 0.0;
  if (decays && !row.hf_decay_note.empty()) notes.push_back(row.hf_decay_note + exact);
  std::string lost;  // hyperparameters Trainer builds at torch's default, set otherwise
  for (const OptimizerHyperparameter& h : row.hyperparameters) {
    const bool carried = h.name == "weight_decay" ||
                         std::any_of(row.hf_arguments.begin(), row.hf_arguments.end(),
                                     [&](const auto& a) { return a.first == h.name; });
    if (!carried && t.hp.at(h.name) != h.torch_default) {
      lost += (lost.empty() ? "" : ", ") + h.name + "=" + number_text(t.hp.at(h.name));
    }
  }
  if (!lost.empty()) notes.push_back("Trainer's optim \"" + row.hf_optim + "\" cannot set " + lost + exact);
  if (decays) {
    notes.push_back("Trainer's own optimizer leaves biases and LayerNorm weights undecayed, the plan decays every "
                    "parameter" + exact);
  }
  const auto fused = t.flags.find("fused");
  const bool fused_name = !row.hf_optim_fused.empty() && fused != t.flags.end() && fused->second;
  std::string said;  // the flags Trainer's `optim` cannot say
  for (const auto& [flag, on] : t.flags) {
    if (!(fused_name && flag == "fused")) said += (said.empty() ? "" : ", ") + flag + (on ? "=true" : "=false");
  }
  if (!said.empty()) notes.push_back("Trainer's optim cannot say " + said + exact);
  return fused_name ? row.hf_optim_fused : row.hf_optim;
}

// Trainer's gradient_checkpointing calls the model's gradient_checkpointing_enable(), which a
// transformers model applies to every layer: the plan's set only when it is every candidate of a
// model that has it; any other model gets the blocks to wrap.
void hf_checkpointing(ExportContext& c, ojson& args) {
  const std::optional<bool> hf = c.plan.model.hf_gradient_checkpointing;
  if (hf == false) {
    c.notes.push_back(checkpoint_note(*c.plan.checkpoint) + "; Trainer's gradient_checkpointing works only on a "
                      "transformers model (gradient_checkpointing_enable), which this one is not, so leave it off");
  } else if (checkpoints_every_candidate(*c.plan.checkpoint)) {
    args["gradient_checkpointing"] = true;
    args["gradient_checkpointing_kwargs"] = ojson{{"use_reentrant", false}};
    if (!hf) {
      c.notes.push_back("gradient_checkpointing works only on a transformers model (gradient_checkpointing_enable), "
                        "and this plan does not record whether the model is one; if it is not, remove it and wrap "
                        "the plan's modules (accumplan's plan.apply_checkpointing(model))");
    }
  } else {
    c.notes.push_back(checkpoint_note(*c.plan.checkpoint) + "; Trainer's gradient_checkpointing would checkpoint "
                      "every layer, so leave it off and wrap these");
  }
}

std::string HfExporter::write(ExportContext& c) const {
  const Training& t = c.t;
  ojson args{{"per_device_train_batch_size", c.u}, {"gradient_accumulation_steps", c.k}};
  if (eval_micro_batch(c.plan) > 0) args["per_device_eval_batch_size"] = eval_micro_batch(c.plan);
  args["bf16"] = t.amp == "bf16";
  args["fp16"] = t.amp == "fp16";
  args["max_grad_norm"] = t.max_grad_norm.value_or(0.0);  // Trainer clips at 1.0 unless told 0
  args["learning_rate"] = t.lr;
  if (t.hp.count("weight_decay") > 0) args["weight_decay"] = t.hp.at("weight_decay");
  args["optim"] = hf_optim(t, c.notes);
  for (const auto& [key, argument] : optimizer_info(t.optimizer).hf_arguments) args[argument] = t.hp.at(key);
  args["use_cpu"] = !t.cuda;
  if (c.plan.checkpoint) hf_checkpointing(c, args);
  if (t.per_token) {
    // Trainer then sums the valid labels of the k microbatches (num_items_in_batch), gathers the
    // count over ranks, and passes it to a model whose forward takes **kwargs.
    args["average_tokens_across_devices"] = true;
    c.notes.push_back("Trainer normalises per token only when each batch carries \"labels\" (-100 ignored) and the "
                      "model's forward accepts **kwargs (num_items_in_batch) or you pass compute_loss_func; otherwise "
                      "it divides each microbatch's mean loss by gradient_accumulation_steps");
  }
  const auto [torch_class, kwargs] = torch_optimizer(t);
  ojson j;
  if (c.plan.sharding) {
    // Trainer's DeepSpeed config: "auto" takes each value from TrainingArguments.
    args["deepspeed"] = ojson{{"zero_optimization", zero_stage_1()},
                              {"train_micro_batch_size_per_gpu", "auto"},
                              {"gradient_accumulation_steps", "auto"},
                              {"train_batch_size", "auto"}};
  }
  j["TrainingArguments"] = args;
  j["optimizer"] = ojson{{"class", "torch.optim." + torch_class}, {"kwargs", kwargs}};
  j["launch"] = torchrun_launch_line(c.plan.world_size);
  j["accumplan"] = about_of(c);
  return json_text(j);
}

}  // namespace

const Exporter& hf_exporter() {
  static const HfExporter exporter;
  return exporter;
}

}  // namespace accumplan::exporting
