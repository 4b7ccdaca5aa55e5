// planner/src/export/common.cpp — the rules every export target follows. See common.h.
//
// What it is: the refusals made before any text (check_exportable, the uniform split's predicted
// slowdown and the even targets it names, optimizer values a trainer cannot carry, the data
// module's class path), the plan's training settings in torch.optim's terms, the notes and the
// "accumplan" provenance object, and the flow every trainer's export runs (TrainerExporter).
// What it is not: any one trainer's format (export/<target>.cpp) or the target list (exporters.cpp).
#include "common.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/memory_model.h"
#include "accumplan/setup_rules.h"
#include "accumplan/solver.h"
#include "accumplan/terms.h"
#include "accumplan/units.h"

namespace accumplan::exporting {
namespace {

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

// Values written into a shell line: single quotes carry any byte, but a newline, a carriage return
// or an escape sequence in a printed command runs a second command or rewrites the terminal.
void check_shell_safe(const std::string& value, const std::string& what) {
  for (char c : value) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7F) {
      throw InputError(what + " '" + cut_for_message(value) + "' holds a control character; a shell line cannot "
                       "carry it safely. Rename the file");
    }
  }
}

// The target batches that split evenly, for the slow split's refusal: "252 (7 x 36) or 245 (7 x 35)".
std::string even_targets_text(const Plan& plan) {
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
  return nearest;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Refusals.

void check_exportable(const Plan& plan, const Exporter* exporter, const std::string& target,
                      const ExportOptions& options) {
  if (exporter == nullptr) {
    std::string list;
    for (const auto& t : export_targets()) list += (list.empty() ? "" : ", ") + t;
    throw InputError("--to '" + cut_for_message(target) + "' is not a known trainer; choose one of: " + list);
  }
  if (options.binary.empty()) {
    throw InputError("--binary '': name the accumplan the torchrun line launches, e.g. --binary accumplan");
  }
  check_shell_safe(options.binary, "--binary");
  check_shell_safe(options.plan_path, "--plan");
  if (exporter->runs_plan_itself()) check_shell_safe(plan.model.path, "the plan's model.path");
  check_lightning_datamodule(options.lightning_datamodule, options.names.lightning_datamodule);
  if (!options.lightning_datamodule.empty() && !exporter->takes_datamodule()) {
    throw InputError(options.names.lightning_datamodule + " is for " + options.names.lightning_target + ", not " +
                     target);
  }
  // Ranks that differ: a per-device batch for each rank, which these trainers give every rank alike.
  if (!plan.ranks.empty()) {
    if (exporter->runs_plan_itself()) return;
    std::string shares;
    for (const RankWindow& w : plan.ranks) shares += (shares.empty() ? "" : ", ") + std::to_string(w.per_rank_batch);
    throw InputError("this plan gives its " + std::to_string(plan.world_size) + " ranks different shares of each window (" +
                     shares + ") and microbatches (plan.ranks); " + target +
                     " gives every rank one per-device batch. Run the plan itself (" + to_target("torchrun") +
                     ", which launches accumplan run), or re-plan with one " + option_name("--memory-budget") +
                     " for every rank");
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
  if (plan.tokens && plan.tokens->target_tokens && !exporter->runs_plan_itself()) {
    throw InputError("this plan's windows hold " + std::to_string(*plan.tokens->target_tokens) +
                     " valid tokens each (" + option_name("--target-tokens") + "), which " + target +
                     " cannot express: it cuts windows by samples. Run the plan itself (accumplan run, " +
                     to_target("torchrun") + ", or the Python package's token_windows), or re-plan with " +
                     option_name("--target-batch"));
  }
}

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
  const std::string nearest = even_targets_text(plan);
  throw InfeasibleError(what + "; an export may cost at most " + pct(kSlowerBy) + " per window. " +
                        (nearest.empty() ? std::string("No nearby target batch splits evenly")
                                         : "Target batches that split evenly under max_micro_batch " +
                                               std::to_string(std::max(plan.max_micro_batch, plan.micro_batch)) +
                                               ": " + nearest + "; re-plan with " + plan_command({"--target-batch"})) +
                        ", run the plan itself (accumplan run, or the Python package), or pass " +
                        options.names.allow_slow);
}

// Every trainer's config states one set of optimizer values for every parameter: groups with
// different values do not fit it (groups with the same values do: one group's values carry them).
std::vector<std::string> optimizer_losses(const Training& t, const TrainerExporter& exporter,
                                          const ExportOptions& options) {
  if (!exporter.carries_optimizer()) return {};
  if (t.groups_differ.empty()) return {};
  if (!options.allow_lossy) {
    throw InputError("the " + std::string(exporter.trainer()) + " export cannot carry " + t.groups_differ +
                     ": its optimizer takes one set of values for every parameter; pass " +
                     options.names.allow_lossy + " to write the first group's values anyway");
  }
  return {"the plan's optimizer has " + t.groups_differ + "; written as the first group's values for every " +
          "parameter (lr " + number_text(t.lr) + "): pass your parameter groups to torch.optim." +
          torch_optimizer(t).first + " yourself"};
}

// ---------------------------------------------------------------------------------------------
// The plan's training settings.

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

std::string precision_name(const std::string& amp, const char* none, const char* bf16, const char* fp16) {
  return amp == "bf16" ? bf16 : amp == "fp16" ? fp16 : none;
}

int64_t eval_micro_batch(const Plan& plan) { return plan.eval ? plan.eval->micro_batch : 0; }

bool checkpoints_every_candidate(const PlanCheckpoint& cp) { return cp.modules.size() == cp.candidates.size(); }

ojson zero_stage_1() { return ojson{{"stage", 1}}; }

// ---------------------------------------------------------------------------------------------
// Notes, comments and provenance.

// With equal microbatches a per-sample plan's window mean is what those trainers already make.
std::string per_token_note(const Training& t, const std::string& trainer, const std::string& how_it_scales) {
  if (!t.per_token) return "";
  return "this plan weights every valid token of a window equally (over all microbatches and ranks); " + trainer + " " +
         how_it_scales + ", so a microbatch with fewer valid tokens counts as much as a full one. For the plan's "
         "objective make the loss sum(token losses) x gradient_accumulation_steps x world_size / (the window's valid "
         "tokens over all ranks, counted before its first backward)";
}

std::string eval_note(const Plan& plan, const std::string& where) {
  const int64_t e = eval_micro_batch(plan);
  if (e == 0) return "";
  return "evaluate in microbatches of " + std::to_string(e) + " per device (plan.eval: the largest measured to fit "
         "beside the weights and optimizer state, forward only under no_grad): " + where;
}

// Without the checkpointing the plan's microbatch does not fit its memory.
std::string checkpoint_note(const PlanCheckpoint& cp) {
  std::string modules;
  for (const std::string& m : cp.modules) modules += (modules.empty() ? "" : ", ") + m;
  return "the plan trains with activation checkpointing (" + cp.rule + ": " + modules + "); wrap those modules "
         "before training (accumplan's plan.apply_checkpointing(model), or torch.utils.checkpoint.checkpoint(block, "
         "x, use_reentrant=False)) — without it the planned microbatch does not fit";
}

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

std::string to_target(const std::string& name) {
  return front_end() == FrontEnd::Cli ? "--to " + name : "to=\"" + name + "\"";
}

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

// ---------------------------------------------------------------------------------------------
// Every trainer's export: the training settings, the optimizer's losses and the departure, all
// refused before any text; then the writer, and the notes for stderr (what was lost first).

std::string TrainerExporter::render(const Plan& plan, const ExportOptions& options, std::string* note) const {
  Training training = training_of(plan);
  std::vector<std::string> lossy = optimizer_losses(training, *this, options);
  double slowdown = 1.0;
  const std::string what = departure_or_refusal(plan, name(), options, &slowdown);
  ExportContext c{plan, plan.uniform.micro_batch, plan.uniform.accumulation_steps, std::move(training),
                  provenance(plan, options, what, slowdown), {}, options, std::move(lossy)};
  if (!what.empty()) c.notes.push_back(what);
  if (plan.checkpoint && !says_checkpointing()) c.notes.push_back(checkpoint_note(*plan.checkpoint));
  std::string text = write(c);
  if (note) {
    for (const std::string& n : c.lossy) *note += (note->empty() ? "" : "\n") + ("lossy: " + comment_text(n));
    for (const std::string& n : c.notes) *note += (note->empty() ? "" : "\n") + comment_text(n);
  }
  return text;
}

}  // namespace accumplan::exporting

// ---------------------------------------------------------------------------------------------
// The public rules of accumplan/exporters.h that every target shares.

namespace accumplan {

double uniform_slowdown(const Plan& plan, bool* by_time) {
  if (by_time) *by_time = false;
  if (!exporting::departs(plan) || plan.accumulation_steps < 1) return 1.0;
  const Profile points = exporting::profile_points_of(plan);
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
  const auto even = [&](int64_t B) {
    return B >= 1 && B % W == 0 && exporting::even_split_size(B / W, cap, unit) > 0;
  };
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

}  // namespace accumplan
