// Exports to trainer settings: the uniform split in each trainer's own shape, the departure from
// the plan written inside the output, and a refusal (exit 2) for a uniform split predicted more
// than 25% slower. tests/python/test_exports.py parses the same outputs with the consumers.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "accumplan/errors.h"
#include "accumplan/exporters.h"
#include "accumplan/setup_rules.h"
#include "accumplan/solver.h"
#include "test_helpers.h"

using namespace accumplan;
using accumplan::test::MiB;
using nlohmann::json;

namespace {

// m_max = `fits` samples exactly (1 MiB per sample, no headroom).
Plan plan_for(int64_t target, int64_t world, int64_t fits, bool timed = false) {
  Profile p = accumplan::test::linear_profile(MiB, MiB, MiB);
  p.gradient_exchange = world > 1;  // windows for W ranks make a rank's exchange
  if (timed) {  // 10 ms + 1 ms per sample: a microbatch's fixed cost is what many small ones pay for
    for (auto& pt : p.points) pt.step_seconds = 0.010 + 0.001 * static_cast<double>(pt.micro_batch);
  }
  PlanRequest r;
  r.target_batch = target;
  r.world_size = world;
  r.headroom = parse_headroom("0");
  r.budget.bytes = p.persistent.total() + MiB + fits * MiB;
  return make_plan(p, r);
}

std::string body_without_comments(const std::string& text) {
  std::string out, line;
  std::istringstream in(text);
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != '#') out += line + "\n";
  }
  return out;
}
}  // namespace

TEST_CASE("Exporters: DeepSpeed gets batch, micro batch per GPU and accumulation, and says what it departs from",
          "[export]") {
  std::string note;
  const Plan plan = plan_for(256, 1, 60);  // [52,51,51,51,51]; uniform 8 x 32
  const json ds = json::parse(export_plan(plan, "deepspeed", &note, ExportOptions{"p.json", "accumplan", true}));
  CHECK(ds["train_batch_size"] == 256);
  CHECK(ds["train_micro_batch_size_per_gpu"] == 32);
  CHECK(ds["gradient_accumulation_steps"] == 8);
  CHECK(ds["accumplan"]["departs_from_plan"] == true);
  CHECK(ds["accumplan"]["plan_microbatch_sizes"] == json::array({52, 51, 51, 51, 51}));
  CHECK(ds["accumplan"]["note"].get<std::string>().find("uniform split 8 x 32") != std::string::npos);
  CHECK(note.find("[52,51,51,51,51]") != std::string::npos);
}

TEST_CASE("Exporters: every trainer's batch arithmetic reaches the target with W ranks", "[export]") {
  const Plan plan = plan_for(256, 2, 64);  // T = 128, m_max 64: 2 x 64, uniform too
  std::string note = "stale";
  const json hf = json::parse(export_plan(plan, "hf", &note));
  CHECK(note.empty());
  CHECK(hf["TrainingArguments"]["per_device_train_batch_size"].get<int64_t>() *
            hf["TrainingArguments"]["gradient_accumulation_steps"].get<int64_t>() * 2 ==
        256);
  CHECK(hf["launch"] == "torchrun --nnodes=1 --nproc_per_node=2 YOUR_SCRIPT.py");
  CHECK(hf["accumplan"]["departs_from_plan"] == false);
  const json acc = json::parse(export_plan(plan, "accelerate", &note));
  CHECK(acc["Accelerator"]["gradient_accumulation_steps"] == 2);
  CHECK(acc["DataLoader"] == json{{"batch_size", 64}});
  CHECK(acc["launch"] == "accelerate launch --config_file accelerate_config.yaml YOUR_SCRIPT.py");
  CHECK(export_plan(plan, "accelerate-config", &note).find("\nnum_processes: 2\n") != std::string::npos);
  const std::string pl = export_plan(plan, "lightning", &note);
  const std::string body = body_without_comments(pl);
  CHECK(body.find("  devices: 2\n  num_nodes: 1\n") != std::string::npos);
  CHECK(body.find("  accumulate_grad_batches: 2\n") != std::string::npos);
  CHECK(body.find("data:\n  batch_size: 64") != std::string::npos);
  CHECK(pl.find("NOTE") == std::string::npos);
}

