// schema.cpp — JSON for profile.json and plan.json. See schema.h for the rules; field order in
// the writers is the order users read, so golden files stay stable and diffs stay small.
#include "accumplan/schema.h"

#include "accumplan/ranks.h"
#include "accumplan/setup_rules.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "accumplan/checked.h"
#include "accumplan/errors.h"
#include "accumplan/json_io.h"
#include "accumplan/solver.h"
#include "accumplan/tensor_spec.h"
#include "accumplan/terms.h"
#include "accumplan/units.h"

namespace accumplan {

using nlohmann::json;
// ordered_json keeps keys in insertion order, so plan.json reads top-down: the answer first.
using ojson = nlohmann::ordered_json;

const std::string& schema_version_string() {
  static const std::string v = std::to_string(kSchemaMajor) + "." + std::to_string(kSchemaMinor);
  return v;
}

namespace {

template <class T>
ojson opt(const std::optional<T>& v) {
  return v ? ojson(*v) : ojson(nullptr);
}

ojson device_json(const DeviceInfo& d) {
  return ojson{{"type", d.type}, {"index", d.index}, {"name", d.name}, {"total_bytes", d.total_bytes}};
}
DeviceInfo device_from(const JsonField& f) {
  DeviceInfo d;
  d.type = f.one_of("type", {"cpu", "cuda"});
  d.index = static_cast<int>(f.i64("index"));
  d.name = f.str("name");
  d.total_bytes = f.i64("total_bytes");
  return d;
}

ojson model_json(const ModelInfo& m) {
  ojson j{{"path", m.path},
          {"sha256", m.sha256},
          {"parameter_count", m.parameter_count},
          {"batch_dependent_layers", m.batch_dependent_layers}};
  if (m.hf_gradient_checkpointing) j["hf_gradient_checkpointing"] = *m.hf_gradient_checkpointing;  // 1.8, when recorded
  return j;
}
ModelInfo model_from(const JsonField& f) {
  ModelInfo m;
  m.path = f.str("path");
  m.sha256 = f.str("sha256");
  m.parameter_count = f.i64("parameter_count");
  m.batch_dependent_layers = f.strings("batch_dependent_layers");
  if (f.has("hf_gradient_checkpointing")) m.hf_gradient_checkpointing = f.boolean("hf_gradient_checkpointing");
  return m;
}

ojson numbers_json(const std::map<std::string, double>& values) {
  ojson j = ojson::object();
  for (const auto& [k, v] : values) j[k] = v;
  return j;
}
ojson flags_json(const std::map<std::string, bool>& flags) {
  ojson j = ojson::object();
  for (const auto& [k, v] : flags) j[k] = v;
  return j;
}

// 1.6: every group, the first included (it repeats setup's lr, hyperparameters and flags).
ojson param_groups_json(const std::vector<OptimizerGroup>& groups) {
  ojson list = ojson::array();
  for (const OptimizerGroup& g : groups) {
    ojson j{{"lr", g.lr}, {"hyperparameters", numbers_json(g.hyperparameters)}};
    if (!g.flags.empty()) j["flags"] = flags_json(g.flags);
    if (g.parameter_count) j["parameter_count"] = *g.parameter_count;
    list.push_back(j);
  }
  return list;
}

ojson setup_json(const Setup& s) {
  ojson j{{"optimizer", s.optimizer},
          {"lr", s.lr},
          {"hyperparameters", numbers_json(s.hyperparameters)}};
  // 1.6, only when set: a setup of one group at torch's default options stays as in 1.5.
  if (!s.flags.empty()) j["flags"] = flags_json(s.flags);
  if (!s.param_groups.empty()) j["param_groups"] = param_groups_json(s.param_groups);
  j["amp"] = s.amp;
  j["max_grad_norm"] = opt(s.max_grad_norm);
  j["loss"] = s.loss;
  j["normalization"] = s.normalization;
  j["inputs"] = s.inputs;
  j["target"] = s.target;
  j["ignore_index"] = s.ignore_index;
  if (s.padding_mask) j["padding_mask"] = true;  // 1.3, only when set: sample setups stay as in 1.2
  if (s.seq_len) j["seq_len"] = s.seq_len->text();
  return j;
}
std::map<std::string, double> numbers_from(const JsonField& f) {
  if (!f.raw().is_object()) f.fail("an object of numbers");
  std::map<std::string, double> values;
  for (auto it = f.raw().begin(); it != f.raw().end(); ++it) {
    values[it.key()] = JsonField(it.value(), f.path() + "." + cut_for_message(it.key(), 40)).as_double();
  }
  return values;
}
std::map<std::string, bool> flags_from(const JsonField& f) {
  if (!f.raw().is_object()) f.fail("an object of booleans");
  std::map<std::string, bool> flags;
  for (auto it = f.raw().begin(); it != f.raw().end(); ++it) {
    flags[it.key()] = JsonField(it.value(), f.path() + "." + cut_for_message(it.key(), 40)).as_bool();
  }
  return flags;
}

// 1.6: one entry per group, the first stating what setup's lr, hyperparameters and flags state.
std::vector<OptimizerGroup> param_groups_from(const JsonField& f, const Setup& s) {
  std::vector<OptimizerGroup> groups;
  for (const JsonField& item : f.items()) {
    OptimizerGroup g;
    g.lr = item.f64("lr");
    if (item.has("hyperparameters")) g.hyperparameters = numbers_from(item.at("hyperparameters"));
    if (item.has("flags")) g.flags = flags_from(item.at("flags"));
    g.parameter_count = item.opt_i64("parameter_count");
    groups.push_back(g);
  }
  if (groups.empty()) f.fail("a list of the optimizer's parameter groups (absent for one group)");
  const OptimizerGroup& first = groups.front();
  if (first.lr != s.lr || first.hyperparameters != s.hyperparameters || first.flags != s.flags) {
    throw SchemaError(f.path() + "[0]: the first group's lr, hyperparameters and flags must be setup's lr, "
                      "hyperparameters and flags (they state the first group); write the same values in both");
  }
  return groups;
}

Setup setup_from(const JsonField& f) {
  Setup s;
  s.optimizer = f.one_of("optimizer", optimizer_names());
  // The learning rate is not a memory fact: a profile written by another tool may leave it out,
  // and then the optimizer's conventional default applies (as on the command line).
  if (auto lr = f.opt_f64("lr")) {
    s.lr = *lr;
  } else {
    s.lr = optimizer_info(s.optimizer).default_lr;
  }
  if (f.has("hyperparameters")) s.hyperparameters = numbers_from(f.at("hyperparameters"));
  if (f.has("flags")) s.flags = flags_from(f.at("flags"));  // 1.6
  if (f.has("param_groups")) s.param_groups = param_groups_from(f.at("param_groups"), s);  // 1.6
  if (f.has("normalization") && !f.at("normalization").raw().is_null()) {
    s.normalization = f.one_of("normalization", {"auto", "samples", "tokens"});
  }
  s.amp = f.one_of("amp", {"none", "fp16", "bf16"});
  s.max_grad_norm = f.opt_f64("max_grad_norm");  // 1.1; absent in 1.0 (no clipping measured)
  s.loss = f.one_of("loss", kLosses);
  s.inputs = f.strings("inputs");
  s.target = f.str("target");
  if (auto ii = f.opt_i64("ignore_index")) s.ignore_index = *ii;
  if (f.has("padding_mask")) s.padding_mask = f.boolean("padding_mask");  // 1.3
  if (auto sl = f.opt_str("seq_len")) {
    try {
      s.seq_len = parse_seq_len(*sl, f.path() + ".seq_len");
    } catch (const InputError& e) {
      throw SchemaError(e.what());
    }
  }
  return s;
}

ojson point_json(const ProfilePoint& p) {
  ojson j{{"micro_batch", p.micro_batch}, {"peak_bytes", p.peak_bytes}};
  if (p.reserved_peak_bytes) j["reserved_peak_bytes"] = *p.reserved_peak_bytes;
  if (p.optimizer_step_peak_bytes) j["optimizer_step_peak_bytes"] = *p.optimizer_step_peak_bytes;
  if (p.first_microbatch_peak_bytes) j["first_microbatch_peak_bytes"] = *p.first_microbatch_peak_bytes;
  j["step_seconds"] = opt(p.step_seconds);
  if (p.seq_len) j["seq_len"] = *p.seq_len;  // 1.3
  return j;
}
ProfilePoint point_from(const JsonField& f) {
  ProfilePoint p;
  p.micro_batch = f.i64("micro_batch");
  p.peak_bytes = f.i64("peak_bytes");
  p.reserved_peak_bytes = f.opt_i64("reserved_peak_bytes");
  p.optimizer_step_peak_bytes = f.opt_i64("optimizer_step_peak_bytes");
  p.first_microbatch_peak_bytes = f.opt_i64("first_microbatch_peak_bytes");
  p.step_seconds = f.opt_f64("step_seconds");
  p.seq_len = f.opt_i64("seq_len");  // 1.3
  return p;
}
ojson points_json(const std::vector<ProfilePoint>& pts) {
  ojson a = ojson::array();
  for (const auto& p : pts) a.push_back(point_json(p));
  return a;
}
std::vector<ProfilePoint> points_from(const JsonField& f) {
  std::vector<ProfilePoint> out;
  for (const auto& item : f.items()) out.push_back(point_from(item));
  return out;
}

ojson trials_json(const std::vector<Trial>& trials) {
  ojson a = ojson::array();
  for (const auto& t : trials) {
    ojson j{{"kind", t.kind},
            {"micro_batch", t.micro_batch},
            {"fit", t.fit},
            {"peak_bytes", t.peak_bytes},
            {"seconds", t.seconds},
            {"window", t.window}};
    if (t.seq_len) j["seq_len"] = *t.seq_len;  // 1.3
    a.push_back(j);
  }
  return a;
}
std::vector<Trial> trials_from(const JsonField& f) {
  std::vector<Trial> out;
  for (const auto& item : f.items()) {
    Trial t;
    t.kind = item.str("kind");
    t.micro_batch = item.i64("micro_batch");
    t.fit = item.boolean("fit");
    t.peak_bytes = item.i64("peak_bytes");
    t.seconds = item.f64("seconds");
    if (item.has("window")) {  // 1.2
      for (const auto& n : item.at("window").items()) t.window.push_back(n.as_int());
    }
    t.seq_len = item.opt_i64("seq_len");  // 1.3
    out.push_back(t);
  }
  return out;
}

// Trials that may only be of `kinds` (a section's own windows); SchemaError naming the first other.
std::vector<Trial> trials_of_kinds(const JsonField& f, const std::set<std::string>& kinds, const std::string& what) {
  std::vector<Trial> trials = trials_from(f);
  for (size_t i = 0; i < trials.size(); ++i) {
    if (!kinds.count(trials[i].kind)) {
      std::string listed;
      for (const std::string& k : kinds) listed += (listed.empty() ? "" : " or ") + k;
      throw SchemaError(f.path() + "[" + std::to_string(i) + "].kind: '" + cut_for_message(trials[i].kind) +
                        "' is not " + what + " (" + listed + ")");
    }
  }
  return trials;
}

// The documented range of every number in a profile or plan (docs/plan-format.md), by the key
// that holds it, wherever it sits (a plan's nested profile included); an array (microbatch_sizes,
// residuals_bytes, weights) holds numbers of its key's range. Keys not listed are not numbers the
// readers use. Integer-ness is the readers' check; this one bounds the value, so that no sum or
// product a reader or the planner forms can overflow and no double cast to an integer is
// undefined.
using NumberRange = ValueRange;

constexpr double kBytesMax = static_cast<double>(kMaxBytes);
constexpr double kSamplesMax = static_cast<double>(kMaxSamples);
constexpr NumberRange kBytesRange{0, kBytesMax, false, false};
constexpr NumberRange kSignedBytesRange{-kBytesMax, kBytesMax, false, false};
constexpr NumberRange kSamplesRange{1, kSamplesMax, false, false};
constexpr NumberRange kSecondsRange{0, 1e9, false, false};

const NumberRange* range_of(const std::string& key, bool in_hyperparameters) {
  static const std::map<std::string, NumberRange> exact = {
      // Fit quantities and a0 may be negative: a line fitted to measured peaks.
      {"intercept_bytes", kSignedBytesRange},
      {"residuals_bytes", kSignedBytesRange},
      {"slope_bytes_per_sample", kSignedBytesRange},
      {"activation_fixed_bytes", kSignedBytesRange},
      {"activation_bytes_per_sample", kSignedBytesRange},
      {"micro_batch", kSamplesRange},
      {"target_batch", kSamplesRange},
      {"per_rank_batch", kSamplesRange},
      {"max_micro_batch", kSamplesRange},
      {"multiple_of", kSamplesRange},
      {"microbatch_sizes", kSamplesRange},
      {"window", kSamplesRange},
      {"accumulation_steps", kSamplesRange},
      {"fitted_from_micro_batch", {0, kSamplesMax, false, false}},
      {"world_size", {1, static_cast<double>(kMaxWorldSize), false, false}},
      {"index", {0, 65535, false, false}},
      {"parameter_count", {0, kBytesMax, false, false}},
      {"weights", {0, 1, true, false}},
      {"headroom", {0, 1, false, true}},
      {"lr", *optimizer_value_range("lr")},  // the one table of optimizer value ranges
      {"max_grad_norm", {0, 1e12, true, false}},
      {"ignore_index", {-2147483648.0, 2147483647.0, false, false}},
      {"token_budget", {1, static_cast<double>(int64_t{1} << 40), false, false}},
      {"max_seq_len", {1, static_cast<double>(int64_t{1} << 31), false, false}},
      {"seq_len", {1, static_cast<double>(int64_t{1} << 31), false, false}},
      {"longest_sequence_alone", {0, static_cast<double>(int64_t{1} << 31), false, false}},
      {"target_tokens", {1, static_cast<double>(int64_t{1} << 50), false, false}},
      // per_microbatch, per_token, per_token_squared: check_step_cost (kStepCostTermRanges).
      {"seconds", kSecondsRange},
      {"saved_bytes_per_sample", {0, kBytesMax, false, false}},  // 1.7 checkpoint
      {"head_bytes_per_sample", {0, kBytesMax, false, false}},
      {"forward_seconds_per_sample", kSecondsRange},
      {"predicted_seconds_per_window", kSecondsRange},
      {"measured_rank", {0, static_cast<double>(kMaxWorldSize - 1), false, false}},  // 1.9 sharding
      {"unsharded_micro_batch", kSamplesRange},
  };
  if (in_hyperparameters) return &kRecordedHyperparameterRange;
  const auto it = exact.find(key);
  if (it != exact.end()) return &it->second;
  auto ends_with = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return key.size() >= n && key.compare(key.size() - n, n, suffix) == 0;
  };
  if (ends_with("_bytes")) return &kBytesRange;
  if (ends_with("_seconds")) return &kSecondsRange;
  if (ends_with("_fraction")) {
    static const NumberRange fraction{0, 1, false, false};
    return &fraction;
  }
  return nullptr;
}

std::string range_text(const NumberRange& r) {
  auto num = [](double v) {
    char buf[40];
    // Integral bounds print as integers (1125899906842624, not 1.1258999068426e+15).
    if (std::fabs(v) < 9.007199254740992e15 && v == std::floor(v)) {
      std::snprintf(buf, sizeof buf, "%lld", static_cast<long long>(v));
    } else {
      std::snprintf(buf, sizeof buf, "%g", v);
    }
    return std::string(buf);
  };
  return std::string(r.lo_open ? "(" : "[") + num(r.lo) + ", " + num(r.hi) + (r.hi_open ? ")" : "]");
}

void check_number(const json& v, const std::string& path, const NumberRange& r) {
  bool ok = false;
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    ok = u <= static_cast<uint64_t>(r.hi) && (r.hi_open ? static_cast<double>(u) < r.hi : true) &&
         (r.lo_open ? static_cast<double>(u) > r.lo : static_cast<double>(u) >= r.lo);
  } else if (v.is_number_integer()) {
    const double d = static_cast<double>(v.get<int64_t>());
    ok = (r.lo_open ? d > r.lo : d >= r.lo) && (r.hi_open ? d < r.hi : d <= r.hi);
  } else if (v.is_number_float()) {
    const double d = v.get<double>();
    ok = std::isfinite(d) && (r.lo_open ? d > r.lo : d >= r.lo) && (r.hi_open ? d < r.hi : d <= r.hi);
  } else {
    return;  // not a number: the reader reports the type
  }
  if (!ok) {
    throw SchemaError(path + ": " + cut_for_message(v.dump()) + " is out of range; expected a number in " +
                      range_text(r));
  }
}

