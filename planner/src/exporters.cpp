// exporters.cpp — trainer settings from a plan. See exporters.h and docs/exports.md.
#include "accumplan/exporters.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/memory_model.h"
#include "accumplan/setup_rules.h"
#include "accumplan/solver.h"
#include "accumplan/terms.h"
#include "accumplan/units.h"

namespace accumplan {
namespace {

using ojson = nlohmann::ordered_json;

constexpr double kSlowerBy = 0.25;  // "more than 25% slower per window" refuses without allow_slow

// The profile points the plan carries: nested under "profile" (1.1) or flattened into
// "profile_points" (1.0). Read through the JSON so either layout of the struct works.
Profile profile_points_of(const Plan& plan) {
  const ojson j = to_json(plan);
  const ojson* points = nullptr;
  if (j.contains("profile") && j["profile"].is_object() && j["profile"].contains("points")) {
    points = &j["profile"]["points"];
  } else if (j.contains("profile_points")) {
    points = &j["profile_points"];
  }
  Profile p;
  if (points == nullptr || !points->is_array()) return p;
  for (const auto& q : *points) {
    ProfilePoint pt;
    pt.micro_batch = q.value("micro_batch", int64_t{0});
    pt.peak_bytes = q.value("peak_bytes", int64_t{0});
    if (q.contains("step_seconds") && q["step_seconds"].is_number()) pt.step_seconds = q["step_seconds"].get<double>();
    p.points.push_back(pt);
  }
  return p;
}

// The uniform split differs from the plan's sizes: another count, or another size somewhere.
// Compared without building the uniform list (k may be up to 2^40 in a hostile plan).
bool departs(const Plan& plan) {
  if (static_cast<int64_t>(plan.microbatch_sizes.size()) != plan.uniform.accumulation_steps) return true;
  for (int64_t n : plan.microbatch_sizes) {
    if (n != plan.uniform.micro_batch) return true;
  }
  return false;
}

// When T splits into as few equal microbatches as a balanced split of sizes <= cap needs (k_min =
// ceil(T / cap)), each a multiple of `unit`: that size, T / k_min; else 0. O(1): a divisor d <=
// cap with T / d == k_min exists exactly when k_min divides T (and then d = T / k_min is the
// largest such divisor), so no search over divisors is needed.
int64_t even_split_size(int64_t T, int64_t cap, int64_t unit) {
  if (T < 1 || cap < 1 || unit < 1 || T % unit != 0) return 0;
  const int64_t cap_u = std::max(unit, (cap / unit) * unit);
  const int64_t k_min = checked_ceil_div(T, cap_u, "per-rank batch / max_micro_batch");
  if (T % k_min != 0) return 0;
  const int64_t d = T / k_min;
  return d % unit == 0 ? d : 0;
}

std::string pct(double f) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f%%", f * 100.0);
  return buf;
}

// "12% slower", or "8.8x as slow" where a percentage would read oddly (781% slower).
std::string slower(double ratio) {
  if (ratio < 2.0) return pct(ratio - 1.0) + " slower";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1fx as slow", ratio);
  return buf;
}

// 'path' for a shell, quoted only when it needs to be.
std::string shell_quote(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:=@%+,") ==
                        std::string::npos) {
    return s;
  }
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string split_text(int64_t k, int64_t u) { return std::to_string(k) + " x " + std::to_string(u); }

// What the export gives up against the plan, in one sentence; empty when nothing.
std::string departure(const Plan& plan, const std::string& target, double slowdown, bool by_time) {
  if (!departs(plan)) return "";
  const int64_t k = plan.uniform.accumulation_steps;
  std::string s = target + " needs equal microbatches: exporting the uniform split " +
                  split_text(k, plan.uniform.micro_batch) + " per rank instead of the plan's [" +
                  join_sizes(plan.microbatch_sizes, 16) + "] (" + std::to_string(k) + " steps instead of " +
                  std::to_string(plan.accumulation_steps) + ")";
  if (slowdown > 1.0) {
    s += by_time ? ", predicted " + slower(slowdown) + " per window by the profile's step times"
                 : ", " + std::to_string(plan.uniform.accumulation_steps) + " instead of " +
                       std::to_string(plan.accumulation_steps) +
                       " microbatches per window, counted as " + slower(slowdown) + " (the plan has no step times)";
  }
  return s;
}

ojson provenance(const Plan& plan, const ExportOptions& o, const std::string& note, double slowdown) {
  ojson a;
  a["plan"] = o.plan_path;
  a["target_batch"] = plan.target_batch;
  a["world_size"] = plan.world_size;
  a["plan_microbatch_sizes"] = plan.microbatch_sizes;
  a["exported"] = ojson{{"micro_batch", plan.uniform.micro_batch}, {"accumulation_steps", plan.uniform.accumulation_steps}};
  a["departs_from_plan"] = departs(plan);
  a["predicted_slowdown"] = departs(plan) ? ojson(std::round(slowdown * 1000.0) / 1000.0) : ojson(1.0);
  a["note"] = note.empty() ? "the uniform split is the plan's own split" : note;
  if (plan.tokens) {
    a["tokens"] = ojson{{"token_budget", plan.tokens->token_budget},
                        {"max_seq_len", plan.tokens->max_seq_len},
                        {"exported_as", "fixed microbatches padded to at most max_seq_len; packing runs only in accumplan "
                                        "run and the Python reader"}};
  }
  return a;
}

// The Hugging Face Trainer's launch on W processes.
std::string torchrun_launch_line(int64_t world) {
  return "torchrun --nnodes=1 --nproc_per_node=" + std::to_string(world) + " YOUR_SCRIPT.py";
}

// ---------------------------------------------------------------------------------------------
// What a trainer must be told to train as the plan was measured: precision, optimizer, clipping,
// device, ranks and the loss's normalisation, read from the plan's setup through the one set of
// rules (setup_rules.h).

struct Training {
  std::string amp;                        // none | bf16 | fp16
  std::string optimizer;                  // accumplan's name
  double lr = 0;                          // the first group's, as every export writes it
  std::map<std::string, double> hp;       // every hyperparameter, defaults filled in
  std::map<std::string, bool> flags;      // the on/off options as recorded (absent: torch's default)
  std::string groups_differ;              // group_difference: what one set of values cannot carry
  std::optional<double> max_grad_norm;
  bool cuda = false;
  bool per_token = false;                 // normalised by the window's valid tokens over all ranks
  int64_t world = 1;
};

Training training_of(const Plan& plan) {
  Training t;
  t.amp = plan.setup.amp;
  t.optimizer = plan.setup.optimizer;
  try {
    const std::vector<OptimizerGroup> groups = optimizer_groups(plan.setup);
    t.lr = groups.front().lr;
    t.hp = groups.front().hyperparameters;
    t.flags = groups.front().flags;
    t.groups_differ = group_difference(groups);
    t.per_token = normalizes_by_tokens(plan.setup);
  } catch (const InputError& e) {
    // The rules speak of the options that set these; here they come from the plan's setup.
    throw InputError(std::string("the plan's setup cannot be exported: ") + e.what() +
                     "; re-plan with a supported " + option_name("--optimizer") + " and " + option_name("--normalization"));
  }
  t.max_grad_norm = plan.setup.max_grad_norm;
  t.cuda = plan.device.type == "cuda";
  t.world = plan.world_size;
  return t;
}

// The plan's optimizer as torch.optim's class and keyword arguments: what every trainer that
// takes a class (Lightning's class_path, Trainer's optimizer_cls_and_kwargs) builds exactly.
// The flags follow the hyperparameters, in setup_rules' order, as recorded.
std::pair<std::string, ojson> torch_optimizer(const Training& t) {
  const OptimizerInfo& row = optimizer_info(t.optimizer);
  std::pair<std::string, ojson> out{row.torch_class, ojson{{"lr", t.lr}}};
  for (const auto& [key, value] : row.torch_fixed) out.second[key] = value;
  for (const TorchKeyword& k : torch_keywords(row)) {
    if (k.members.size() == 1) {
      out.second[k.keyword] = t.hp.at(k.members.front());
      continue;
    }
    ojson tuple = ojson::array();  // torch's betas: (beta1, beta2)
    for (const std::string& member : k.members) tuple.push_back(t.hp.at(member));
    out.second[k.keyword] = tuple;
  }
  for (const std::string& flag : optimizer_flags(t.optimizer)) {
    const auto it = t.flags.find(flag);
    if (it != t.flags.end()) out.second[flag] = it->second;
  }
  return out;
}

// What a trainer that scales each microbatch's mean loss by 1/k and averages gradients over the
// W ranks loses on a per-token plan, and the loss that restores it. Empty for a per-sample plan:
// with equal microbatches those trainers already make the window's mean.
std::string per_token_note(const Training& t, const std::string& trainer, const std::string& how_it_scales) {
  if (!t.per_token) return "";
  return "this plan weights every valid token of a window equally (over all microbatches and ranks); " + trainer + " " +
         how_it_scales + ", so a microbatch with fewer valid tokens counts as much as a full one. For the plan's "
         "objective make the loss sum(token losses) x gradient_accumulation_steps x world_size / (the window's valid "
         "tokens over all ranks, counted before its first backward)";
}

std::string precision_name(const std::string& amp, const char* none, const char* bf16, const char* fp16) {
  return amp == "bf16" ? bf16 : amp == "fp16" ? fp16 : none;
}

// Each target: the uniform split (u per rank, k microbatches), the plan's training settings and
// `notes` (what the target cannot express; each goes inside the output and to stderr).
struct ExportContext {
  const Plan& plan;
  int64_t u = 0;
  int64_t k = 0;
  Training t;
  ojson about;                      // the "accumplan" provenance object
  std::vector<std::string> notes;   // the departure first, when there is one
  const ExportOptions& options;
  std::vector<std::string> lossy;   // what the output does not carry (written anyway: allow_lossy)
};

// The "accumplan" object: provenance, notes, and (only when written anyway) what was lost.
// Plan text for a YAML comment or a note line: one_line's rule, and the line breaks YAML also
// ends a comment at (NEL, U+2028, U+2029) shown as '?' too.
std::string comment_text(const std::string& text) {
  std::string out = one_line(text);
  for (const char* brk : {"\xC2\x85", "\xE2\x80\xA8", "\xE2\x80\xA9"}) {
    for (size_t at = out.find(brk); at != std::string::npos; at = out.find(brk, at + 1)) out.replace(at, std::strlen(brk), "?");
  }
  return out;
}

ojson about_of(const ExportContext& c) {
  ojson about = c.about;
  about["notes"] = ojson::array();
  for (const std::string& n : c.notes) about["notes"].push_back(comment_text(n));
  if (!c.lossy.empty()) {
    about["lossy"] = ojson::array();
    for (const std::string& n : c.lossy) about["lossy"].push_back(comment_text(n));
  }
  return about;
}

// The evaluation batch (plan.eval, 1.7): 0 when the plan has none.
int64_t eval_micro_batch(const Plan& plan) { return plan.eval ? plan.eval->micro_batch : 0; }

// What the eval batch is, for the notes of tools with no key for it.
std::string eval_note(const Plan& plan, const std::string& where) {
  const int64_t e = eval_micro_batch(plan);
  if (e == 0) return "";
  return "evaluate in microbatches of " + std::to_string(e) + " per device (plan.eval: the largest measured to fit "
         "beside the weights and optimizer state, forward only under no_grad): " + where;
}

// The export target chosen as the front end spells it: `--to NAME`, or Python's to="NAME".
std::string to_target(const std::string& name) {
  return front_end() == FrontEnd::Cli ? "--to " + name : "to=\"" + name + "\"";
}

// The plan's activation checkpointing (1.7), for a trainer that cannot say it: which modules, and
// the wrapper that applies it. Without it the plan's microbatch does not fit its memory.
std::string checkpoint_note(const PlanCheckpoint& cp) {
  std::string modules;
  for (const std::string& m : cp.modules) modules += (modules.empty() ? "" : ", ") + m;
  return "the plan trains with activation checkpointing (" + cp.rule + ": " + modules + "); wrap those modules "
         "before training (accumplan's plan.apply_checkpointing(model), or torch.utils.checkpoint.checkpoint(block, "
         "x, use_reentrant=False)) — without it the planned microbatch does not fit";
}

// Every candidate checkpointed: what a model's own gradient_checkpointing_enable() does.
bool checkpoints_every_candidate(const PlanCheckpoint& cp) { return cp.modules.size() == cp.candidates.size(); }

// 1.9: the optimizer state sharded over the ranks is DeepSpeed's ZeRO stage 1 (each rank updates
// and holds its partition's state); gradients and parameters stay whole on every rank, as planned.
ojson zero_stage_1() { return ojson{{"stage", 1}}; }

std::string deepspeed_export(ExportContext& c) {
  ojson j;
  j["train_batch_size"] = c.plan.target_batch;
  j["train_micro_batch_size_per_gpu"] = c.u;
  j["gradient_accumulation_steps"] = c.k;
  if (c.t.amp == "bf16") j["bf16"] = ojson{{"enabled", true}};
  if (c.t.amp == "fp16") j["fp16"] = ojson{{"enabled", true}, {"loss_scale", 0}};  // 0: dynamic, as run scales
  j["gradient_clipping"] = c.t.max_grad_norm.value_or(0.0);                          // 0: off
  auto [name, params] = torch_optimizer(c.t);
  // DeepSpeed's own Adam is AdamW unless told (adam_w_mode) and fused unless torch_adam: both
  // set, so the update is torch.optim's, as measured. Other names fall back to torch.optim.
  if (name == "Adam" || name == "AdamW") {
    params["torch_adam"] = true;
    params["adam_w_mode"] = name == "AdamW";
  }
  j["optimizer"] = ojson{{"type", name}, {"params", params}};
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

std::string hf_export(ExportContext& c) {
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
  if (c.plan.checkpoint) {
    // Trainer's gradient_checkpointing calls the model's gradient_checkpointing_enable(), which a
    // transformers model applies to every layer: the plan's set only when it is every candidate of
    // a model that has it; any other model gets the blocks to wrap.
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
  if (t.per_token) {
    // Trainer then sums the valid labels of the k microbatches (num_items_in_batch), gathers the
    // count over ranks, and passes it to a model whose forward takes **kwargs.
    args["average_tokens_across_devices"] = true;
    c.notes.push_back("Trainer normalises per token only when each batch carries \"labels\" (-100 ignored) and the "
                      "model's forward accepts **kwargs (num_items_in_batch) or you pass compute_loss_func; otherwise "
                      "it divides each microbatch's mean loss by gradient_accumulation_steps");
  }
  const auto [name, kwargs] = torch_optimizer(t);
  ojson j;
  if (c.plan.sharding) {
    // Trainer's DeepSpeed config: "auto" takes each value from TrainingArguments.
    args["deepspeed"] = ojson{{"zero_optimization", zero_stage_1()},
                              {"train_micro_batch_size_per_gpu", "auto"},
                              {"gradient_accumulation_steps", "auto"},
                              {"train_batch_size", "auto"}};
  }
  j["TrainingArguments"] = args;
  j["optimizer"] = ojson{{"class", "torch.optim." + name}, {"kwargs", kwargs}};
  j["launch"] = torchrun_launch_line(c.plan.world_size);
  j["accumplan"] = about_of(c);
  return json_text(j);
}

std::string accelerate_export(ExportContext& c) {
  const Training& t = c.t;
  const auto [name, kwargs] = torch_optimizer(t);
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
  j["optimizer"] = ojson{{"class", "torch.optim." + name}, {"kwargs", kwargs}};
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

// `accelerate launch --config_file`: the fields of accelerate's ClusterConfig that say where and
// how the processes run. 'NO' and 'no' are quoted: YAML 1.1 reads a bare NO as false.
std::string accelerate_config_export(ExportContext& c) {
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

// A LightningCLI config file (`fit --config`); YAML comments carry what its keys cannot.
std::string lightning_export(ExportContext& c) {
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
  const auto [name, kwargs] = torch_optimizer(t);
  s << "optimizer:\n  class_path: torch.optim." << name << "\n  init_args:\n";
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

// accumplan runs the plan itself, balanced split and all: nothing departs from it.
std::string torchrun_export(const Plan& plan, const ExportOptions& options) {
  const int64_t W = plan.world_size;
  std::ostringstream s;
  s << "# accumplan export torchrun: ";
  if (plan.tokens && plan.tokens->target_tokens) {
    s << "windows of at least " << *plan.tokens->target_tokens << " valid tokens over " << W << " rank(s)";
  } else {
    s << plan.target_batch << " samples per step = " << W << " rank(s) x " << plan.per_rank_batch;
  }
  if (plan.tokens) {
    s << ", each window packed under a token budget of " << plan.tokens->token_budget
      << " padded tokens (sequences up to " << plan.tokens->max_seq_len << ")\n";
  } else {
    s << ", microbatches [" << join_sizes(plan.microbatch_sizes) << "] per rank\n";
  }
  if (plan.sharding) {
    s << "# the optimizer state sharded over the " << W << " ranks (ZeRO-1): accumplan run steps each rank's share and "
         "broadcasts it\n";
  }
  s << "# add --data FILE and --steps N or --epochs E; on several nodes set --nnodes, --node_rank, "
       "--master_addr, --master_port\n"
    << "# --redirects=1 --tee=1: torchrun 1.13 under Python 3.11 (Debian 12) fails on their default 0; "
       "each rank's stdout stays on the console\n";
  const std::string implementation = implementation_flags_set(plan.setup);
  if (!implementation.empty()) {
    s << "# NOTE: accumplan run computes the optimizer's " << implementation
      << " as LibTorch's one implementation of the same update\n";
  }
  const std::string module = plan.model.python_class();
  const std::string model = !module.empty() ? module + ".pt" : plan.model.path.empty() ? "MODEL.pt" : plan.model.path;
  if (!module.empty()) {
    s << "# NOTE: this plan was measured in Python on the module " << module << "; accumplan run trains a TorchScript "
      << "file: save it as " << model << " (torch.jit.script(model).save(\"" << model << "\")). TorchScript can keep "
      << "more activations than the module did, so plan that file (accumplan --model " << model
      << ") for its own figures\n";
  }
  s << "torchrun --nnodes=1 --nproc_per_node=" << W << " --redirects=1 --tee=1 --no_python "
    << shell_quote(options.binary) << " run --plan " << shell_quote(options.plan_path) << " --model "
    << shell_quote(model) << "\n";
  return s.str();
}

// The export targets, one row each: the name `--to` takes, how a message names the trainer, and
// the writer (torchrun's takes the plan alone: it launches `accumplan run` on it). The name list,
// the messages and the dispatch all read this table, so a target cannot be listed and fall
// through to another's writer (an added name once exported Lightning silently).
struct ExportTarget {
  const char* name;
  const char* trainer;
  std::string (*write)(ExportContext&);  // nullptr: torchrun
};
const std::vector<ExportTarget>& target_table() {
  static const std::vector<ExportTarget> table = {
      {"deepspeed", "DeepSpeed", &deepspeed_export},
      {"accelerate", "Accelerate", &accelerate_export},
      {"accelerate-config", "accelerate-config", &accelerate_config_export},
      {"lightning", "Lightning", &lightning_export},
      {"hf", "Hugging Face Trainer", &hf_export},
      {"torchrun", "torchrun", nullptr},
  };
  return table;
}
const ExportTarget* find_target(const std::string& name) {
  for (const ExportTarget& t : target_table()) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

// Everything export_plan refuses before writing anything: an unknown target or data module, a
// uniform split that does not make the target, windows cut by tokens for a trainer that cuts
// them by samples.
void check_exportable(const Plan& plan, const std::string& target, const ExportOptions& options) {
  if (find_target(target) == nullptr) {
    std::string list;
    for (const auto& t : export_targets()) list += (list.empty() ? "" : ", ") + t;
    throw InputError("--to '" + cut_for_message(target) + "' is not a known trainer; choose one of: " + list);
  }
  // Values written into a shell line: single quotes carry any byte, but a newline, a carriage return
  // or an escape sequence in a printed command runs a second command or rewrites the terminal.
  auto shell_safe = [](const std::string& value, const std::string& what) {
    for (char c : value) {
      if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
        throw InputError(what + " '" + cut_for_message(value) + "' holds a control character; a shell line cannot "
                         "carry it safely. Rename the file");
      }
    }
  };
  if (options.binary.empty()) {
    throw InputError("--binary '': name the accumplan the torchrun line launches, e.g. --binary accumplan");
  }
  shell_safe(options.binary, "--binary");
  shell_safe(options.plan_path, "--plan");
  if (target == "torchrun") shell_safe(plan.model.path, "the plan's model.path");
  check_lightning_datamodule(options.lightning_datamodule, options.names.lightning_datamodule);
  if (!options.lightning_datamodule.empty() && target != "lightning") {
    throw InputError(options.names.lightning_datamodule + " is for " + options.names.lightning_target + ", not " +
                     target);
  }
  const int64_t u = plan.uniform.micro_batch, k = plan.uniform.accumulation_steps, W = plan.world_size;
  if (u < 1 || k < 1 || W < 1 ||
      checked_mul(checked_mul(u, k, "the plan's uniform split"), W, "the plan's uniform split x world_size") !=
          plan.target_batch) {
    throw InputError("the plan's uniform split (" + split_text(k, u) + " on " + std::to_string(W) +
                     " rank(s)) does not make target_batch " + std::to_string(plan.target_batch) +
                     "; re-plan it with " + plan_command());
  }
  // A packed plan's windows by tokens cannot be expressed as a trainer's batch size: exporting
  // the sample fields would change the objective (windows of samples), not just the speed.
  if (plan.tokens && plan.tokens->target_tokens && target != "torchrun") {
    throw InputError("this plan's windows hold " + std::to_string(*plan.tokens->target_tokens) +
                     " valid tokens each (" + option_name("--target-tokens") + "), which " + target +
                     " cannot express: it cuts windows by samples. Run the plan itself (accumplan run, " +
                     to_target("torchrun") + ", or the Python package's token_windows), or re-plan with " +
                     option_name("--target-batch"));
  }
}

// The departure from the plan in one sentence (empty when none), or InfeasibleError when the
// uniform split is predicted more than 25% slower and the caller did not allow it.
std::string departure_or_refusal(const Plan& plan, const std::string& target, const ExportOptions& options,
                                 double* slowdown_out) {
  bool by_time = false;
  const double slowdown = uniform_slowdown(plan, &by_time);
  *slowdown_out = slowdown;
  std::string what = departure(plan, target, slowdown, by_time);
  if (plan.tokens) {
    // The sample fields are the padded plan: they fit, but every microbatch pads to max_seq_len.
    what = "this plan packs each window under a token budget of " + std::to_string(plan.tokens->token_budget) +
           " padded tokens; " + target + " does not pack, so it gets the plan's padded split: microbatches of " +
           std::to_string(plan.uniform.micro_batch) + " sequences, each padded to at most " +
           std::to_string(plan.tokens->max_seq_len) +
           " tokens (they fit, but pad; packing runs only in accumplan run and the Python reader)" +
           (what.empty() ? std::string() : "; " + what);
  }
  if (slowdown <= 1.0 + kSlowerBy || options.allow_slow) return what;
  const int64_t W = std::max<int64_t>(1, plan.world_size);
  const auto [below, above] = nearest_even_targets(plan);
  std::string nearest;
  for (int64_t b : {above, below}) {
    if (b < 1) continue;
    const int64_t T = b / W;
    const int64_t d = even_split_size(T, std::max({plan.max_micro_batch, plan.micro_batch, int64_t{1}}),
                                      std::max<int64_t>(1, plan.multiple_of.value_or(1)));
    if (d < 1) continue;
    nearest += (nearest.empty() ? "" : " or ") + std::to_string(b) + " (" + split_text(T / d, d) +
               (W > 1 ? " per rank" : "") + ")";
  }
  throw InfeasibleError(what + "; an export may cost at most " + pct(kSlowerBy) + " per window. " +
                        (nearest.empty() ? std::string("No nearby target batch splits evenly")
                                         : "Target batches that split evenly under max_micro_batch " +
                                               std::to_string(std::max(plan.max_micro_batch, plan.micro_batch)) +
                                               ": " + nearest + "; re-plan with " + plan_command({"--target-batch"})) +
                        ", run the plan itself (accumplan run, or the Python package), or pass " +
                        options.names.allow_slow);
}

// How a message names the trainer an export is for.
std::string trainer_name(const std::string& target) {
  const ExportTarget* t = find_target(target);
  return t != nullptr ? t->trainer : target;
}

// The torchrun export launches accumplan run on the plan: InputError naming what of the plan's
// optimizer LibTorch cannot run (libtorch_cannot_run, the rule accumplan run refuses by), with
// or without allow_lossy: written anyway, the line would only launch that refusal.
void check_torchrun_optimizer(const Plan& plan) {
  std::string cannot;
  try {
    cannot = libtorch_cannot_run(plan.setup);
  } catch (const InputError& e) {
    throw InputError(std::string("the plan's setup cannot be exported: ") + e.what());
  }
  if (cannot.empty()) return;
  throw InputError("the torchrun export launches accumplan run, which cannot run the plan's " + cannot +
                   " (LibTorch's optimizers); train with the Python package (Plan.train_window with your "
                   "optimizer), or re-plan with an optimizer accumplan run can build");
}

// What the export cannot carry of the plan's optimizer, one clause each; InputError naming it and
// the fix unless the caller allows a lossy export. Every trainer's config states one set of
// optimizer values for every parameter: groups with different values do not fit it (groups with
// the same values do: one group's values carry them). The accelerate-config file carries no
// optimizer (the accelerate export does).
std::vector<std::string> optimizer_losses(const Training& t, const std::string& target, const ExportOptions& options) {
  if (target == "accelerate-config") return {};
  if (t.groups_differ.empty()) return {};
  if (!options.allow_lossy) {
    throw InputError("the " + trainer_name(target) + " export cannot carry " + t.groups_differ +
                     ": its optimizer takes one set of values for every parameter; pass " +
                     options.names.allow_lossy + " to write the first group's values anyway");
  }
  return {"the plan's optimizer has " + t.groups_differ + "; written as the first group's values for every " +
          "parameter (lr " + number_text(t.lr) + "): pass your parameter groups to torch.optim." +
          torch_optimizer(t).first + " yourself"};
}

}  // namespace

const std::vector<std::string>& export_targets() {
  static const std::vector<std::string> targets = [] {
    std::vector<std::string> names;
    for (const ExportTarget& t : target_table()) names.emplace_back(t.name);
    return names;
  }();
  return targets;
}

double uniform_slowdown(const Plan& plan, bool* by_time) {
  if (by_time) *by_time = false;
  if (!departs(plan) || plan.accumulation_steps < 1) return 1.0;
  const Profile points = profile_points_of(plan);
  if (TimeModel::available(points)) {
    const TimeModel t = TimeModel::fit(points);
    const double planned = t.window_seconds(plan.microbatch_sizes);
    // The uniform window is k equal microbatches: k times one, never a list of k entries.
    const double uniform = static_cast<double>(plan.uniform.accumulation_steps) * t.predict_seconds(plan.uniform.micro_batch);
    if (planned > 0 && std::isfinite(planned) && std::isfinite(uniform)) {
      if (by_time) *by_time = true;
      return uniform / planned;
    }
  }
  return static_cast<double>(plan.uniform.accumulation_steps) / static_cast<double>(plan.accumulation_steps);
}

std::pair<int64_t, int64_t> nearest_even_targets(const Plan& plan) {
  const int64_t W = std::max<int64_t>(1, plan.world_size);
  const int64_t unit = std::max<int64_t>(1, plan.multiple_of.value_or(1));
  const int64_t cap = std::max<int64_t>({plan.max_micro_batch, plan.micro_batch, int64_t{1}});
  const auto even = [&](int64_t B) { return B >= 1 && B % W == 0 && even_split_size(B / W, cap, unit) > 0; };
  // Every multiple of W * cap_u splits evenly (T = m * cap_u), so one lies within that step of
  // B; the search tries at most kTries candidates each way, then falls back to those multiples,
  // so a plan with a target of 2^40 samples answers at once.
  constexpr int64_t kTries = 1 << 20;
  const int64_t cap_u = std::max(unit, (cap / unit) * unit);
  const int64_t step = checked_mul(W, cap_u, "world_size * max_micro_batch");
  const int64_t B = plan.target_batch;
  std::pair<int64_t, int64_t> out{0, 0};
  for (int64_t b = B - 1, n = 0; b >= 1 && n < kTries && out.first == 0; --b, ++n) {
    if (even(b)) out.first = b;
  }
  if (out.first == 0 && B - 1 >= step) out.first = ((B - 1) / step) * step;
  for (int64_t b = B + 1, n = 0; n < kTries && out.second == 0 && b <= kMaxSamples; ++b, ++n) {
    if (even(b)) out.second = b;
  }
  if (out.second == 0) {
    const int64_t above = checked_mul(B / step + 1, step, "the next target batch that splits evenly");
    if (above <= kMaxSamples) out.second = above;
  }
  return out;
}

void check_lightning_datamodule(const std::string& class_path, const std::string& what) {
  if (class_path.empty()) return;
  // A dotted Python name: identifiers (letters, digits, _; not starting with a digit) joined by '.'.
  bool ok = true, start = true;
  for (const char ch : class_path) {
    const bool letter = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || ch == '_';
    const bool digit = ch >= '0' && ch <= '9';
    if (ch == '.') {
      ok = ok && !start;
      start = true;
    } else {
      ok = ok && (letter || (digit && !start));
      start = false;
    }
  }
  if (!ok || start) {
    throw InputError(what + " '" + cut_for_message(class_path) +
                     "' is not a Python class path; give the module and class, e.g. my_project.data.TextDataModule");
  }
}

std::string export_plan(const Plan& plan, const std::string& target, std::string* note, const ExportOptions& options) {
  check_exportable(plan, target, options);
  if (note) note->clear();
  if (find_target(target)->write == nullptr) {  // torchrun
    if (plan.checkpoint) {
      throw InputError(to_target("torchrun") + " launches `accumplan run`, which cannot apply the plan's activation checkpointing "
                       "(a TorchScript model); export to a Python trainer (hf, lightning, accelerate, deepspeed) or "
                       "train with accumplan's plan.train_window");
    }
    check_torchrun_optimizer(plan);
    return torchrun_export(plan, options);
  }
  Training training = training_of(plan);
  std::vector<std::string> lossy = optimizer_losses(training, target, options);
  double slowdown = 1.0;
  const std::string what = departure_or_refusal(plan, target, options, &slowdown);
  ExportContext c{plan, plan.uniform.micro_batch, plan.uniform.accumulation_steps, std::move(training),
                  provenance(plan, options, what, slowdown), {}, options, std::move(lossy)};
  if (!what.empty()) c.notes.push_back(what);
  if (plan.checkpoint && target != "hf") c.notes.push_back(checkpoint_note(*plan.checkpoint));
  std::string text = find_target(target)->write(c);  // check_exportable refused an unknown target
  if (note) {
    for (const std::string& n : c.lossy) *note += (note->empty() ? "" : "\n") + ("lossy: " + comment_text(n));
    for (const std::string& n : c.notes) *note += (note->empty() ? "" : "\n") + comment_text(n);
  }
  return text;
}

}  // namespace accumplan