TEST_CASE("Exporters: the eval batch in each trainer's terms, absent without plan.eval", "[export][eval]") {
  Plan plan = plan_for(256, 2, 64);
  std::string note;
  CHECK_FALSE(json::parse(export_plan(plan, "hf", &note))["TrainingArguments"].contains("per_device_eval_batch_size"));
  CHECK(export_plan(plan, "lightning", &note).find("eval_batch_size") == std::string::npos);
  EvalPlan e;
  e.micro_batch = 320;
  e.confirmed = true;
  plan.eval = e;
  CHECK(json::parse(export_plan(plan, "hf", &note))["TrainingArguments"]["per_device_eval_batch_size"] == 320);
  const json ds = json::parse(export_plan(plan, "deepspeed", &note));
  CHECK(ds["accumplan"]["eval_micro_batch"] == 320);
  CHECK(note.find("evaluate in microbatches of 320 per device") != std::string::npos);
  CHECK(note.find("DeepSpeed's config has no evaluation batch") != std::string::npos);
  const json acc = json::parse(export_plan(plan, "accelerate", &note));
  CHECK(acc["EvalDataLoader"] == json{{"batch_size", 320}});
  CHECK(note.find("Accelerate has no setting for it") != std::string::npos);
  const std::string pl = export_plan(plan, "lightning", &note);
  CHECK(pl.find("\n  eval_batch_size: 320  #") > pl.find("\ndata:\n  batch_size: 64"));
  ExportOptions dm{"p.json", "accumplan", false};
  dm.lightning_datamodule = "my.DataModule";
  CHECK(export_plan(plan, "lightning", &note, dm).find("  init_args:\n    batch_size: 64\n    eval_batch_size: 320") !=
        std::string::npos);
}

TEST_CASE("Exporters: checkpointing in each trainer's terms, torchrun refused", "[export][checkpoint]") {
  Plan plan = plan_for(256, 2, 64);
  PlanCheckpoint c;
  for (int i = 0; i < 4; ++i) c.candidates.push_back({"layers." + std::to_string(i), 1e6, 1e-3});
  c.modules = {"layers.1", "layers.3"};
  c.rule = "every 2nd block";
  plan.checkpoint = c;
  std::string note;
  json hf = json::parse(export_plan(plan, "hf", &note));
  CHECK_FALSE(hf["TrainingArguments"].contains("gradient_checkpointing"));  // not every layer
  CHECK(note.find("activation checkpointing (every 2nd block: layers.1, layers.3)") != std::string::npos);
  CHECK(note.find("leave it off") != std::string::npos);
  plan.checkpoint->modules = {"layers.0", "layers.1", "layers.2", "layers.3"};
  hf = json::parse(export_plan(plan, "hf", &note));  // every layer, a model not recorded (a 1.7 plan): the flag, said
  CHECK(hf["TrainingArguments"]["gradient_checkpointing"] == true);
  CHECK(note.find("this plan does not record whether the model is one") != std::string::npos);
  plan.model.hf_gradient_checkpointing = false;
  hf = json::parse(export_plan(plan, "hf", &note));  // every layer, of a model that is not a transformers one
  CHECK_FALSE(hf["TrainingArguments"].contains("gradient_checkpointing"));
  CHECK(note.find("plan.apply_checkpointing(model)") != std::string::npos);
  CHECK(note.find("works only on a transformers model (gradient_checkpointing_enable), which this one is not") !=
        std::string::npos);
  CHECK(hf["accumplan"]["notes"].dump().find("plan.apply_checkpointing(model)") != std::string::npos);
  plan.model.hf_gradient_checkpointing = true;
  hf = json::parse(export_plan(plan, "hf", &note));
  CHECK(hf["TrainingArguments"]["gradient_checkpointing"] == true);
  CHECK(hf["TrainingArguments"]["gradient_checkpointing_kwargs"] == json{{"use_reentrant", false}});
  for (const char* to : {"deepspeed", "accelerate", "lightning"}) {
    INFO(to);
    export_plan(plan, to, &note);
    CHECK(note.find("plan.apply_checkpointing(model)") != std::string::npos);
  }
  CHECK_THROWS_WITH(export_plan(plan, "torchrun", &note), Catch::Contains("cannot apply the plan's activation checkpointing"));
}