void check_ranges(const json& v, const std::string& path, const std::string& key, bool in_hyperparameters,
                  int depth) {
  if (depth > kMaxJsonDepth) return;  // the parser bounds depth already
  if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      check_ranges(it.value(), path + "." + cut_for_message(it.key(), 40), it.key(),
                   key == "hyperparameters", depth + 1);
    }
  } else if (v.is_array()) {
    const NumberRange* r = range_of(key, in_hyperparameters);
    for (size_t i = 0; i < v.size(); ++i) {
      const std::string p = path + "[" + std::to_string(i) + "]";
      if (r != nullptr && v[i].is_number()) {
        check_number(v[i], p, *r);
      } else {
        check_ranges(v[i], p, "", false, depth + 1);
      }
    }
  } else if (v.is_number()) {
    if (const NumberRange* r = range_of(key, in_hyperparameters)) check_number(v, path, *r);
  }
}

// "1.2": one or more digits, a dot, one or more digits; nothing else (no sign, no third part).
bool is_major_minor(const std::string& version) {
  const size_t dot = version.find('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == version.size() || version.size() > 19) return false;
  for (size_t i = 0; i < version.size(); ++i) {
    if (i != dot && !std::isdigit(static_cast<unsigned char>(version[i]))) return false;
  }
  return true;
}

// Checks `schema` and `schema_version` (another major is refused, a newer minor accepted), then
// every number's documented range.
void check_version(const JsonField& root, const char* expected_schema);

void check_header(const JsonField& root, const char* expected_schema) {
  const std::string schema = root.str("schema");
  if (schema != expected_schema) {
    throw SchemaError("$.schema: this is a '" + cut_for_message(schema) + "' document, expected '" +
                      expected_schema + "'");
  }
  check_version(root, expected_schema);
  check_ranges(root.raw(), "$", "", false, 0);
  // From 1.8 the eval line's slope is held at 0 or above (an older planner could write a falling line).
  const std::string version = root.str("schema_version");  // 1.MINOR: check_version refused other majors
  std::string minor = version.substr(version.find('.') + 1);
  minor.erase(0, std::min(minor.find_first_not_of('0'), minor.size() - 1));
  const bool held = minor.size() > 1 || minor[0] >= '8';
  const json& doc = root.raw();
  if (held && doc.contains("eval") && doc["eval"].is_object() && doc["eval"].contains("slope_bytes_per_sample")) {
    check_number(doc["eval"]["slope_bytes_per_sample"], "$.eval.slope_bytes_per_sample", kBytesRange);
  }
}

// `schema_version`: another major is refused, a newer minor accepted.
void check_version(const JsonField& root, const char* expected_schema) {
  const std::string version = root.str("schema_version");
  if (!is_major_minor(version)) {
    throw SchemaError("$.schema_version: '" + cut_for_message(version) +
                      "' is not MAJOR.MINOR (digits, a dot, digits, e.g. \"" + schema_version_string() + "\")");
  }
  const long major = std::strtol(version.c_str(), nullptr, 10);
  if (major != kSchemaMajor) {
    throw SchemaError("$.schema_version: " + std::string(expected_schema) + " version " + version +
                      " is not readable by this accumplan, which reads " +
                      std::to_string(kSchemaMajor) + ".x; use an accumplan that writes " +
                      version.substr(0, version.find('.')) + ".x, or regenerate the file with this one");
  }
}

// A document's first two fields: which schema, which version of it.
ojson document_header(const char* schema) {
  ojson j;
  j["schema"] = schema;
  j["schema_version"] = schema_version_string();
  return j;
}

// A step cost (tokens.step_cost, time_model.final_cost): its three terms, and token_seconds where
// it is set or `always_token_seconds` (1.5; a plan writes it only when set).
ojson step_cost_json(const TokenStepCost& c, bool always_token_seconds) {
  ojson j{{"per_microbatch", c.per_microbatch}, {"per_token", c.per_token}, {"per_token_squared", c.per_token_squared}};
  if (always_token_seconds || c.token_seconds > 0) j["token_seconds"] = c.token_seconds;
  return j;
}

// The step cost at `key` of `f`, or nullopt where it is absent or null; each term in its range
// (check_step_cost), token_seconds (1.5) 0 where absent.
std::optional<TokenStepCost> step_cost_from(const JsonField& f, const char* key) {
  if (!f.has(key) || f.at(key).raw().is_null()) return std::nullopt;
  const JsonField c = f.at(key);
  const TokenStepCost cost{c.i64("per_microbatch"), c.i64("per_token"), c.i64("per_token_squared"),
                           c.opt_f64("token_seconds", {0.0, 1e9}).value_or(0.0)};
  check_step_cost(cost, c.path() + ".");
  return cost;
}

}  // namespace

