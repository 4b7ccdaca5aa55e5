// exporters.cpp — trainer settings from a plan: the target list and the dispatch. See exporters.h
// and docs/exports.md.
//
// What it is: the table of export targets, in the order `--to` lists them (the name list, the
// messages and the dispatch all read it), and export_plan, which refuses before any text is made
// (export/common.cpp) and then hands the plan to the target's Exporter.
// What it is not: any target's format (export/<target>.cpp) or the rules targets share
// (export/common.cpp, which also holds uniform_slowdown, nearest_even_targets and
// check_lightning_datamodule).
#include "accumplan/exporters.h"

#include "export/common.h"

namespace accumplan {
namespace {

// One row per target, so a target cannot be listed and fall through to another's writer.
const std::vector<const exporting::Exporter*>& exporter_table() {
  static const std::vector<const exporting::Exporter*> table = {
      &exporting::deepspeed_exporter(), &exporting::accelerate_exporter(), &exporting::accelerate_config_exporter(),
      &exporting::lightning_exporter(), &exporting::hf_exporter(),         &exporting::torchrun_exporter(),
  };
  return table;
}

const exporting::Exporter* find_exporter(const std::string& name) {
  for (const exporting::Exporter* e : exporter_table()) {
    if (name == e->name()) return e;
  }
  return nullptr;
}

}  // namespace

const std::vector<std::string>& export_targets() {
  static const std::vector<std::string> targets = [] {
    std::vector<std::string> names;
    for (const exporting::Exporter* e : exporter_table()) names.emplace_back(e->name());
    return names;
  }();
  return targets;
}

std::string export_plan(const Plan& plan, const std::string& target, std::string* note, const ExportOptions& options) {
  const exporting::Exporter* exporter = find_exporter(target);
  exporting::check_exportable(plan, exporter, target, options);  // refuses an unknown target
  if (note) note->clear();
  return exporter->render(plan, options, note);
}

}  // namespace accumplan
