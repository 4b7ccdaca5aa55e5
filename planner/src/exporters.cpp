// exporters.cpp — trainer settings from a plan. See exporters.h and docs/exports.md.
#include "accumplan/exporters.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include <nlohmann/json.hpp>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/memory_model.h"
#include "accumplan/solver.h"
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

std::string launch_line(const std::string& launcher, int64_t world) {
  if (launcher == "accelerate") {
    return "accelerate launch --num_machines 1 --num_processes " + std::to_string(world) + " YOUR_SCRIPT.py";
  }
  return "torchrun --nnodes=1 --nproc_per_node=" + std::to_string(world) + " YOUR_SCRIPT.py";
}

}  // namespace

const std::vector<std::string>& export_targets() {
  static const std::vector<std::string> targets = {"deepspeed", "accelerate", "lightning", "hf", "torchrun"};
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

std::string export_plan(const Plan& plan, const std::string& target, std::string* note, const ExportOptions& options) {
  bool known = false;
  for (const auto& t : export_targets()) known = known || t == target;
  if (!known) {
    std::string list;
    for (const auto& t : export_targets()) list += (list.empty() ? "" : ", ") + t;
    throw InputError("--to '" + target + "' is not a known trainer; choose one of: " + list);
  }
  const int64_t u = plan.uniform.micro_batch;
  const int64_t k = plan.uniform.accumulation_steps;
  const int64_t W = plan.world_size;
  if (u < 1 || k < 1 || W < 1 ||
      checked_mul(checked_mul(u, k, "the plan's uniform split"), W, "the plan's uniform split x world_size") !=
          plan.target_batch) {
    throw InputError("the plan's uniform split (" + split_text(k, u) + " on " + std::to_string(W) +
                     " rank(s)) does not make target_batch " + std::to_string(plan.target_batch) +
                     "; re-plan it with `accumplan plan`");
  }
  if (note) note->clear();
  // A packed plan's windows by tokens cannot be expressed as a trainer's batch size: exporting
  // the sample fields would change the objective (windows of samples), not just the speed.
  if (plan.tokens && plan.tokens->target_tokens && target != "torchrun") {
    throw InputError("this plan's windows hold " + std::to_string(*plan.tokens->target_tokens) +
                     " valid tokens each (--target-tokens), which " + target + " cannot express: it cuts windows by "
                     "samples. Run the plan itself (accumplan run, `--to torchrun`, or the Python package's "
                     "token_windows), or re-plan with --target-batch");
  }

  if (target == "torchrun") {
    // accumplan runs the plan itself, balanced split and all: nothing departs from it.
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
    s
      << "# add --data FILE and --steps N or --epochs E; on several nodes set --nnodes, --node_rank, "
         "--master_addr, --master_port\n"
      << "# --redirects=1 --tee=1: torchrun 1.13 under Python 3.11 (Debian 12) fails on their default 0; "
         "each rank's stdout stays on the console\n"
      << "torchrun --nnodes=1 --nproc_per_node=" << W << " --redirects=1 --tee=1 --no_python "
      << shell_quote(options.binary)
      << " run --plan " << shell_quote(options.plan_path) << " --model "
      << shell_quote(plan.model.path.empty() ? "MODEL.pt" : plan.model.path) << "\n";
    return s.str();
  }

  bool by_time = false;
  const double slowdown = uniform_slowdown(plan, &by_time);
  std::string what = departure(plan, target, slowdown, by_time);
  if (plan.tokens) {
    // The sample fields are the padded plan: they fit, but every microbatch pads to max_seq_len.
    what = "this plan packs each window under a token budget of " + std::to_string(plan.tokens->token_budget) +
           " padded tokens; " + target + " does not pack, so it gets the plan's padded split: microbatches of " +
           std::to_string(u) + " sequences, each padded to at most " + std::to_string(plan.tokens->max_seq_len) +
           " tokens (they fit, but pad; packing runs only in accumplan run and the Python reader)" +
           (what.empty() ? std::string() : "; " + what);
  }
  if (slowdown > 1.0 + kSlowerBy && !options.allow_slow) {
    const auto [below, above] = nearest_even_targets(plan);
    std::string nearest;
    for (int64_t b : {above, below}) {
      if (b < 1) continue;
      const int64_t T = b / std::max<int64_t>(1, W);
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
                                                 ": " + nearest + "; re-plan with `accumplan plan --target-batch`") +
                          ", run the plan itself (accumplan run, or the Python package), or pass --allow-slow");
  }
  if (note) *note = what;
  const ojson about = provenance(plan, options, what, slowdown);

  if (target == "deepspeed") {
    ojson j;
    j["train_batch_size"] = plan.target_batch;
    j["train_micro_batch_size_per_gpu"] = u;
    j["gradient_accumulation_steps"] = k;
    j["accumplan"] = about;  // DeepSpeed reads the keys it knows and ignores this one
    return j.dump(2) + "\n";
  }
  if (target == "hf") {
    ojson j;
    j["TrainingArguments"] = ojson{{"per_device_train_batch_size", u}, {"gradient_accumulation_steps", k}};
    j["launch"] = launch_line("torchrun", W);
    j["accumplan"] = about;
    return j.dump(2) + "\n";
  }
  if (target == "accelerate") {
    ojson j;
    j["Accelerator"] = ojson{{"gradient_accumulation_steps", k}};
    j["DataLoader"] = ojson{{"batch_size", u}};
    j["launch"] = launch_line("accelerate", W);
    j["accumplan"] = about;
    return j.dump(2) + "\n";
  }
  // lightning: a LightningCLI config file; YAML comments carry what JSON cannot.
  std::ostringstream s;
  s << "# accumplan export lightning (LightningCLI --config): " << plan.target_batch << " samples per step = "
    << W << " device(s) x " << split_text(k, u) << "\n";
  if (!what.empty()) s << "# NOTE: " << what << "\n";
  s << "trainer:\n"
    << "  accumulate_grad_batches: " << k << "\n"
    << "  devices: " << W << "\n"
    << "  num_nodes: 1\n"
    << "data:\n"
    << "  batch_size: " << u << "  # an init argument of your LightningDataModule\n";
  return s.str();
}

}  // namespace accumplan