std::optional<ValueRange> documented_range(const std::string& key) {
  const NumberRange* r = range_of(key, false);
  return r ? std::optional<ValueRange>(*r) : std::nullopt;
}

void check_step_cost(const TokenStepCost& cost, const std::string& prefix, const std::string& suffix) {
  const int64_t terms[] = {cost.per_microbatch, cost.per_token, cost.per_token_squared};
  for (size_t i = 0; i < 3; ++i) {
    const StepCostTermRange& r = kStepCostTermRanges[i];
    if (terms[i] < r.lo || terms[i] > r.hi) {
      throw SchemaError(prefix + r.name + suffix + ": " + std::to_string(terms[i]) +
                        " is out of range; expected an integer in [" + std::to_string(r.lo) + ", " +
                        std::to_string(r.hi) + "]");
    }
  }
}

namespace {

// The profile's fields, without the document header: the body of profile.json and the nested
// "profile" of a 1.1 plan.
// 1.9: the optimizer state sharded over the ranks; unsharded_micro_batch only in plans.
ojson sharding_json(const Sharding& s, bool in_plan) {
  ojson j{{"optimizer", s.optimizer},
          {"world_size", s.world_size},
          {"per_rank_state_bytes", s.per_rank_state_bytes},
          {"measured_rank", s.measured_rank}};
  if (in_plan) j["unsharded_micro_batch"] = s.unsharded_micro_batch.value_or(0) > 0 ? ojson(*s.unsharded_micro_batch) : ojson(nullptr);
  if (!s.other_ranks.empty()) {
    ojson others = ojson::array();
    for (const RankStepPeak& r : s.other_ranks) {
      others.push_back(ojson{{"rank", r.rank}, {"optimizer_step_peak_bytes", r.optimizer_step_peak_bytes}, {"seconds", r.seconds}});
    }
    j["other_ranks"] = others;
  }
  if (in_plan && !s.per_rank_peak_bytes.empty()) j["per_rank_peak_bytes"] = s.per_rank_peak_bytes;
  return j;
}

// 1.11: each other share's measured rank, ascending, none the measured one.
std::vector<RankStepPeak> other_ranks_from(const JsonField& f, const Sharding& s) {
  std::vector<RankStepPeak> out;
  if (!f.has("other_ranks")) return out;
  for (const JsonField& r : f.at("other_ranks").items()) {
    RankStepPeak p{r.i64("rank"), r.i64("optimizer_step_peak_bytes"), r.f64("seconds")};
    if (p.rank < 0 || p.rank >= s.world_size || p.rank == s.measured_rank || (!out.empty() && p.rank <= out.back().rank)) {
      throw SchemaError(r.path() + ".rank: " + std::to_string(p.rank) + " is not a rank in [0, " + std::to_string(s.world_size) +
                        ") above the one before and other than measured_rank " + std::to_string(s.measured_rank));
    }
    out.push_back(p);
  }
  return out;
}

Sharding sharding_from(const JsonField& f, bool in_plan) {
  Sharding s;
  s.optimizer = f.boolean("optimizer");
  if (!s.optimizer) throw SchemaError(f.path() + ".optimizer: false; a plan without sharding has no sharding field");
  s.world_size = f.i64("world_size");
  for (const JsonField& b : f.at("per_rank_state_bytes").items()) s.per_rank_state_bytes.push_back(b.as_int());
  try {
    checked_sum(s.per_rank_state_bytes, f.path() + ".per_rank_state_bytes: the whole state, the shares' sum");
  } catch (const InputError& e) {
    throw SchemaError(e.what());
  }
  s.measured_rank = f.i64("measured_rank");
  if (s.world_size < 2 || static_cast<int64_t>(s.per_rank_state_bytes.size()) != s.world_size) {
    throw SchemaError(f.path() + ".per_rank_state_bytes: " + std::to_string(s.per_rank_state_bytes.size()) +
                      " shares for world_size " + std::to_string(s.world_size) + " (at least 2 ranks, one share each)");
  }
  const int64_t largest = std::max_element(s.per_rank_state_bytes.begin(), s.per_rank_state_bytes.end()) -
                          s.per_rank_state_bytes.begin();
  if (s.measured_rank != largest) {
    throw SchemaError(f.path() + ".measured_rank: " + std::to_string(s.measured_rank) + " is not rank " +
                      std::to_string(largest) + ", the lowest rank of the largest share; the windows hold that one");
  }
  s.other_ranks = other_ranks_from(f, s);
  if (in_plan) {
    s.unsharded_micro_batch = f.opt_i64("unsharded_micro_batch").value_or(0);
    if (*s.unsharded_micro_batch < 0) throw SchemaError(f.path() + ".unsharded_micro_batch: below 0");
    if (f.has("per_rank_peak_bytes")) {
      for (const JsonField& b : f.at("per_rank_peak_bytes").items()) s.per_rank_peak_bytes.push_back(b.as_int());
      if (static_cast<int64_t>(s.per_rank_peak_bytes.size()) != s.world_size) {
        throw SchemaError(f.path() + ".per_rank_peak_bytes: " + std::to_string(s.per_rank_peak_bytes.size()) +
                          " peaks for world_size " + std::to_string(s.world_size) + " (one per rank)");
      }
    }
  }
  return s;
}

// 1.13: each rank's window where the ranks differ.
ojson ranks_json(const std::vector<RankWindow>& ranks) {
  ojson out = ojson::array();
  for (size_t r = 0; r < ranks.size(); ++r) {
    const RankWindow& w = ranks[r];
    out.push_back(ojson{{"rank", static_cast<int64_t>(r)},
                        {"budget_bytes", w.budget_bytes},
                        {"per_rank_batch", w.per_rank_batch},
                        {"max_micro_batch", w.max_micro_batch},
                        {"microbatch_sizes", w.microbatch_sizes},
                        {"predicted_peak_bytes", w.predicted_peak_bytes},
                        {"window_seconds", w.window_seconds ? ojson(*w.window_seconds) : ojson(nullptr)}});
  }
  return out;
}

std::vector<RankWindow> ranks_from(const JsonField& f) {
  std::vector<RankWindow> out;
  for (const JsonField& r : f.items()) {
    if (r.i64("rank") != static_cast<int64_t>(out.size())) {
      throw SchemaError(r.path() + ".rank: " + std::to_string(r.i64("rank")) + "; the ranks are listed 0, 1, 2, ... in order");
    }
    RankWindow w;
    w.budget_bytes = r.i64("budget_bytes");
    w.per_rank_batch = r.i64("per_rank_batch");
    w.max_micro_batch = r.i64("max_micro_batch");
    for (const JsonField& n : r.at("microbatch_sizes").items()) w.microbatch_sizes.push_back(n.as_int());
    w.predicted_peak_bytes = r.i64("predicted_peak_bytes");
    w.window_seconds = r.opt_f64("window_seconds");
    out.push_back(std::move(w));
  }
  return out;
}

ojson profile_body_json(const Profile& p) {
  ojson j;
  j["device"] = device_json(p.device);
  j["model"] = model_json(p.model);
  j["setup"] = setup_json(p.setup);
  j["libtorch_version"] = p.libtorch_version;
  j["probe"] = p.probe;
  j["budget_bytes"] = opt(p.budget_bytes);
  j["persistent"] = ojson{{"weights_bytes", p.persistent.weights_bytes},
                          {"gradients_bytes", p.persistent.gradients_bytes},
                          {"optimizer_state_bytes", p.persistent.optimizer_state_bytes}};
  j["points"] = points_json(p.points);
  j["trials"] = trials_json(p.trials);
  if (p.eval) {  // 1.7
    ojson points = ojson::array();
    for (const EvalPoint& e : p.eval->points) points.push_back(ojson{{"micro_batch", e.micro_batch}, {"peak_bytes", e.peak_bytes}});
    j["eval"] = ojson{{"keep_outputs", p.eval->keep_outputs}, {"points", points}, {"trials", trials_json(p.eval->trials)}};
  }
  if (p.sharding) j["sharding"] = sharding_json(*p.sharding, false);  // 1.9
  if (p.gradient_exchange) j["gradient_exchange"] = true;  // 1.10, only when the windows made it
  return j;
}

Profile profile_body_from(const JsonField& root) {
  Profile p;
  p.device = device_from(root.at("device"));
  p.model = model_from(root.at("model"));
  p.setup = setup_from(root.at("setup"));
  p.libtorch_version = root.str("libtorch_version");
  p.probe = root.opt_str("probe").value_or("");
  p.budget_bytes = root.opt_i64("budget_bytes");
  const JsonField per = root.at("persistent");
  p.persistent.weights_bytes = per.i64("weights_bytes");
  p.persistent.gradients_bytes = per.i64("gradients_bytes");
  p.persistent.optimizer_state_bytes = per.i64("optimizer_state_bytes");
  p.points = points_from(root.at("points"));
  if (root.has("trials")) p.trials = trials_from(root.at("trials"));
  if (root.has("eval")) {  // 1.7
    const JsonField f = root.at("eval");
    EvalProfile e;
    e.keep_outputs = f.boolean("keep_outputs");
    for (const JsonField& pt : f.at("points").items()) e.points.push_back({pt.i64("micro_batch"), pt.i64("peak_bytes")});
    e.trials = trials_of_kinds(f.at("trials"), {"eval"}, "an eval window");
    p.eval = e;
  }
  if (root.has("sharding")) p.sharding = sharding_from(root.at("sharding"), false);  // 1.9
  p.gradient_exchange = root.has("gradient_exchange") && root.boolean("gradient_exchange");  // 1.10
  return p;
}

}  // namespace