TEST_CASE("Exporters: plan text with control characters stays inside its comment and out of the note's lines",
          "[export][checkpoint][errors]") {
  Plan plan = plan_for(256, 2, 64);
  PlanCheckpoint c;
  const std::string evil = std::string("layers.1\nevil: true\x1b[2J") + '\0' + "x\xE2\x80\xA8" "evil: 2\xC2\x85" "evil: 3";
  c.candidates = {{evil, 1e6, 1e-3}, {"layers.2", 1e6, 1e-3}};
  c.modules = {evil};
  c.rule = "rule\r\nrule_key: 1";
  plan.checkpoint = c;
  for (const char* to : {"lightning", "accelerate-config"}) {
    INFO(to);
    std::string note;
    const std::string text = export_plan(plan, to, &note);
    for (const std::string& out : {text, note}) {
      CHECK(out.find("\nevil: true") == std::string::npos);
      CHECK(out.find("\nrule_key") == std::string::npos);
      CHECK(std::none_of(out.begin(), out.end(), [](char ch) { return (ch >= 0 && ch < 0x20 && ch != '\n') || ch == 0x7f; }));
      CHECK(out.find("\xE2\x80\xA8") == std::string::npos);  // YAML's other line breaks end a comment too
      CHECK(out.find("\xC2\x85") == std::string::npos);
    }
    CHECK(text.find("# NOTE: the plan trains with activation checkpointing (rule??rule_key: 1: layers.1?evil: true?[2J?x?evil: 2?evil: 3)") !=
          std::string::npos);
  }
}

TEST_CASE("Exporters: every listed target has its own writer, and an unlisted one is refused", "[export]") {
  // One table owns the names and the writers: a name added to the list cannot fall through to
  // another target's writer (an added name once exported Lightning silently).
  const Plan plan = plan_for(256, 2, 64);
  std::set<std::string> outputs;
  for (const std::string& target : export_targets()) {
    std::string note;
    INFO(target);
    outputs.insert(export_plan(plan, target, &note, ExportOptions{"p.json", "accumplan", true}));
  }
  CHECK(outputs.size() == export_targets().size());
  CHECK(export_targets() ==
        std::vector<std::string>{"deepspeed", "accelerate", "accelerate-config", "lightning", "hf", "torchrun"});
  CHECK_THROWS_WITH(export_plan(plan, "lightning2", nullptr),
                    "--to 'lightning2' is not a known trainer; choose one of: deepspeed, accelerate, "
                    "accelerate-config, lightning, hf, torchrun");
}

TEST_CASE("Exporters: torchrun is a full command line with spellings 1.13 and 2.x accept", "[export]") {
  Plan plan = plan_for(256, 2, 60);
  plan.model.path = "models/my model.pt";
  std::string note;
  const std::string text = export_plan(plan, "torchrun", &note, ExportOptions{"plan.json", "build/accumplan", false});
  CHECK(note.empty());  // accumplan runs the balanced plan itself
  CHECK(body_without_comments(text) ==
        "torchrun --nnodes=1 --nproc_per_node=2 --redirects=1 --tee=1 --no_python build/accumplan run --plan "
        "plan.json --model "
        "'models/my model.pt'\n");
  CHECK(text.find("--nproc-per-node") == std::string::npos);
}

TEST_CASE("Exporters: torchrun of a plan measured in Python names the TorchScript file to pass, and why",
          "[export]") {
  Plan plan = plan_for(256, 2, 60);
  plan.model.path = std::string(kPythonModelPrefix) + "TinyLM";
  const std::string text = export_plan(plan, "torchrun", nullptr, ExportOptions{"plan.json", "accumplan", false});
  CHECK(body_without_comments(text) ==
        "torchrun --nnodes=1 --nproc_per_node=2 --redirects=1 --tee=1 --no_python accumplan run --plan plan.json "
        "--model TinyLM.pt\n");
  CHECK_THAT(text, Catch::Contains("measured in Python on the module TinyLM") &&
                       Catch::Contains("torch.jit.script(model).save(\"TinyLM.pt\")") &&
                       Catch::Contains("accumplan --model TinyLM.pt"));
  CHECK(text.find("python:") == std::string::npos);
}

