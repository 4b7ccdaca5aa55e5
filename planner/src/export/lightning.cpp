// planner/src/export/lightning.cpp — the lightning export: a LightningCLI config file (YAML).
//
// What it is: `fit --config` for LightningCLI: trainer (accelerator, devices, precision,
// accumulate_grad_batches, clipping, DeepSpeed stage 1 for a sharded plan), the optimizer as
// {class_path, init_args}, and data's batch_size (with a data module named, its class_path and
// init_args); YAML comments carry the notes and what was lost.
// What it is not: the shared refusals and notes (common.cpp), nor a launcher.
#include "common.h"

#include <sstream>

namespace accumplan::exporting {
namespace {

class LightningExporter final : public TrainerExporter {
 public:
  const char* name() const override { return "lightning"; }
  const char* trainer() const override { return "Lightning"; }
  bool takes_datamodule() const override { return true; }
  std::string write(ExportContext& c) const override;
};

// A JSON number, bool or array of them as a YAML 1.1 scalar that loads as the same value: YAML 1.1
// (PyYAML, which LightningCLI's parser builds on) reads 1e-08 as a string and only 1.0e-08 as a
// float, so an exponent gets a mantissa with a point.
std::string yaml_value(const ojson& v) {
  if (v.is_array()) {
    std::string s = "[";
    for (const auto& e : v) s += (s.size() > 1 ? ", " : "") + yaml_value(e);
    return s + "]";
  }
  std::string s = v.dump();
  const size_t e = s.find_first_of("eE");
  if (v.is_number_float() && e != std::string::npos && s.find('.') == std::string::npos) s.insert(e, ".0");
  return s;
}

std::string LightningExporter::write(ExportContext& c) const {
  const Training& t = c.t;
  const std::string loss = per_token_note(t, "Lightning", "divides each microbatch's loss by accumulate_grad_batches and DDP averages gradients over ranks");
  if (!loss.empty()) c.notes.push_back(loss);
  std::ostringstream s;
  s << "# accumplan export lightning (LightningCLI --config): " << c.plan.target_batch << " samples per step = "
    << c.plan.world_size << " device(s) x " << split_text(c.k, c.u) << "\n";
  for (const std::string& n : c.lossy) s << "# LOSSY: " << comment_text(n) << "\n";
  for (const std::string& n : c.notes) s << "# NOTE: " << comment_text(n) << "\n";
  s << "trainer:\n"
    << "  accelerator: " << (t.cuda ? "gpu" : "cpu") << "\n"
    << "  devices: " << c.plan.world_size << "\n"
    << "  num_nodes: 1\n"
    << "  precision: " << precision_name(t.amp, "32-true", "bf16-mixed", "16-mixed") << "\n"
    << "  accumulate_grad_batches: " << c.k << "\n";
  if (c.plan.sharding) s << "  strategy: deepspeed_stage_1  # the optimizer state sharded over the devices, as planned\n";
  if (t.max_grad_norm) {
    s << "  gradient_clip_val: " << yaml_value(*t.max_grad_norm) << "\n"
      << "  gradient_clip_algorithm: norm\n";
  }
  // LightningCLI builds this optimizer for a module without configure_optimizers.
  const auto [torch_class, kwargs] = torch_optimizer(t);
  s << "optimizer:\n  class_path: torch.optim." << torch_class << "\n  init_args:\n";
  for (const auto& [key, value] : kwargs.items()) s << "    " << key << ": " << yaml_value(value) << "\n";
  const int64_t e = eval_micro_batch(c.plan);
  const std::string eval_line = e > 0 ? "eval_batch_size: " + std::to_string(e) +
                                            "  # plan.eval: the evaluation batch argument of your LightningDataModule\n"
                                      : "";
  if (c.options.lightning_datamodule.empty()) {
    s << "data:\n  batch_size: " << c.u << "  # an init argument of your LightningDataModule\n";
    if (e > 0) s << "  " << eval_line;
  } else {
    s << "data:\n  class_path: " << c.options.lightning_datamodule << "\n  init_args:\n    batch_size: " << c.u << "\n";
    if (e > 0) s << "    " << eval_line;
  }
  return s.str();
}

}  // namespace

const Exporter& lightning_exporter() {
  static const LightningExporter exporter;
  return exporter;
}

}  // namespace accumplan::exporting