ojson to_json(const Profile& p) {
  ojson j = document_header(kProfileSchema);
  const ojson body = profile_body_json(p);  // named: items() of a temporary would dangle
  for (const auto& item : body.items()) j[item.key()] = item.value();
  return j;
}

Profile profile_from_json(const json& doc) {
  const JsonField root(doc, "$");
  check_header(root, kProfileSchema);
  return profile_body_from(root);
}

// 1.7: the evaluation batch. micro_batch null: not even the training microbatch fits beside the
// training state (micro_batch counts samples, from 1, wherever it sits).
ojson eval_json(const EvalPlan& e) {
  ojson j;
  j["micro_batch"] = e.micro_batch > 0 ? ojson(e.micro_batch) : ojson(nullptr);
  j["predicted_peak_bytes"] = e.predicted_peak_bytes;
  j["intercept_bytes"] = e.intercept_bytes;
  j["slope_bytes_per_sample"] = e.slope_bytes_per_sample;
  j["keep_outputs"] = e.keep_outputs;
  j["resident"] = ojson{{"weights_bytes", e.weights_bytes}, {"optimizer_state_bytes", e.optimizer_state_bytes}};
  j["confirmed"] = e.confirmed;
  j["trials"] = trials_json(e.trials);
  return j;
}

EvalPlan eval_from(const JsonField& f) {
  EvalPlan e;
  e.micro_batch = f.opt_i64("micro_batch").value_or(0);
  e.predicted_peak_bytes = f.i64("predicted_peak_bytes");
  e.intercept_bytes = f.f64("intercept_bytes");
  e.slope_bytes_per_sample = f.f64("slope_bytes_per_sample");
  e.keep_outputs = f.boolean("keep_outputs");
  const JsonField r = f.at("resident");
  e.weights_bytes = r.i64("weights_bytes");
  e.optimizer_state_bytes = r.i64("optimizer_state_bytes");
  e.confirmed = f.boolean("confirmed");
  e.trials = trials_of_kinds(f.at("trials"), {"eval"}, "an eval window");
  if (e.confirmed && e.micro_batch == 0) {
    throw SchemaError("$.eval: confirmed is true but micro_batch is null; a confirmed eval batch has a size");
  }
  return e;
}