TEST_CASE("Exporters: a uniform split predicted more than 25% slower is refused, naming even targets", "[export][errors]") {
  // 251 with m_max 36: the plan is 7 microbatches (36 x 6 + 35); 251 is prime, so the uniform
  // split is 251 x 1.
  for (bool timed : {false, true}) {
    const Plan plan = plan_for(251, 1, 36, timed);
    REQUIRE(plan.accumulation_steps == 7);
    REQUIRE(plan.uniform.accumulation_steps == 251);
    bool by_time = !timed;
    CHECK(uniform_slowdown(plan, &by_time) > 1.25);
    CHECK(by_time == timed);
    CHECK(nearest_even_targets(plan) == std::pair<int64_t, int64_t>{245, 252});
    for (const char* to : {"deepspeed", "hf", "accelerate", "lightning"}) {
      CHECK_THROWS_AS(export_plan(plan, to, nullptr), InfeasibleError);
      CHECK_THROWS_WITH(export_plan(plan, to, nullptr), Catch::Contains("252 (7 x 36) or 245 (7 x 35)") &&
                                                           Catch::Contains("--allow-slow"));
    }
    CHECK_NOTHROW(export_plan(plan, "torchrun", nullptr));  // accumplan runs the plan as it is
    ExportOptions allow;
    allow.allow_slow = true;
    const json ds = json::parse(export_plan(plan, "deepspeed", nullptr, allow));
    CHECK(ds["gradient_accumulation_steps"] == 251);
    CHECK(ds["accumplan"]["predicted_slowdown"].get<double>() > 1.25);
    const std::string pl = export_plan(plan, "lightning", nullptr, allow);
    CHECK(pl.find("# NOTE: lightning needs equal microbatches") != std::string::npos);
  }
}

TEST_CASE("Exporters: a small departure is exported, with the prediction inside the output", "[export]") {
  // 256 with m_max 60 and step times: 8 x 32 against 52,51,51,51,51 is a few percent slower.
  const Plan plan = plan_for(256, 1, 60, true);
  bool by_time = false;
  const double slow = uniform_slowdown(plan, &by_time);
  CHECK(by_time);
  CHECK(slow > 1.0);
  CHECK(slow < 1.25);
  const json hf = json::parse(export_plan(plan, "hf", nullptr));
  CHECK(hf["accumplan"]["note"].get<std::string>().find("slower per window by the profile's step times") !=
        std::string::npos);
}

TEST_CASE("Exporters: an unknown trainer lists the known ones", "[export][errors]") {
  CHECK_THROWS_WITH(export_plan(plan_for(256, 1, 60), "keras", nullptr),
                    Catch::Contains("deepspeed, accelerate, accelerate-config, lightning, hf, torchrun"));
}

namespace {

// A plan whose setup every exporter must carry: bf16, AdamW with lr 3e-4 and weight decay 0.01,
// clipping at 1.0, measured on CUDA, 2 ranks, per-token cross-entropy ([B,T] target).
Plan bf16_adamw_clipped_plan() {
  Plan plan = plan_for(256, 2, 64);
  plan.setup.amp = "bf16";
  plan.setup.optimizer = "adamw";
  plan.setup.lr = 3e-4;
  plan.setup.hyperparameters = {{"weight_decay", 0.01}};
  plan.setup.max_grad_norm = 1.0;
  plan.setup.loss = "cross_entropy";
  plan.setup.target = "int64[B,128]:50257";
  plan.device.type = "cuda";
  return plan;
}

std::string yaml_line(const std::string& yaml, const std::string& key) {
  const size_t at = yaml.find("\n" + key + ": ");
  if (at == std::string::npos) return "(no " + key + ")";
  return yaml.substr(at + 1, yaml.find('\n', at + 1) - at - 1);
}

}  // namespace

TEST_CASE("Exporters: DeepSpeed carries bf16, clipping and the optimizer the plan was measured with", "[export]") {
  std::string note;
  const json ds = json::parse(export_plan(bf16_adamw_clipped_plan(), "deepspeed", &note));
  CHECK(ds["bf16"] == json{{"enabled", true}});
  CHECK_FALSE(ds.contains("fp16"));
  CHECK(ds["gradient_clipping"] == 1.0);
  CHECK(ds["optimizer"]["type"] == "AdamW");
  const json& p = ds["optimizer"]["params"];
  CHECK(p["lr"] == 3e-4);
  CHECK(p["betas"] == json::array({0.9, 0.999}));
  CHECK(p["eps"] == 1e-8);
  CHECK(p["weight_decay"] == 0.01);
  CHECK(p["torch_adam"] == true);  // torch.optim.AdamW's update, as measured, not DeepSpeed's fused one
  CHECK(p["adam_w_mode"] == true);
  // Per-token weighting across microbatches and ranks: DeepSpeed cannot; the file and stderr say so.
  CHECK(ds["accumplan"]["notes"].dump().find("valid tokens over all ranks") != std::string::npos);
  CHECK(note.find("DeepSpeed divides each microbatch's loss by gradient_accumulation_steps") != std::string::npos);
}

