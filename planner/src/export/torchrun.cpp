// planner/src/export/torchrun.cpp — the torchrun export: a command line launching `accumplan run`.
//
// What it is: comment lines (the plan's window, sharding, what to add, implementation flags, the
// TorchScript file a Python-measured plan needs) and one torchrun line with spellings torchrun
// 1.13 and 2.x both accept. accumplan runs the plan itself, balanced split and all: nothing departs
// from it, so there are no notes; it refuses what accumplan run cannot run.
// What it is not: a trainer's config (the other targets), nor a launcher: nothing is run.
#include "common.h"

#include <sstream>

#include "accumplan/errors.h"
#include "accumplan/setup_rules.h"
#include "accumplan/units.h"

namespace accumplan::exporting {
namespace {

class TorchrunExporter final : public Exporter {
 public:
  const char* name() const override { return "torchrun"; }
  const char* trainer() const override { return "torchrun"; }
  bool runs_plan_itself() const override { return true; }
  std::string render(const Plan& plan, const ExportOptions& options, std::string* note) const override;
};

// InputError naming what of the plan's optimizer LibTorch cannot run (libtorch_cannot_run, the
// rule accumplan run refuses by), with or without allow_lossy: written anyway, the line would
// only launch that refusal.
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

// The first comment line: the window accumplan run trains, per rank.
std::string torchrun_window(const Plan& plan) {
  std::ostringstream s;
  if (plan.tokens && plan.tokens->target_tokens) {
    s << "windows of at least " << *plan.tokens->target_tokens << " valid tokens over " << plan.world_size << " rank(s)";
  } else if (!plan.ranks.empty()) {
    s << plan.target_batch << " samples per step over " << plan.world_size << " ranks that differ (plan.ranks):";
    for (size_t r = 0; r < plan.ranks.size(); ++r) {
      s << (r ? ";" : "") << " rank " << r << " takes " << plan.ranks[r].per_rank_batch << " as ["
        << join_sizes(plan.ranks[r].microbatch_sizes, 8) << "] under " << format_bytes(plan.ranks[r].budget_bytes);
    }
    return s.str() + "\n";
  } else {
    s << plan.target_batch << " samples per step = " << plan.world_size << " rank(s) x " << plan.per_rank_batch;
  }
  if (plan.tokens) {
    s << ", each window packed under a token budget of " << plan.tokens->token_budget
      << " padded tokens (sequences up to " << plan.tokens->max_seq_len << ")\n";
  } else {
    s << ", microbatches [" << join_sizes(plan.microbatch_sizes) << "] per rank\n";
  }
  return s.str();
}

std::string TorchrunExporter::render(const Plan& plan, const ExportOptions& options, std::string*) const {
  if (plan.checkpoint) {
    throw InputError(to_target("torchrun") + " launches `accumplan run`, which cannot apply the plan's activation checkpointing "
                     "(a TorchScript model); export to a Python trainer (hf, lightning, accelerate, deepspeed) or "
                     "train with accumplan's plan.train_window");
  }
  check_torchrun_optimizer(plan);
  const int64_t W = plan.world_size;
  std::ostringstream s;
  s << "# accumplan export torchrun: " << torchrun_window(plan);
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

}  // namespace

const Exporter& torchrun_exporter() {
  static const TorchrunExporter exporter;
  return exporter;
}

}  // namespace accumplan::exporting