// 1.7: activation checkpointing. without.micro_batch and accumulation_steps null: not one sample
// fits without it.
ojson checkpoint_json(const PlanCheckpoint& c) {
  ojson candidates = ojson::array();
  for (const BlockCost& b : c.candidates) {
    candidates.push_back(ojson{{"name", b.name},
                               {"saved_bytes_per_sample", b.saved_bytes_per_sample},
                               {"forward_seconds_per_sample", b.forward_seconds_per_sample}});
  }
  const CheckpointAlternative& w = c.without;
  return ojson{{"modules", c.modules},
               {"rule", c.rule},
               {"saved_bytes_per_sample", c.saved_bytes_per_sample},
               {"head_bytes_per_sample", c.head_bytes_per_sample},
               {"recompute_seconds", c.recompute_seconds},
               {"predicted_seconds_per_window", c.predicted_seconds_per_window},
               {"without", ojson{{"micro_batch", w.micro_batch > 0 ? ojson(w.micro_batch) : ojson(nullptr)},
                                 {"accumulation_steps", w.micro_batch > 0 ? ojson(w.accumulation_steps) : ojson(nullptr)},
                                 {"predicted_peak_bytes", w.predicted_peak_bytes},
                                 {"predicted_seconds_per_window", w.predicted_seconds_per_window}}},
               {"candidates", candidates},
               {"trials", trials_json(c.trials)}};
}

PlanCheckpoint checkpoint_from(const JsonField& f) {
  PlanCheckpoint c;
  for (const JsonField& n : f.at("modules").items()) c.modules.push_back(n.as_string());
  c.rule = f.str("rule");
  c.saved_bytes_per_sample = f.f64("saved_bytes_per_sample");
  if (f.has("head_bytes_per_sample")) c.head_bytes_per_sample = f.f64("head_bytes_per_sample");
  c.recompute_seconds = f.f64("recompute_seconds");
  c.predicted_seconds_per_window = f.f64("predicted_seconds_per_window");
  const JsonField w = f.at("without");
  c.without.micro_batch = w.opt_i64("micro_batch").value_or(0);
  c.without.accumulation_steps = w.opt_i64("accumulation_steps").value_or(0);
  c.without.predicted_peak_bytes = w.i64("predicted_peak_bytes");
  c.without.predicted_seconds_per_window = w.f64("predicted_seconds_per_window");
  for (const JsonField& b : f.at("candidates").items()) {
    c.candidates.push_back({b.str("name"), b.f64("saved_bytes_per_sample"), b.f64("forward_seconds_per_sample")});
  }
  if (f.has("trials")) c.trials = trials_of_kinds(f.at("trials"), {"costs", "confirm"}, "a checkpoint window");
  // Every checkpointed module is a measured candidate, once: a reader applies exactly these.
  std::set<std::string> names, used;
  for (const BlockCost& b : c.candidates) {
    if (!names.insert(b.name).second) {
      throw SchemaError(f.path() + ".candidates: '" + cut_for_message(b.name) + "' is named twice");
    }
  }
  for (const std::string& m : c.modules) {
    if (!names.count(m)) throw SchemaError(f.path() + ".modules: '" + cut_for_message(m) + "' is not one of the candidates");
    if (!used.insert(m).second) throw SchemaError(f.path() + ".modules: '" + cut_for_message(m) + "' is named twice");
  }
  if (c.modules.empty()) throw SchemaError(f.path() + ".modules: a checkpoint names at least one module (none: no checkpoint)");
  return c;
}

// 1.8: what checkpointing="auto" weighed. micro_batch and accumulation_steps null: not one sample fits.
ojson checkpoint_choice_json(const CheckpointChoiceRecord& r) {
  ojson options = ojson::array();
  for (const CheckpointOption& o : r.options) {
    options.push_back(ojson{{"rule", o.rule},
                            {"modules", o.modules},
                            {"micro_batch", o.micro_batch > 0 ? ojson(o.micro_batch) : ojson(nullptr)},
                            {"accumulation_steps", o.micro_batch > 0 ? ojson(o.accumulation_steps) : ojson(nullptr)},
                            {"predicted_peak_bytes", o.predicted_peak_bytes},
                            {"predicted_seconds_per_window", o.predicted_seconds_per_window}});
  }
  return ojson{{"options", options}, {"chosen", r.chosen}, {"decided_by", r.decided_by}};
}

CheckpointChoiceRecord checkpoint_choice_from(const JsonField& f) {
  CheckpointChoiceRecord r;
  std::set<std::string> rules;
  for (const JsonField& o : f.at("options").items()) {
    CheckpointOption c;
    c.rule = o.str("rule");
    for (const JsonField& n : o.at("modules").items()) c.modules.push_back(n.as_string());
    c.micro_batch = o.opt_i64("micro_batch").value_or(0);
    c.accumulation_steps = o.opt_i64("accumulation_steps").value_or(0);
    c.predicted_peak_bytes = o.i64("predicted_peak_bytes");
    c.predicted_seconds_per_window = o.f64("predicted_seconds_per_window");
    if (!rules.insert(c.rule).second) throw SchemaError(o.path() + ".rule: '" + cut_for_message(c.rule) + "' is listed twice");
    r.options.push_back(std::move(c));
  }
  r.chosen = f.str("chosen");
  r.decided_by = f.str("decided_by");
  if (r.options.empty() || r.options.front().rule != "none" || !r.options.front().modules.empty()) {
    throw SchemaError(f.path() + ".options[0]: the first option is 'none', checkpointing no module");
  }
  if (!rules.count(r.chosen)) {
    throw SchemaError(f.path() + ".chosen: '" + cut_for_message(r.chosen) + "' is not one of the options' rules");
  }
  return r;
}

ojson to_json(const Plan& p) {
  ojson j = document_header(kPlanSchema);
  j["target_batch"] = p.target_batch;
  j["world_size"] = p.world_size;
  j["per_rank_batch"] = p.per_rank_batch;
  j["micro_batch"] = p.micro_batch;
  j["accumulation_steps"] = p.accumulation_steps;
  j["microbatch_sizes"] = p.microbatch_sizes;
  j["weights"] = p.weights;
  j["max_micro_batch"] = p.max_micro_batch;
  j["split"] = p.split;
  j["multiple_of"] = opt(p.multiple_of);
  j["uniform"] = ojson{{"micro_batch", p.uniform.micro_batch},
                       {"accumulation_steps", p.uniform.accumulation_steps}};
  if (p.tokens) {  // 1.3, only for ragged data: sample plans stay as in 1.2
    j["tokens"] = ojson{{"token_budget", p.tokens->token_budget},
                        {"max_seq_len", p.tokens->max_seq_len},
                        {"longest_sequence_alone", p.tokens->longest_sequence_alone}};
    if (p.tokens->target_tokens) j["tokens"]["target_tokens"] = *p.tokens->target_tokens;  // 1.4
    if (p.tokens->step_cost) j["tokens"]["step_cost"] = step_cost_json(*p.tokens->step_cost, false);  // 1.4
  }
  const MemoryBreakdown& m = p.memory;
  j["memory"] = ojson{{"budget_bytes", m.budget_bytes},
                      {"margin_bytes", m.margin_bytes},
                      {"margin", ojson{{"headroom", m.margin.headroom},
                                       {"fit_residual_bytes", m.margin.fit_residual_bytes},
                                       {"activation_fraction", m.margin.activation_fraction},
                                       {"activation_bytes", m.margin.activation_bytes},
                                       {"allocator_fragmentation_bytes", m.margin.allocator_fragmentation_bytes},
                                       {"fixed_bytes", m.margin.fixed_bytes},
                                       {"measured", m.margin.measured}}},
                      {"usable_bytes", m.usable_bytes},
                      {"predicted_peak_bytes", m.predicted_peak_bytes},
                      {"weights_bytes", m.weights_bytes},
                      {"gradients_bytes", m.gradients_bytes},
                      {"optimizer_state_bytes", m.optimizer_state_bytes},
                      {"activation_fixed_bytes", m.activation_fixed_bytes},
                      {"activation_bytes_per_sample", m.activation_bytes_per_sample}};
  j["fit"] = ojson{{"target", p.fit.target},
                   {"intercept_bytes", p.fit.intercept_bytes},
                   {"slope_bytes_per_sample", p.fit.slope_bytes_per_sample},
                   {"max_abs_residual_bytes", p.fit.max_abs_residual_bytes},
                   {"rms_residual_bytes", p.fit.rms_residual_bytes},
                   {"residuals_bytes", p.fit.residuals_bytes},
                   {"fitted_from_micro_batch", p.fit.fitted_from_micro_batch}};
  if (p.timing) {
    j["timing"] = ojson{{"window_seconds", p.timing->window_seconds},
                        {"microbatch_seconds_at_plan", p.timing->microbatch_seconds_at_plan}};
  } else {
    j["timing"] = nullptr;
  }
  j["confirmed"] = p.confirmed;
  j["confirmed_peak_bytes"] = opt(p.confirmed_peak_bytes);
  j["reason"] = p.reason;
  j["device"] = device_json(p.device);
  j["model"] = model_json(p.model);
  j["setup"] = setup_json(p.setup);
  j["libtorch_version"] = p.libtorch_version;
  j["profile"] = profile_body_json(p.profile);
  if (p.eval) j["eval"] = eval_json(*p.eval);  // 1.7, only when planned
  if (p.checkpoint) j["checkpoint"] = checkpoint_json(*p.checkpoint);  // 1.7, only when chosen
  if (p.checkpoint_choice) j["checkpoint_choice"] = checkpoint_choice_json(*p.checkpoint_choice);  // 1.8
  if (p.sharding) j["sharding"] = sharding_json(*p.sharding, true);  // 1.9, only when sharded
  if (!p.ranks.empty()) j["ranks"] = ranks_json(p.ranks);  // 1.13, only where the ranks differ
  return j;
}