TEST_CASE("Exporters: Hugging Face gets precision, clipping, optimizer and per-token averaging by name", "[export]") {
  std::string note;
  const json hf = json::parse(export_plan(bf16_adamw_clipped_plan(), "hf", &note));
  const json& a = hf["TrainingArguments"];
  CHECK(a["bf16"] == true);
  CHECK(a["fp16"] == false);
  CHECK(a["max_grad_norm"] == 1.0);
  CHECK(a["learning_rate"] == 3e-4);
  CHECK(a["weight_decay"] == 0.01);
  CHECK(a["optim"] == "adamw_torch");
  CHECK(a["adam_beta1"] == 0.9);
  CHECK(a["adam_beta2"] == 0.999);
  CHECK(a["adam_epsilon"] == 1e-8);
  CHECK(a["use_cpu"] == false);
  CHECK(a["average_tokens_across_devices"] == true);
  CHECK(hf["optimizer"]["class"] == "torch.optim.AdamW");
  CHECK(note.find("undecayed") != std::string::npos);  // Trainer's own AdamW skips biases and LayerNorm
  // Without clipping in the plan, Trainer's default of 1.0 must be switched off.
  Plan unclipped = bf16_adamw_clipped_plan();
  unclipped.setup.max_grad_norm.reset();
  CHECK(json::parse(export_plan(unclipped, "hf", nullptr))["TrainingArguments"]["max_grad_norm"] == 0.0);
  // Momentum SGD has no TrainingArguments spelling: said, with the exact optimizer beside it.
  Plan momentum = plan_for(256, 1, 256);
  momentum.setup.optimizer = "momentum";
  const json m = json::parse(export_plan(momentum, "hf", &note));
  CHECK(m["TrainingArguments"]["optim"] == "sgd");
  CHECK(m["optimizer"]["kwargs"]["momentum"] == 0.9);
  CHECK(note.find("Trainer's optim \"sgd\" cannot set momentum=0.9") != std::string::npos);
  // Adagrad's lr_decay, which TrainingArguments cannot carry, is named with its value.
  Plan adagrad = plan_for(256, 1, 256);
  adagrad.setup.optimizer = "adagrad";
  adagrad.setup.hyperparameters = {{"lr_decay", 0.5}};
  CHECK(json::parse(export_plan(adagrad, "hf", &note))["TrainingArguments"]["optim"] == "adagrad");
  CHECK(note.find("cannot set lr_decay=0.5") != std::string::npos);
}

TEST_CASE("Exporters: torch's betas carry beta1 and beta2 in the place of beta1, the one grouping rule", "[export]") {
  CHECK(torch_grouped_members("betas") == std::vector<std::string>{"beta1", "beta2"});
  CHECK_THROWS_AS(torch_grouped_members("momentum"), InternalError);
  std::vector<std::string> adam;
  for (const TorchKeyword& k : torch_keywords(optimizer_info("adam"))) adam.push_back(k.keyword);
  CHECK(adam == std::vector<std::string>{"betas", "eps", "weight_decay"});
  for (const TorchKeyword& k : torch_keywords(optimizer_info("momentum"))) CHECK(k.members == std::vector<std::string>{k.keyword});
  Plan p = plan_for(256, 1, 256);
  p.setup.optimizer = "adamw";
  p.setup.hyperparameters = {{"beta1", 0.8}, {"beta2", 0.95}};
  const json kwargs = json::parse(export_plan(p, "accelerate", nullptr))["optimizer"]["kwargs"];
  CHECK(kwargs["betas"] == json::array({0.8, 0.95}));
  CHECK_FALSE(kwargs.contains("beta1"));
}

