// planner/src/export/common.h — what every export target shares (internal to the planner).
//
// What it is: the one Exporter interface each target implements (its `--to` name, how messages
// name it, what it refuses of its own, its render), and the rules all targets follow: what an
// export refuses before any text is made (check_exportable, the slow uniform split, optimizer
// values a trainer cannot carry), the plan's training settings in torch.optim's terms, and the
// notes, comments and provenance written inside each output.
// What it is not: any one trainer's format (export/<target>.cpp), nor the target list and the
// dispatch (exporters.cpp), nor the public API (accumplan/exporters.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "accumplan/exporters.h"
#include "accumplan/schema.h"

namespace accumplan::exporting {

using ojson = nlohmann::ordered_json;

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

// Each trainer target: the uniform split (u per rank, k microbatches), the plan's training
// settings and `notes` (what the target cannot express; each goes inside the output and to stderr).
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

// One export target. The name list, the messages and the dispatch all read the table of these
// (exporters.cpp), so a target cannot be listed and fall through to another's writer.
class Exporter {
 public:
  virtual ~Exporter() = default;
  virtual const char* name() const = 0;     // what `--to` takes
  virtual const char* trainer() const = 0;  // how a message names the trainer
  // Launches accumplan run on the plan as it is (balanced split, token windows), not a trainer.
  virtual bool runs_plan_itself() const { return false; }
  // Takes a LightningDataModule's class path (ExportOptions::lightning_datamodule).
  virtual bool takes_datamodule() const { return false; }
  // The text, after check_exportable passed and `note` was cleared; refusals of its own first.
  virtual std::string render(const Plan& plan, const ExportOptions& options, std::string* note) const = 0;
};

// A trainer given the plan's uniform split: render reads the training settings, refuses or notes
// what the trainer cannot carry, then calls write with the notes so far.
class TrainerExporter : public Exporter {
 public:
  std::string render(const Plan& plan, const ExportOptions& options, std::string* note) const final;
  // Writes the optimizer (false: a launcher config, which has nothing of it to lose).
  virtual bool carries_optimizer() const { return true; }
  // Says the plan's activation checkpointing in its own terms (else the shared note is added).
  virtual bool says_checkpointing() const { return false; }
  // The output; adds to c.notes what it cannot express.
  virtual std::string write(ExportContext& c) const = 0;
};

// Each target's one instance (export/<target>.cpp).
const Exporter& deepspeed_exporter();
const Exporter& accelerate_exporter();
const Exporter& accelerate_config_exporter();
const Exporter& lightning_exporter();
const Exporter& hf_exporter();
const Exporter& torchrun_exporter();

// ---- Refusals, all before any text is made.

// An unknown target (`exporter` null) or data module, a shell value that cannot be printed safely,
// a uniform split that does not make the target, windows cut by tokens for a trainer that cuts
// them by samples: InputError.
void check_exportable(const Plan& plan, const Exporter* exporter, const std::string& target,
                      const ExportOptions& options);

// The departure from the plan in one sentence (empty when none), or InfeasibleError when the
// uniform split is predicted more than 25% slower and the caller did not allow it.
std::string departure_or_refusal(const Plan& plan, const std::string& target, const ExportOptions& options,
                                 double* slowdown_out);

// What the export cannot carry of the plan's optimizer, one clause each; InputError naming it and
// the fix unless the caller allows a lossy export.
std::vector<std::string> optimizer_losses(const Training& t, const TrainerExporter& exporter,
                                          const ExportOptions& options);

// ---- The plan's training settings.

// The plan's setup through setup_rules; InputError naming the options to re-plan with.
Training training_of(const Plan& plan);

// The plan's optimizer as torch.optim's class and keyword arguments: what every trainer that
// takes a class (Lightning's class_path, Trainer's optimizer_cls_and_kwargs) builds exactly.
std::pair<std::string, ojson> torch_optimizer(const Training& t);

// The trainer's word for the plan's autocast mode (none, bf16, fp16).
std::string precision_name(const std::string& amp, const char* none, const char* bf16, const char* fp16);

// The evaluation batch (plan.eval, 1.7): 0 when the plan has none.
int64_t eval_micro_batch(const Plan& plan);

// Every candidate checkpointed: what a model's own gradient_checkpointing_enable() does.
bool checkpoints_every_candidate(const PlanCheckpoint& cp);

// The optimizer state sharded over the ranks is DeepSpeed's ZeRO stage 1 (each rank updates and
// holds its partition's state); gradients and parameters stay whole on every rank, as planned.
ojson zero_stage_1();

// ---- Notes, comments and provenance.

// What a trainer that scales each microbatch's mean loss by 1/k and averages gradients over the
// W ranks loses on a per-token plan, and the loss that restores it; empty for a per-sample plan.
std::string per_token_note(const Training& t, const std::string& trainer, const std::string& how_it_scales);

// What the eval batch is, for the notes of tools with no key for it; empty without plan.eval.
std::string eval_note(const Plan& plan, const std::string& where);

// The plan's activation checkpointing, for a trainer that cannot say it: which modules, and the
// wrapper that applies it.
std::string checkpoint_note(const PlanCheckpoint& cp);

// Plan text for a YAML comment or a note line: one_line's rule, and YAML's other line breaks
// (NEL, U+2028, U+2029) shown as '?' too.
std::string comment_text(const std::string& text);

// The "accumplan" object: provenance, notes, and (only when written anyway) what was lost.
ojson about_of(const ExportContext& c);

// The export target chosen as the front end spells it: `--to NAME`, or Python's to="NAME".
std::string to_target(const std::string& name);

// 'path' for a shell, quoted only when it needs to be.
std::string shell_quote(const std::string& s);

// "k x u".
std::string split_text(int64_t k, int64_t u);

}  // namespace accumplan::exporting