namespace {

// $.tokens (1.3; step_cost and target_tokens 1.4; step_cost.token_seconds 1.5), or nothing for a sample plan.
std::optional<TokenBudget> tokens_from(const JsonField& root) {
  if (!root.has("tokens") || root.at("tokens").raw().is_null()) return std::nullopt;
  const JsonField tk = root.at("tokens");
  TokenBudget tb;
  tb.token_budget = tk.i64("token_budget");
  tb.max_seq_len = tk.i64("max_seq_len");
  tb.longest_sequence_alone = tk.i64("longest_sequence_alone");
  tb.target_tokens = tk.opt_i64("target_tokens");  // 1.4
  tb.step_cost = step_cost_from(tk, "step_cost");  // 1.4
  if (tb.token_budget < 1 || tb.max_seq_len < 1 || tb.max_seq_len > tb.token_budget) {
    throw SchemaError("$.tokens: token_budget " + std::to_string(tb.token_budget) + " must hold at least one sequence of max_seq_len " +
                      std::to_string(tb.max_seq_len) + " tokens (both >= 1)");
  }
  return tb;
}

// $.memory: the budget, the margin (1.2; a 1.0/1.1 plan's fraction of the budget as a fixed
// margin) and the breakdown.
MemoryBreakdown memory_from(const JsonField& m) {
  MemoryBreakdown mem;
  mem.budget_bytes = m.i64("budget_bytes");
  if (m.has("margin")) {  // 1.2
    const JsonField g = m.at("margin");
    mem.margin_bytes = m.i64("margin_bytes");
    mem.margin.headroom = g.str("headroom");
    mem.margin.fit_residual_bytes = g.i64("fit_residual_bytes");
    mem.margin.activation_fraction = g.f64("activation_fraction");
    mem.margin.activation_bytes = g.i64("activation_bytes");
    mem.margin.allocator_fragmentation_bytes = g.i64("allocator_fragmentation_bytes");
    mem.margin.fixed_bytes = g.i64("fixed_bytes");
    mem.margin.measured = g.boolean("measured");
  } else {
    // 1.0/1.1 kept a fraction of the whole budget free: the same bytes, as a fixed margin, so a
    // re-plan after an OOM keeps what the plan kept.
    const double fraction = m.f64("headroom");
    if (!(fraction >= 0.0 && fraction < 1.0)) {
      throw SchemaError("$.memory.headroom: a fraction in [0, 1) in a 1.0/1.1 plan, got " + std::to_string(fraction));
    }
    mem.margin_bytes = m.i64("budget_bytes") - m.i64("usable_bytes");
    mem.margin.headroom = format_bytes(mem.margin_bytes);
    mem.margin.fixed_bytes = mem.margin_bytes;
  }
  mem.usable_bytes = m.i64("usable_bytes");
  mem.predicted_peak_bytes = m.i64("predicted_peak_bytes");
  mem.weights_bytes = m.i64("weights_bytes");
  mem.gradients_bytes = m.i64("gradients_bytes");
  mem.optimizer_state_bytes = m.i64("optimizer_state_bytes");
  mem.activation_fixed_bytes = m.i64("activation_fixed_bytes");
  mem.activation_bytes_per_sample = m.f64("activation_bytes_per_sample");
  return mem;
}

FitSummary fit_from(const JsonField& f) {
  FitSummary fit;
  fit.target = f.str("target");
  fit.intercept_bytes = f.f64("intercept_bytes");
  fit.slope_bytes_per_sample = f.f64("slope_bytes_per_sample");
  fit.max_abs_residual_bytes = f.f64("max_abs_residual_bytes");
  fit.rms_residual_bytes = f.f64("rms_residual_bytes");
  for (const auto& r : f.at("residuals_bytes").items()) fit.residuals_bytes.push_back(r.as_double());
  fit.fitted_from_micro_batch = f.opt_i64("fitted_from_micro_batch").value_or(0);  // 1.1
  return fit;
}

// $.profile (1.1+), or a 1.0 plan's flattened one: the points and trials beside the plan's own
// device, model and setup, the persistent bytes in the breakdown.
Profile plan_profile_from(const JsonField& root, const Plan& p) {
  if (root.has("profile")) return profile_body_from(root.at("profile"));
  Profile profile;
  profile.device = p.device;
  profile.model = p.model;
  profile.setup = p.setup;
  profile.libtorch_version = p.libtorch_version;
  profile.persistent = {p.memory.weights_bytes, p.memory.gradients_bytes, p.memory.optimizer_state_bytes};
  profile.points = points_from(root.at("profile_points"));
  if (root.has("trials")) profile.trials = trials_from(root.at("trials"));
  return profile;
}

}  // namespace

// Cross-field invariants: a hand-edited plan that breaks them would silently mis-weight. The
// numbers are bounded above when read (check_header), the arithmetic is checked all the same.
void check_plan_window(const Plan& p) {
  if (p.microbatch_sizes.empty()) throw SchemaError("$.microbatch_sizes: a plan has at least one microbatch");
  for (auto n : p.microbatch_sizes) {
    if (n < 1) throw SchemaError("$.microbatch_sizes: every size must be >= 1");
  }
  const int64_t sum = checked_sum(p.microbatch_sizes, "$.microbatch_sizes: the sum");
  if (sum != p.per_rank_batch) {
    throw SchemaError("$.microbatch_sizes: sizes sum to " + std::to_string(sum) +
                      ", but per_rank_batch is " + std::to_string(p.per_rank_batch));
  }
  if (p.weights.size() != p.microbatch_sizes.size()) {
    throw SchemaError("$.weights: " + std::to_string(p.weights.size()) + " weights for " +
                      std::to_string(p.microbatch_sizes.size()) + " microbatches");
  }
  if (static_cast<int64_t>(p.microbatch_sizes.size()) != p.accumulation_steps) {
    throw SchemaError("$.accumulation_steps: " + std::to_string(p.accumulation_steps) +
                      " does not match the " + std::to_string(p.microbatch_sizes.size()) +
                      " entries of microbatch_sizes");
  }
  if (p.world_size < 1 || (p.ranks.empty() && checked_mul(p.per_rank_batch, p.world_size,
                                                          "$.per_rank_batch * $.world_size") != p.target_batch)) {
    throw SchemaError("$.per_rank_batch: per_rank_batch * world_size != target_batch");
  }
  check_rank_windows(p);  // 1.13: ranks that differ
  for (size_t i = 0; i < p.weights.size(); ++i) {
    // n_i / T, as the writers compute it; a hand-edited weight would silently mis-weight.
    const double expected = static_cast<double>(p.microbatch_sizes[i]) / static_cast<double>(p.per_rank_batch);
    if (std::fabs(p.weights[i] - expected) > 1e-9) {
      throw SchemaError("$.weights[" + std::to_string(i) + "]: " + cut_for_message(nlohmann::json(p.weights[i]).dump()) +
                        " is not microbatch_sizes[" + std::to_string(i) + "] / per_rank_batch = " +
                        nlohmann::json(expected).dump() + "; re-plan with " + plan_command());
    }
  }
  if (p.uniform.micro_batch < 1 || p.uniform.accumulation_steps < 1 ||
      checked_mul(p.uniform.micro_batch, p.uniform.accumulation_steps, "$.uniform") != p.per_rank_batch) {
    throw SchemaError("$.uniform: " + std::to_string(p.uniform.accumulation_steps) + " x " +
                      std::to_string(p.uniform.micro_batch) + " does not make per_rank_batch " +
                      std::to_string(p.per_rank_batch) + "; re-plan with " + plan_command());
  }
}