TEST_CASE("Exporters: every optimizer of the table exports torch.optim's class with each hyperparameter", "[export]") {
  for (const OptimizerInfo& row : optimizer_table()) {
    Plan p = plan_for(256, 1, 256);
    p.setup.optimizer = row.name;
    p.setup.lr = 0.25;
    CAPTURE(row.name);
    const json acc = json::parse(export_plan(p, "accelerate", nullptr));
    CHECK(acc["optimizer"]["class"] == "torch.optim." + row.torch_class);
    const json& kwargs = acc["optimizer"]["kwargs"];
    CHECK(kwargs["lr"] == 0.25);
    std::map<std::string, double> defaults;
    for (const OptimizerHyperparameter& h : row.hyperparameters) defaults[h.name] = h.plan_default;
    size_t written = 0;
    for (const TorchKeyword& k : torch_keywords(row)) {
      for (size_t i = 0; i < k.members.size(); ++i, ++written) {
        CHECK((k.members.size() == 1 ? kwargs[k.keyword] : kwargs[k.keyword][i]) == defaults.at(k.members[i]));
      }
    }
    CHECK(written == row.hyperparameters.size());
    for (const auto& [key, value] : row.torch_fixed) CHECK(kwargs[key] == value);
    // Trainer names it by its own word, or the export says it has none (never another optimizer's).
    if (row.hf_optim.empty()) {
      CHECK_THROWS_WITH(export_plan(p, "hf", nullptr), Catch::Contains("Trainer has no optim for"));
    } else {
      CHECK(json::parse(export_plan(p, "hf", nullptr))["TrainingArguments"]["optim"] == row.hf_optim);
    }
  }
}

TEST_CASE("Exporters: Lightning gets precision, clipping, accelerator and a LightningCLI optimizer", "[export]") {
  const std::string pl = export_plan(bf16_adamw_clipped_plan(), "lightning", nullptr);
  CHECK(pl.find("  accelerator: gpu\n") != std::string::npos);
  CHECK(pl.find("  precision: bf16-mixed\n") != std::string::npos);
  CHECK(pl.find("  gradient_clip_val: 1.0\n  gradient_clip_algorithm: norm\n") != std::string::npos);
  CHECK(pl.find("optimizer:\n  class_path: torch.optim.AdamW\n  init_args:\n    lr: 0.0003\n") != std::string::npos);
  CHECK(pl.find("    weight_decay: 0.01\n") != std::string::npos);
  CHECK(pl.find("# NOTE: this plan weights every valid token") != std::string::npos);
  ExportOptions with_module;
  with_module.lightning_datamodule = "my_project.data.TextDataModule";
  const std::string sub = export_plan(bf16_adamw_clipped_plan(), "lightning", nullptr, with_module);
  CHECK(sub.find("data:\n  class_path: my_project.data.TextDataModule\n  init_args:\n    batch_size: 64\n") !=
        std::string::npos);
  for (const char* bad : {"1data.Module", "my..Module", "my.Module.", "", "a-b.C"}) {
    if (std::string(bad).empty()) continue;  // empty: no data module, allowed
    ExportOptions o;
    o.lightning_datamodule = bad;
    CHECK_THROWS_WITH(export_plan(bf16_adamw_clipped_plan(), "lightning", nullptr, o),
                      Catch::Contains("is not a Python class path"));
  }
  with_module.lightning_datamodule = "m.D";
  CHECK_THROWS_WITH(export_plan(bf16_adamw_clipped_plan(), "hf", nullptr, with_module),
                    Catch::Contains("--lightning-datamodule is for --to lightning"));
}

TEST_CASE("Exporters: Accelerate gets mixed precision, the optimizer, clipping and its own config file", "[export]") {
  std::string note;
  const json acc = json::parse(export_plan(bf16_adamw_clipped_plan(), "accelerate", &note));
  CHECK(acc["Accelerator"] == json{{"gradient_accumulation_steps", 2}, {"mixed_precision", "bf16"}, {"cpu", false}});
  CHECK(acc["optimizer"]["class"] == "torch.optim.AdamW");
  CHECK(acc["clip_grad_norm"]["max_norm"] == 1.0);
  CHECK(note.find("accelerator.clip_grad_norm_") != std::string::npos);
  CHECK(note.find("accelerator.gather(count)") != std::string::npos);
  const std::string yaml = export_plan(bf16_adamw_clipped_plan(), "accelerate-config", nullptr);
  CHECK(yaml_line(yaml, "distributed_type") == "distributed_type: MULTI_GPU");
  CHECK(yaml_line(yaml, "mixed_precision") == "mixed_precision: bf16");
  CHECK(yaml_line(yaml, "num_processes") == "num_processes: 2");
  CHECK(yaml_line(yaml, "use_cpu") == "use_cpu: false");
  // One process on the CPU, no autocast: 'NO' and 'no' quoted, since YAML reads a bare NO as false.
  const std::string cpu = export_plan(plan_for(256, 1, 256), "accelerate-config", nullptr);
  CHECK(yaml_line(cpu, "distributed_type") == "distributed_type: 'NO'");
  CHECK(yaml_line(cpu, "mixed_precision") == "mixed_precision: 'no'");
  CHECK(yaml_line(cpu, "use_cpu") == "use_cpu: true");
}