Plan plan_from_json(const json& doc) {
  const JsonField root(doc, "$");
  check_header(root, kPlanSchema);
  Plan p;
  p.target_batch = root.i64("target_batch");
  p.world_size = root.i64("world_size");
  p.per_rank_batch = root.i64("per_rank_batch");
  p.micro_batch = root.i64("micro_batch");
  p.accumulation_steps = root.i64("accumulation_steps");
  for (const auto& f : root.at("microbatch_sizes").items()) p.microbatch_sizes.push_back(f.as_int());
  for (const auto& f : root.at("weights").items()) p.weights.push_back(f.as_double());
  p.max_micro_batch = root.i64("max_micro_batch");
  p.split = root.one_of("split", kSplitKinds);
  p.multiple_of = root.opt_i64("multiple_of");
  const JsonField u = root.at("uniform");
  p.uniform.micro_batch = u.i64("micro_batch");
  p.uniform.accumulation_steps = u.i64("accumulation_steps");
  p.tokens = tokens_from(root);
  p.memory = memory_from(root.at("memory"));
  if (root.has("fit")) p.fit = fit_from(root.at("fit"));
  const JsonField t = root.at("timing");
  if (!t.raw().is_null()) p.timing = Timing{t.f64("window_seconds"), t.f64("microbatch_seconds_at_plan")};
  p.confirmed = root.boolean("confirmed");
  p.confirmed_peak_bytes = root.opt_i64("confirmed_peak_bytes");
  p.reason = root.str("reason");
  p.device = device_from(root.at("device"));
  p.model = model_from(root.at("model"));
  p.setup = setup_from(root.at("setup"));
  p.libtorch_version = root.str("libtorch_version");
  p.profile = plan_profile_from(root, p);
  if (root.has("eval")) p.eval = eval_from(root.at("eval"));  // 1.7
  if (root.has("checkpoint")) p.checkpoint = checkpoint_from(root.at("checkpoint"));  // 1.7
  if (root.has("checkpoint_choice")) {  // 1.8: the chosen set is the one the plan trains with
    p.checkpoint_choice = checkpoint_choice_from(root.at("checkpoint_choice"));
    const std::string trains = p.checkpoint ? p.checkpoint->rule : "none";
    if (p.checkpoint_choice->chosen != trains) {
      throw SchemaError("$.checkpoint_choice.chosen: '" + cut_for_message(p.checkpoint_choice->chosen) +
                        "' but the plan trains with " + (p.checkpoint ? "checkpoint.rule '" + cut_for_message(trains) + "'"
                                                                       : std::string("no checkpoint ('none')")));
    }
  }
  if (root.has("sharding")) {  // 1.9: for the plan's ranks
    p.sharding = sharding_from(root.at("sharding"), true);
    if (p.sharding->world_size != p.world_size) {
      throw SchemaError("$.sharding.world_size: " + std::to_string(p.sharding->world_size) + " but the plan's world_size is " +
                        std::to_string(p.world_size));
    }
    // The plan's peaks are the windows' of its profile: they must have held the same share.
    const std::optional<Sharding>& held = p.profile.sharding;
    if (!held || held->per_rank_state_bytes != p.sharding->per_rank_state_bytes || held->measured_rank != p.sharding->measured_rank) {
      throw SchemaError(std::string("$.sharding: the plan shards the optimizer state, but ") +
                        (held ? "$.profile.sharding holds other shares" : "$.profile.sharding is absent") +
                        ": its windows did not hold the share it plans for; re-plan it");
    }
  }
  if (root.has("ranks")) p.ranks = ranks_from(root.at("ranks"));  // 1.13
  check_plan_window(p);
  return p;
}

Profile read_profile_file(const std::string& path, const std::string& what) {
  const json doc = read_json_file(path, what);
  try {
    // A plan's profile: what a plan made on a rank's own device measured there, confirmations included.
    if (doc.is_object() && doc.contains("schema") && doc["schema"] == kPlanSchema) return plan_from_json(doc).profile;
    return profile_from_json(doc);
  } catch (const SchemaError& e) {
    throw SchemaError(what + " '" + path_for_message(path) + "': " + e.what());
  }
}

Plan plan_from_text(const std::string& text, const std::string& where, std::string* stated_version) {
  const json doc = parse_json_text(text, where);
  if (stated_version) {
    const auto v = doc.is_object() ? doc.find("schema_version") : doc.end();
    *stated_version = v != doc.end() && v->is_string() ? v->get<std::string>() : "";
  }
  try {
    return plan_from_json(doc);
  } catch (const SchemaError& e) {
    throw SchemaError(where + ": " + e.what());
  }
}

Plan read_plan_file(const std::string& path, const std::string& what) {
  return plan_from_text(read_text_file(path, what), what + " '" + path_for_message(path) + "'");
}

namespace {

ojson window_record_json(const RunWindowRecord& r) {
  ojson j{{"window", r.window},
               {"samples", r.samples},
               {"valid_tokens", r.valid_tokens},
               {"loss", opt(r.loss)},
               {"peak_bytes", opt(r.peak_bytes)},
               {"reserved_peak_bytes", opt(r.reserved_peak_bytes)},
               {"oom_recoveries", r.oom_recoveries},
               {"replans", r.replans.value_or(0)},
               {"microbatch_sizes", r.microbatch_sizes},
               {"stepped", r.stepped},
               {"seconds", r.seconds.value_or(0.0)}};
  if (r.microbatch_seconds) j["microbatch_seconds"] = *r.microbatch_seconds;  // 1.5
  if (r.microbatch_seconds || r.predicted_seconds) j["predicted_seconds"] = opt(r.predicted_seconds);
  if (r.predicted_peak_bytes) j["predicted_peak_bytes"] = *r.predicted_peak_bytes;
  return j;
}

// Ranges a run's figures can have: counts up to 2^40 (kMaxSamples), bytes up to kMaxBytes,
// seconds finite and not negative. A report drawn from anything else would mislead.
constexpr IntRange kCount{0, kMaxSamples};
constexpr IntRange kSize{1, kMaxSamples};
constexpr IntRange kBytes{0, kMaxBytes};
constexpr RealRange kSeconds{0.0, 1e12};

std::vector<int64_t> sizes_from(const JsonField& f) {
  std::vector<int64_t> sizes;
  for (const JsonField& n : f.items()) sizes.push_back(n.as_int(kSize));
  return sizes;
}

RunWindowRecord window_record_from(const JsonField& f) {
  RunWindowRecord r;
  r.window = f.i64("window", kCount);
  r.samples = f.i64("samples", kCount);
  r.valid_tokens = f.opt_i64("valid_tokens", kCount).value_or(0);
  r.loss = f.opt_f64("loss");
  r.peak_bytes = f.opt_i64("peak_bytes", kBytes);
  r.reserved_peak_bytes = f.opt_i64("reserved_peak_bytes", kBytes);
  r.oom_recoveries = f.i64("oom_recoveries", kCount);
  r.replans = f.opt_i64("replans", kCount);
  if (f.has("microbatch_sizes")) {
    r.microbatch_sizes = sizes_from(f.at("microbatch_sizes"));
    if (r.microbatch_sizes.empty()) throw SchemaError(f.path() + ".microbatch_sizes: a window ran at least one microbatch");
  }
  if (f.has("stepped")) r.stepped = f.boolean("stepped");
  r.seconds = f.opt_f64("seconds", kSeconds);
  r.microbatch_seconds = f.opt_f64("microbatch_seconds", kSeconds);  // 1.5
  r.predicted_seconds = f.opt_f64("predicted_seconds", kSeconds);
  r.predicted_peak_bytes = f.opt_i64("predicted_peak_bytes", kBytes);
  return r;
}

ojson eval_record_json(const RunEvalRecord& e) {
  return ojson{{"after_window", e.after_window},
               {"samples", e.samples},
               {"units", e.units},
               {"loss", opt(e.loss)},
               {"microbatch_sizes", e.microbatch_sizes},
               {"oom_recoveries", e.oom_recoveries},
               {"peak_bytes", opt(e.peak_bytes)},
               {"seconds", e.seconds}};
}

RunEvalRecord eval_record_from(const JsonField& f) {
  RunEvalRecord e;
  e.after_window = f.i64("after_window", kCount);
  e.samples = f.i64("samples", kCount);
  e.units = f.i64("units", kCount);
  e.loss = f.opt_f64("loss");
  e.microbatch_sizes = sizes_from(f.at("microbatch_sizes"));
  e.oom_recoveries = f.i64("oom_recoveries", kCount);
  e.peak_bytes = f.opt_i64("peak_bytes", kBytes);
  e.seconds = f.f64("seconds", kSeconds);
  return e;
}

// $.time_model (1.5): errors are relative, finite and not negative.
RunTimeModel time_model_from(const JsonField& f) {
  static constexpr RealRange kError{0.0, 1e12};
  RunTimeModel t;
  t.packing = f.one_of("packing", {"time", "fill"});
  t.microbatches = f.i64("microbatches", kCount);
  t.median_abs_error = f.f64("median_abs_error", kError);
  t.p90_abs_error = f.f64("p90_abs_error", kError);
  t.refits = f.i64("refits", kCount);
  t.final_cost = step_cost_from(f, "final_cost");
  return t;
}

}  // namespace

ojson to_json(const RunRecord& r) {
  ojson j = document_header(kRunStatsSchema);
  j["windows"] = r.windows;
  j["optimizer_steps"] = r.optimizer_steps;
  j["skipped_steps"] = r.skipped_steps;
  j["samples_seen"] = r.samples_seen;
  j["tokens_seen"] = r.tokens_seen;
  j["oom_recoveries"] = r.oom_recoveries;
  j["microbatch_sizes"] = r.microbatch_sizes;
  j["micro_batch"] = opt(r.micro_batch);
  j["accumulation_steps"] = r.accumulation_steps;
  j["per_rank_batch"] = r.per_rank_batch;
  j["world_size"] = r.world_size;
  j["rank"] = r.rank;
  j["backend"] = r.backend;
  j["striding"] = r.striding;
  j["collectives"] = {{"counter_all_reduces", r.collectives.counter_all_reduces},
                      {"gradient_exchanges", r.collectives.gradient_exchanges},
                      {"tensor_all_reduces", r.collectives.tensor_all_reduces},
                      {"parameter_broadcasts", r.collectives.parameter_broadcasts}};  // 1.9
  j["replicas_identical"] = r.replicas_identical;
  j["normalization"] = r.normalization;
  j["amp"] = r.amp;
  j["measured_peak_bytes"] = opt(r.measured_peak_bytes);
  // A caching allocator's reserved peak, reported beside the allocated one the plan predicts.
  // Absent where the probe has none.
  if (r.measured_reserved_peak_bytes) j["measured_reserved_peak_bytes"] = *r.measured_reserved_peak_bytes;
  j["predicted_peak_bytes"] = r.predicted_peak_bytes;
  j["final_predicted_peak_bytes"] = opt(r.final_predicted_peak_bytes);
  j["budget_bytes"] = opt(r.budget_bytes);
  j["host_data_bytes"] = r.host_data_bytes;
  j["probe"] = r.probe;
  j["mean_window_seconds"] = r.mean_window_seconds.value_or(0.0);
  j["final_loss"] = opt(r.final_loss);
  j["loss_scale"] = r.loss_scale;
  j["model_sha256"] = r.model_sha256;
  j["model_hash_matches_plan"] = r.model_hash_matches_plan;
  if (r.packed_predicted_peak_bytes) j["packed_predicted_peak_bytes"] = *r.packed_predicted_peak_bytes;  // 1.5
  if (r.time_model) {  // 1.5, packed runs
    const RunTimeModel& t = *r.time_model;
    j["time_model"] = ojson{{"packing", t.packing},
                            {"microbatches", t.microbatches},
                            {"median_abs_error", t.median_abs_error},
                            {"p90_abs_error", t.p90_abs_error},
                            {"refits", t.refits}};
    if (t.final_cost) j["time_model"]["final_cost"] = step_cost_json(*t.final_cost, true);
  }
  // One record per window, in order.
  ojson series = ojson::array();
  for (const auto& w : r.window_series) series.push_back(window_record_json(w));
  j["window_series"] = std::move(series);
  if (!r.evaluations.empty()) {  // 1.7, --eval-data
    ojson evals = ojson::array();
    for (const auto& e : r.evaluations) evals.push_back(eval_record_json(e));
    j["evaluations"] = std::move(evals);
  }
  return j;
}

RunRecord run_record_from_json(const json& doc) {
  const JsonField root(doc, "$");
  const std::string schema = root.str("schema");
  if (schema != kRunStatsSchema) {
    throw SchemaError("$.schema: expected \"accumplan.run_stats\" (what `accumplan run --stats` writes), found \"" +
                      cut_for_message(schema) + "\"");
  }
  if (root.has("schema_version")) check_version(root, kRunStatsSchema);
  RunRecord r;
  r.windows = root.i64("windows", kCount);
  r.optimizer_steps = root.opt_i64("optimizer_steps").value_or(0);
  r.skipped_steps = root.opt_i64("skipped_steps").value_or(0);
  r.samples_seen = root.opt_i64("samples_seen").value_or(0);
  r.tokens_seen = root.opt_i64("tokens_seen").value_or(0);
  r.oom_recoveries = root.i64("oom_recoveries", kCount);
  r.microbatch_sizes = sizes_from(root.at("microbatch_sizes"));
  if (r.microbatch_sizes.empty()) throw SchemaError("$.microbatch_sizes: a run has at least one microbatch");
  r.micro_batch = root.opt_i64("micro_batch");
  r.accumulation_steps = root.opt_i64("accumulation_steps").value_or(static_cast<int64_t>(r.microbatch_sizes.size()));
  r.per_rank_batch = root.opt_i64("per_rank_batch").value_or(0);
  r.world_size = root.opt_i64("world_size").value_or(1);
  r.rank = root.opt_i64("rank").value_or(0);
  if (root.has("backend")) r.backend = root.str("backend");
  if (root.has("sharding")) r.striding = root.str("sharding");  // 1.11 and earlier
  if (root.has("striding")) r.striding = root.str("striding");  // 1.12
  if (root.has("collectives")) {
    const JsonField c = root.at("collectives");
    r.collectives = {c.i64("counter_all_reduces"), c.i64("gradient_exchanges"), c.i64("tensor_all_reduces"),
                     c.opt_i64("parameter_broadcasts").value_or(0)};
  }
  if (root.has("replicas_identical")) r.replicas_identical = root.boolean("replicas_identical");
  if (root.has("normalization")) r.normalization = root.str("normalization");
  if (root.has("amp")) r.amp = root.str("amp");
  r.measured_peak_bytes = root.opt_i64("measured_peak_bytes", kBytes);
  r.measured_reserved_peak_bytes = root.opt_i64("measured_reserved_peak_bytes", kBytes);
  r.predicted_peak_bytes = root.i64("predicted_peak_bytes", kBytes);
  r.final_predicted_peak_bytes = root.opt_i64("final_predicted_peak_bytes", kBytes);
  r.budget_bytes = root.opt_i64("budget_bytes", kBytes);
  r.host_data_bytes = root.opt_i64("host_data_bytes", kBytes).value_or(0);
  if (root.has("probe")) r.probe = root.str("probe");
  r.mean_window_seconds = root.opt_f64("mean_window_seconds", kSeconds);
  r.final_loss = root.opt_f64("final_loss");
  r.loss_scale = root.opt_f64("loss_scale").value_or(1.0);
  if (root.has("model_sha256")) r.model_sha256 = root.str("model_sha256");
  if (root.has("model_hash_matches_plan")) r.model_hash_matches_plan = root.boolean("model_hash_matches_plan");
  if (root.has("time_model")) r.time_model = time_model_from(root.at("time_model"));
  r.packed_predicted_peak_bytes = root.opt_i64("packed_predicted_peak_bytes", kBytes);
  if (root.has("window_series")) {
    for (const JsonField& f : root.at("window_series").items()) {
      r.window_series.push_back(window_record_from(f));
      // Windows in order from 0, as the run wrote them.
      if (r.window_series.back().window != static_cast<int64_t>(r.window_series.size()) - 1) {
        throw SchemaError(f.path() + ".window: " + std::to_string(r.window_series.back().window) + ", expected " +
                          std::to_string(r.window_series.size() - 1) + " (windows are numbered in order from 0)");
      }
    }
    // The run writes one record per window it ran.
    if (static_cast<int64_t>(r.window_series.size()) != r.windows) {
      throw SchemaError("$.window_series: " + std::to_string(r.window_series.size()) + " records for the " +
                        std::to_string(r.windows) + " windows the run says it ran ($.windows)");
    }
  }
  if (root.has("evaluations")) {  // 1.7
    for (const JsonField& f : root.at("evaluations").items()) r.evaluations.push_back(eval_record_from(f));
  }
  return r;
}

}  // namespace accumplan