TEST_CASE("Exporters: a per-sample plan needs no loss note; every optimizer has a torch.optim class", "[export]") {
  for (const char* opt : {"sgd", "momentum", "adam", "adamw", "adagrad", "rmsprop"}) {
    INFO(opt);
    Plan plan = plan_for(256, 1, 256);
    plan.setup.optimizer = opt;
    plan.setup.lr = 0.01;
    std::string note;
    const json hf = json::parse(export_plan(plan, "hf", &note));
    CHECK(hf["optimizer"]["class"].get<std::string>().rfind("torch.optim.", 0) == 0);
    CHECK(hf["optimizer"]["kwargs"]["lr"] == 0.01);
    CHECK(note.find("valid token") == std::string::npos);
    const json ds = json::parse(export_plan(plan, "deepspeed", nullptr));
    json params = ds["optimizer"]["params"];  // the same keyword arguments, DeepSpeed's Adam switches aside
    params.erase("torch_adam");
    params.erase("adam_w_mode");
    CHECK(params == hf["optimizer"]["kwargs"]);
  }
}

// ---- Every optimizer value is carried in the trainer's terms, or the export is refused
// naming it (allow_lossy writes it anyway, the loss named inside the output).
namespace {

Plan nesterov_sgd_plan() {
  Plan plan = plan_for(256, 1, 256);
  plan.setup.optimizer = "momentum";
  plan.setup.lr = 0.01;
  plan.setup.hyperparameters = {{"momentum", 0.9}, {"dampening", 0.0}, {"weight_decay", 0.0}};
  plan.setup.flags = {{"nesterov", true}};
  return plan;
}

Plan amsgrad_adamw_plan() {
  Plan plan = plan_for(256, 1, 256);
  plan.setup.optimizer = "adamw";
  plan.setup.lr = 1e-3;
  plan.setup.hyperparameters = {{"weight_decay", 0.05}};
  plan.setup.flags = {{"amsgrad", true}};
  return plan;
}

// Two SGD groups, lr 0.01 and `second_lr` (0.1 by default: different values, which the exports refuse).
Plan two_group_plan(double second_lr = 0.1) {
  Plan plan = plan_for(256, 1, 256);
  plan.setup.optimizer = "sgd";
  plan.setup.lr = 0.01;
  plan.setup.hyperparameters = {{"weight_decay", 0.0}, {"dampening", 0.0}};
  plan.setup.param_groups = {OptimizerGroup{0.01, plan.setup.hyperparameters, {}, 100},
                             OptimizerGroup{second_lr, plan.setup.hyperparameters, {}, 10}};
  return plan;
}

}  // namespace

TEST_CASE("Exporters: nesterov and amsgrad reach every trainer's optimizer", "[export][optimizer]") {
  for (const Plan& plan : {nesterov_sgd_plan(), amsgrad_adamw_plan()}) {
    const std::string flag = plan.setup.optimizer == "momentum" ? "nesterov" : "amsgrad";
    INFO(flag);
    std::string note;
    const json ds = json::parse(export_plan(plan, "deepspeed", nullptr));
    CHECK(ds["optimizer"]["params"][flag] == true);
    const json hf = json::parse(export_plan(plan, "hf", &note));
    CHECK(hf["optimizer"]["kwargs"][flag] == true);
    // TrainingArguments' `optim` has no spelling for it: said, pointing at the exact optimizer.
    CHECK(note.find("Trainer's optim cannot say " + flag + "=true") != std::string::npos);
    CHECK(note.find("optimizer_cls_and_kwargs") != std::string::npos);
    const json acc = json::parse(export_plan(plan, "accelerate", nullptr));
    CHECK(acc["optimizer"]["kwargs"][flag] == true);
    CHECK(export_plan(plan, "lightning", nullptr).find("\n    " + flag + ": true\n") != std::string::npos);
  }
  // Hugging Face has a name of its own for torch's fused AdamW.
  Plan fused = amsgrad_adamw_plan();
  fused.setup.flags = {{"fused", true}};
  std::string note;
  CHECK(json::parse(export_plan(fused, "hf", &note))["TrainingArguments"]["optim"] == "adamw_torch_fused");
  CHECK(note.find("cannot say") == std::string::npos);
}

TEST_CASE("Exporters: parameter groups with different values are refused, naming them and the fix",
          "[export][optimizer][errors]") {
  const Plan plan = two_group_plan();
  CHECK_THROWS_WITH(export_plan(plan, "hf", nullptr),
                    "the Hugging Face Trainer export cannot carry 2 parameter groups (lr 0.01, 0.1): its optimizer "
                    "takes one set of values for every parameter; pass --allow-lossy to write the first group's "
                    "values anyway");
  for (const char* to : {"deepspeed", "accelerate", "lightning"}) {
    INFO(to);
    CHECK_THROWS_WITH(export_plan(plan, to, nullptr), Catch::Contains("cannot carry 2 parameter groups (lr 0.01, 0.1)"));
  }
  // torchrun launches accumplan run, which cannot run them either; allow_lossy does not change that.
  ExportOptions lossy;
  lossy.allow_lossy = true;
  CHECK_THROWS_WITH(export_plan(plan, "torchrun", nullptr, lossy),
                    Catch::Contains("accumplan run, which cannot run the plan's 2 parameter groups (lr 0.01, 0.1)"));
  // The accelerate-config file carries no optimizer: nothing to lose.
  CHECK_NOTHROW(export_plan(plan, "accelerate-config", nullptr));
  // Python names its own argument.
  ExportOptions python;
  python.names.allow_lossy = "allow_lossy=True";
  CHECK_THROWS_WITH(export_plan(plan, "deepspeed", nullptr, python), Catch::Contains("pass allow_lossy=True"));
}

TEST_CASE("Exporters: allow_lossy writes the first group's values and names the loss inside the output",
          "[export][optimizer]") {
  const Plan plan = two_group_plan();
  ExportOptions lossy;
  lossy.allow_lossy = true;
  for (const char* to : {"deepspeed", "hf", "accelerate"}) {
    INFO(to);
    std::string note;
    const json j = json::parse(export_plan(plan, to, &note, lossy));
    REQUIRE(j["accumplan"]["lossy"].size() == 1);
    CHECK(j["accumplan"]["lossy"][0].get<std::string>().find("2 parameter groups (lr 0.01, 0.1)") != std::string::npos);
    CHECK(note.rfind("lossy: the plan's optimizer has 2 parameter groups", 0) == 0);
  }
  const std::string pl = export_plan(plan, "lightning", nullptr, lossy);
  CHECK(pl.find("# LOSSY: the plan's optimizer has 2 parameter groups (lr 0.01, 0.1)") != std::string::npos);
  CHECK(pl.find("    lr: 0.01\n") != std::string::npos);
  // Without a loss, no "lossy" key: outputs of plans that carry everything stay as they were.
  CHECK_FALSE(json::parse(export_plan(nesterov_sgd_plan(), "deepspeed", nullptr, lossy))["accumplan"].contains("lossy"));
}

TEST_CASE("Exporters: groups that hold the same values export as one", "[export][optimizer]") {
  const Plan same = two_group_plan(0.01);
  const json ds = json::parse(export_plan(same, "deepspeed", nullptr));
  CHECK(ds["optimizer"]["params"]["lr"] == 0.01);
  CHECK_FALSE(ds["accumplan"].contains("lossy"));
  CHECK_NOTHROW(export_plan(same, "torchrun", nullptr));
}

TEST_CASE("Exporters: torchrun refuses what accumplan run cannot run and notes implementation flags",
          "[export][optimizer]") {
  Plan maximize = nesterov_sgd_plan();
  maximize.setup.flags["maximize"] = true;
  CHECK_THROWS_WITH(export_plan(maximize, "torchrun", nullptr), Catch::Contains("cannot run the plan's maximize=true"));
  // The trainers build torch.optim, which has maximize: carried.
  CHECK(json::parse(export_plan(maximize, "deepspeed", nullptr))["optimizer"]["params"]["maximize"] == true);
  Plan fused = amsgrad_adamw_plan();
  fused.setup.flags["foreach"] = false;
  const std::string line = export_plan(fused, "torchrun", nullptr);
  CHECK(line.find("# NOTE: accumplan run computes the optimizer's foreach=false as LibTorch's one implementation") !=
        std::string::npos);
  // A flag the optimizer does not take is refused, naming those it takes.
  Plan wrong = amsgrad_adamw_plan();
  wrong.setup.flags = {{"nesterov", true}};
  CHECK_THROWS_WITH(export_plan(wrong, "lightning", nullptr),
                    Catch::Contains("optimizer adamw has no flag 'nesterov'; it takes: amsgrad, maximize"));
}
