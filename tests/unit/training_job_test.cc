// A whole job at the engine boundary: the demo trains, evaluates and exports; bad specs, paths and data fail
// the job with precise statuses; cancellation stops at a step boundary.
#include "engine/runtime/training_job.h"

#include "engine/model/peft_adapter.h"

#include <gtest/gtest.h>

#include <array>
#include <atomic>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>

#include "engine/model/hf_checkpoint.h"
#include "engine/model/safetensors.h"
#include "tests/support/expect_contains.h"
#include "tests/support/fixtures.h"
#include "tests/support/scratch_dir.h"

namespace slide {
namespace {

using testing::ExpectContains;

std::string Demo(const std::string& rel) { return std::string(SLIDE_FIXTURES_DIR) + "/../../deploy/demo/" + rel; }

TrainingJobSpec DemoSpec(const testing::TempDir& out) {
  TrainingJobSpec s;
  s.model_dir = Demo("model");
  s.dataset_path = Demo("train.jsonl");
  s.output_dir = out.File("export");
  s.steps = 40;
  s.batch_size = 16;
  s.micro_batch_size = 8;
  s.seq_len = 32;
  s.sequence_mode = SequenceMode::kTruncate;
  s.lr = 3e-3;
  s.warmup_steps = 4;
  s.eval_fraction = 0.05;
  s.device = DeviceChoice::kCpu;
  return s;
}

TEST(TrainingJob, DemoTrainsEvaluatesAndExports) {
  testing::TempDir out;
  std::vector<TrainingStepEvent> steps;
  std::vector<std::string> logs;
  TrainingCallbacks cb{[&](const std::string& m) { logs.push_back(m); },
                       [&](const TrainingStepEvent& e) { steps.push_back(e); }};
  TrainingResult r = testing::ValueOrDie(RunTrainingJob(DemoSpec(out), {}, cb, nullptr));
  ASSERT_EQ(steps.size(), 40u);
  EXPECT_EQ(steps.back().step, 40);
  EXPECT_EQ(steps.back().total_steps, 40);
  EXPECT_LT(steps.back().loss, 0.5 * steps.front().loss);
  EXPECT_GT(steps.back().tokens_per_second, 0);
  EXPECT_GT(r.eval_loss, 0);
  EXPECT_LT(r.eval_loss, 0.5 * steps.front().loss);
  EXPECT_TRUE(std::filesystem::exists(out.File("export/model.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(out.File("export/tokenizer.json")));
  std::printf("JOB demo loss %.3f -> %.3f, held-out %.3f, %zu log lines\n", steps.front().loss, steps.back().loss,
              r.eval_loss, logs.size());
}

// The export is the trained model: evaluated afresh from its files, its held-out loss is the one the job
// reported (fp32 export: equal to float rounding; bf16 export: within the bf16 rounding of the weights).
TEST(TrainingJob, ExportLoadsBackWithTheJobsHeldOutLoss) {
  testing::TempDir out;
  TrainingJobSpec spec = DemoSpec(out);
  spec.steps = 10;
  spec.export_dtype = ExportDtype::kFp32;
  TrainingResult r = testing::ValueOrDie(RunTrainingJob(spec, {}, {}, nullptr));
  ASSERT_GT(r.eval_loss, 0);
  TrainingJobSpec reload = spec;
  reload.model_dir = r.export_dir;
  const double fp32 = testing::ValueOrDie(EvaluateHeldOutLoss(reload));
  EXPECT_NEAR(fp32, r.eval_loss, 1e-6 * r.eval_loss);

  spec.export_dtype = ExportDtype::kBf16;
  spec.output_dir = out.File("export-bf16");
  r = testing::ValueOrDie(RunTrainingJob(spec, {}, {}, nullptr));
  reload.model_dir = r.export_dir;
  const double bf16 = testing::ValueOrDie(EvaluateHeldOutLoss(reload));
  EXPECT_NEAR(bf16, r.eval_loss, 1e-2 * r.eval_loss);
  std::printf("JOB export reload: held-out %.6f, fp32 export %.6f, bf16 export %.6f\n", r.eval_loss, fp32, bf16);

  reload.eval_fraction = 0;
  EXPECT_EQ(EvaluateHeldOutLoss(reload).status().code(), StatusCode::kFailedPrecondition);
}

// The demo job with adapters (r 8, alpha 16) of `method`, its steps and log captured: it trains (the loss falls) and
// exports the adapter in PEFT's files, not a model.
struct AdapterJobRun {
  TrainingJobSpec spec;
  std::vector<TrainingStepEvent> steps;
  std::string log;
};
AdapterJobRun RunAdapterJob(const testing::TempDir& out, AdapterMethod method) {
  AdapterJobRun run{DemoSpec(out), {}, {}};
  run.spec.adapter = method;
  run.spec.lora.r = 8;
  run.spec.lora.alpha = 16;
  run.spec.lr = 1e-2;
  TrainingCallbacks cb{[&](const std::string& m) { run.log += m + "\n"; },
                       [&](const TrainingStepEvent& e) { run.steps.push_back(e); }};
  testing::ValueOrDie(RunTrainingJob(run.spec, {}, cb, nullptr));
  EXPECT_EQ(run.steps.size(), 40u);
  EXPECT_LT(run.steps.back().loss, 0.8 * run.steps.front().loss);
  EXPECT_TRUE(std::filesystem::exists(out.File("export/adapter_config.json")));
  EXPECT_TRUE(std::filesystem::exists(out.File("export/adapter_model.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(out.File("export/model.safetensors")));
  return run;
}

// `adapter_export: merged` (10 steps, fp32) writes the base with the adapters merged, whose held-out loss evaluated
// afresh from those files is the job's; returns it.
double MergedExportHeldOutLoss(const testing::TempDir& out, TrainingJobSpec spec) {
  spec.steps = 10;
  spec.adapter_export = AdapterExport::kMerged;
  spec.export_dtype = ExportDtype::kFp32;
  spec.output_dir = out.File("merged");
  const TrainingResult r = testing::ValueOrDie(RunTrainingJob(spec, {}, {}, nullptr));
  TrainingJobSpec reload = spec;
  reload.adapter = AdapterMethod::kNone;
  reload.model_dir = r.export_dir;
  const double merged = testing::ValueOrDie(EvaluateHeldOutLoss(reload));
  EXPECT_NEAR(merged, r.eval_loss, 1e-5 * r.eval_loss);
  return merged;
}

// A LoRA job trains adapters over the frozen demo model and exports them in PEFT's files (read back as PEFT's), or
// merged into the base.
TEST(TrainingJob, LoraJobTrainsAdaptersAndExportsThem) {
  testing::TempDir out;
  const AdapterJobRun run = RunAdapterJob(out, AdapterMethod::kLora);
  const ModelConfig cfg = testing::ValueOrDie(LoadHfConfig(run.spec.model_dir));
  PeftAdapter exported = testing::ValueOrDie(LoadPeftAdapter(out.File("export"), cfg));
  EXPECT_EQ(exported.lora.r, 8);
  EXPECT_EQ(exported.lora.alpha, 16);
  ExpectContains(run.log, "mode: LoRA r 8, alpha 16");
  const double merged = MergedExportHeldOutLoss(out, run.spec);
  std::printf("JOB lora loss %.3f -> %.3f; merged export held-out %.6f\n", run.steps.front().loss,
              run.steps.back().loss, merged);
}

// A QLoRA job: the demo model's layers quantised to NF4 as they are read; it trains as LoRA does, logs its mode and
// plan, and exports its adapters, or the dequantised base with them merged.
TEST(TrainingJob, QLoraJobTrainsOverAnNf4BaseAndExports) {
  testing::TempDir out;
  const AdapterJobRun run = RunAdapterJob(out, AdapterMethod::kQLora);
  ExpectContains(run.log, "mode: QLoRA (NF4 base, double quantised) r 8, alpha 16");
  ExpectContains(run.log, "frozen base (NF4 layers)");
  ExpectContains(run.log, "NF4 layer load scratch");
  // The same job over the bf16 base starts from nearly the same loss: NF4 moves each weight by at most half a code.
  TrainingJobSpec lora = run.spec;
  lora.adapter = AdapterMethod::kLora;
  lora.steps = 1;
  lora.output_dir = out.File("lora");
  std::vector<TrainingStepEvent> lora_steps;
  testing::ValueOrDie(
      RunTrainingJob(lora, {}, {nullptr, [&](const TrainingStepEvent& e) { lora_steps.push_back(e); }}, nullptr));
  EXPECT_NEAR(run.steps.front().loss, lora_steps.front().loss, 0.05 * lora_steps.front().loss);
  EXPECT_NE(run.steps.front().loss, lora_steps.front().loss);
  const double merged = MergedExportHeldOutLoss(out, run.spec);
  std::printf("JOB qlora loss %.3f -> %.3f (lora's first %.3f); merged export held-out %.6f\n", run.steps.front().loss,
              run.steps.back().loss, lora_steps.front().loss, merged);
}

// A model saved in 4 bits by transformers + bitsandbytes (the demo model, scripts/make_qlora_fixtures.py): a QLoRA
// job trains over its NF4 arrays as stored and exports; full fine-tuning and LoRA are refused at submission.
TEST(TrainingJob, QLoraJobStartsFromACheckpointSavedInFourBits) {
  testing::TempDir out;
  TrainingJobSpec spec = DemoSpec(out);
  spec.model_dir = testing::FixturePath("models/demo-4bit");
  spec.adapter = AdapterMethod::kQLora;
  spec.lora.r = 8;
  spec.lr = 1e-2;
  spec.steps = 20;
  std::vector<TrainingStepEvent> steps;
  TrainingResult r = testing::ValueOrDie(
      RunTrainingJob(spec, {}, {nullptr, [&](const TrainingStepEvent& e) { steps.push_back(e); }}, nullptr));
  ASSERT_EQ(steps.size(), 20u);
  EXPECT_LT(steps.back().loss, 0.9 * steps.front().loss);
  EXPECT_TRUE(std::filesystem::exists(out.File("export/adapter_model.safetensors")));
  for (AdapterMethod other : {AdapterMethod::kNone, AdapterMethod::kLora}) {
    spec.adapter = other;
    const Status st = PlanTrainingJob(spec, {}).status();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
    ExpectContains(st.message(), "is saved in 4 bits by bitsandbytes: it trains with adapter: qlora");
  }
  std::printf("JOB qlora from a 4-bit checkpoint: loss %.3f -> %.3f\n", steps.front().loss, steps.back().loss);
}

// A model whose projections are not whole NF4 blocks is refused at submission, naming the tensor; a QLoRA checkpoint
// is not resumed as LoRA (the adapters were trained against the NF4 base).
TEST(TrainingJob, QLoraRefusalsNameTheCause) {
  testing::TempDir out;
  TrainingJobSpec s = DemoSpec(out);
  s.adapter = AdapterMethod::kQLora;
  const std::string model = out.File("odd-model");
  std::filesystem::create_directories(model);
  for (const auto& e : std::filesystem::directory_iterator(s.model_dir))
    std::filesystem::copy_file(e.path(), model + "/" + e.path().filename().string());
  std::string config;
  {
    std::ifstream in(model + "/config.json");
    config.assign(std::istreambuf_iterator<char>(in), {});
  }
  // Hidden 100 and an MLP of 385: gate_proj holds 38,500 weights (601.5 blocks).
  for (auto [from, to] :
       {std::pair<std::string, std::string>{"\"intermediate_size\": 384", "\"intermediate_size\": 385"},
        {"\"hidden_size\": 128", "\"hidden_size\": 100"}}) {
    ASSERT_NE(config.find(from), std::string::npos) << from;
    config.replace(config.find(from), from.size(), to);
  }
  std::ofstream(model + "/config.json", std::ios::trunc) << config;
  s.model_dir = model;
  const Status st = PlanTrainingJob(s, {}).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  ExpectContains(st.message(),
                 "job field 'adapter' is qlora, but tensor 'model.layers.0.mlp.gate_proj.weight' has 38500 "
                 "elements, not a positive multiple of the NF4 block (64)");

  // A QLoRA job suspended with a checkpoint, then the same job as LoRA over the same checkpoint directory.
  JobEnvironment env;
  TrainingJobSpec q = DemoSpec(out);
  q.adapter = AdapterMethod::kQLora;
  q.lora.r = 4;
  q.steps = 4;
  env.checkpoint_dir = out.File("ckpt");
  std::atomic<bool> suspend{false};
  TrainingCallbacks cb{nullptr, [&](const TrainingStepEvent& e) { suspend = e.step == 2; }};
  ASSERT_TRUE(testing::ValueOrDie(RunTrainingJob(q, env, cb, nullptr, &suspend)).suspended);
  TrainingJobSpec as_lora = q;
  as_lora.adapter = AdapterMethod::kLora;
  auto r = RunTrainingJob(as_lora, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  ExpectContains(r.status().message(), "belongs to a different job");
}

// The demo spec changed by `change` fails validation with INVALID_ARGUMENT, its message containing `part`.
void ExpectSpecRefused(const testing::TempDir& out, const std::function<void(TrainingJobSpec&)>& change,
                       const std::string& part) {
  TrainingJobSpec s = DemoSpec(out);
  change(s);
  Status st = ValidateTrainingJobSpec(s);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << part;
  ExpectContains(st.message(), part);
}

TEST(TrainingJob, BadSpecsNameTheField) {
  testing::TempDir out;
  auto expect = [&](const std::function<void(TrainingJobSpec&)>& change, const std::string& part) {
    ExpectSpecRefused(out, change, part);
  };
  expect([](TrainingJobSpec& s) { s.model_dir = ""; }, "job field 'model_dir' is required");
  expect([](TrainingJobSpec& s) { s.lr = -1; }, "job field 'lr' must be in (0, 1)");
  expect([](TrainingJobSpec& s) { s.micro_batch_size = 5; },
         "job field 'micro_batch_size' must divide batch_size (16)");
  expect([](TrainingJobSpec& s) { s.max_grad_norm = std::numeric_limits<double>::infinity(); },
         "job field 'max_grad_norm' must be a finite number");
  expect([](TrainingJobSpec& s) { s.adam_eps = std::nan(""); }, "job field 'adam_eps' must be a finite number");
  expect(
      [](TrainingJobSpec& s) {
        s.optimizer = OptimizerKind::kAdamW8bit;
        s.nvme_state = TierMode::kMomentsAndMaster;
      },
      "job fields 'optimizer' (adamw_8bit) and 'nvme_state' (moments_and_master) cannot be combined yet");
  auto lora = [](const std::function<void(TrainingJobSpec&)>& change) {
    return [change](TrainingJobSpec& s) {
      s.adapter = AdapterMethod::kLora;
      change(s);
    };
  };
  expect(lora([](TrainingJobSpec& s) { s.lora.r = 0; }), "job field 'lora_r'");
  expect(lora([](TrainingJobSpec& s) { s.lora.dropout = 1; }), "job field 'lora_dropout' must be in [0, 1)");
  expect(lora([](TrainingJobSpec& s) { s.optimizer = OptimizerKind::kAdamW8bit; }),
         "job field 'optimizer' must be adamw with adapter lora");
  expect(lora([](TrainingJobSpec& s) { s.nvme_state = TierMode::kMoments; }), "job field 'nvme_state' must be none");
}

// What only the model can tell (a target module it does not have, r above a projection's smaller dimension) is
// refused when the job is planned, at submission, naming the field; nothing is loaded.
TEST(TrainingJob, LoraSettingsTheModelCannotTakeAreRefusedAtSubmission) {
  testing::TempDir out;
  TrainingJobSpec s = DemoSpec(out);
  s.adapter = AdapterMethod::kLora;
  s.lora.target_modules = {"q_proj", "c_attn"};
  Status st = PlanTrainingJob(s, {}).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  ExpectContains(st.message(), "lora_target_modules: this model has no module \"c_attn\"");
  s.lora.target_modules = {"q_proj"};
  s.lora.r = 4096;  // within lora_r's range, beyond the demo model's dimensions
  st = PlanTrainingJob(s, {}).status();
  ExpectContains(st.message(), "exceeds the smaller dimension of self_attn.q_proj");
  s.lora.r = 4;
  ExpectContains(testing::ValueOrDie(PlanTrainingJob(s, {})), "LoRA adapters");
}

// Sizes that would make the daemon allocate until the OOM killer ends it (batch_size 2^55), or overflow the step
// count (epochs 2^62), are refused before anything is planned; an explicit epochs of 0 or below is an error too.
TEST(TrainingJob, HugeOrNonPositiveSizesAreRefusedByField) {
  testing::TempDir out;
  auto expect = [&](const std::function<void(TrainingJobSpec&)>& change, const std::string& part) {
    ExpectSpecRefused(out, change, part);
  };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (int64_t batch : {int64_t{1} << 55, int64_t{1} << 62, kMax})
    expect([&](TrainingJobSpec& s) { s.batch_size = batch, s.micro_batch_size = 0; },
           "job field 'batch_size' must be in [1, ");
  for (int64_t epochs : {int64_t{0}, int64_t{-2}, int64_t{1} << 62})
    expect([&](TrainingJobSpec& s) { s.epochs = epochs; }, "job field 'epochs' must be in [1, ");
  expect([](TrainingJobSpec& s) { s.steps = int64_t{1} << 62; }, "job field 'steps' must be in [0, ");
  expect([](TrainingJobSpec& s) { s.seq_len = kMax; }, "job field 'seq_len' must be in [2, ");
  expect([](TrainingJobSpec& s) { s.micro_batch_size = -8; },
         "job field 'micro_batch_size' must be in [0, batch_size]");
  expect([](TrainingJobSpec& s) { s.batch_size = 1 << 20, s.micro_batch_size = 1 << 20, s.seq_len = 1 << 20; },
         "tokens per forward");
  expect([](TrainingJobSpec& s) { s.batch_size = 1 << 20, s.micro_batch_size = 1, s.seq_len = 1 << 20; },
         "tokens per step");
  expect([](TrainingJobSpec& s) { s.gpu_budget_bytes = kMax; }, "job field 'gpu_budget_bytes' must be in [0, ");
  expect([](TrainingJobSpec& s) { s.checkpoint_every = kMax; }, "job field 'checkpoint_every' must be in [0, ");
  expect([](TrainingJobSpec& s) { s.warmup_steps = kMax; }, "job field 'warmup_steps' must be in [0, ");
  expect([](TrainingJobSpec& s) { s.log_every = kMax; }, "job field 'log_every' must be in [1, ");
  expect([](TrainingJobSpec& s) { s.window = kMax; }, "job field 'window' must be in [0, ");

  // The largest accepted sizes plan without overflow: every number in the plan (or in its refusal) is positive.
  TrainingJobSpec big = DemoSpec(out);
  big.batch_size = JobSizeLimits::max_batch_size;
  big.micro_batch_size = JobSizeLimits::max_micro_batch_tokens / 1024;
  big.seq_len = 1024;
  big.allow_seq_len_beyond_model = true;
  big.gpu_budget_bytes = JobSizeLimits::max_gpu_budget_bytes;
  ASSERT_TRUE(ValidateTrainingJobSpec(big).ok()) << ValidateTrainingJobSpec(big).ToString();
  auto plan = PlanTrainingJob(big);
  const std::string text = plan.ok() ? plan.value() : plan.status().message();
  EXPECT_TRUE(plan.ok() || plan.status().code() == StatusCode::kResourceExhausted) << plan.status().ToString();
  for (size_t at = text.find('-'); at != std::string::npos; at = text.find('-', at + 1))
    EXPECT_FALSE(at + 1 < text.size() && std::isdigit(static_cast<unsigned char>(text[at + 1]))) << text;
  std::printf("JOB largest accepted sizes plan:\n%s\n", text.c_str());
}

// The export must never land on the job's own inputs.
TEST(TrainingJob, OutputDirOverlappingTheModelOrTheDataIsRefusedNamingBoth) {
  testing::TempDir out;
  auto expect = [&](auto mutate, const std::string& part) {
    TrainingJobSpec s = DemoSpec(out);
    mutate(s);
    Status st = CheckTrainingJobOutput(s);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << part << ": " << st.ToString();
    ExpectContains(st.message(), part);
  };
  expect([](TrainingJobSpec& s) { s.output_dir = s.model_dir; }, "are the same directory");
  expect([](TrainingJobSpec& s) { s.output_dir = s.model_dir + "/sub"; }, "contain one another");
  expect([](TrainingJobSpec& s) { s.output_dir = s.model_dir + "/.."; }, "contain one another");
  expect([](TrainingJobSpec& s) { s.output_dir = s.model_dir + "/../"; }, "job fields 'output_dir'");
  // Through a symlink to the model: the same directory.
  std::filesystem::create_directory_symlink(DemoSpec(out).model_dir, out.File("alias"));
  expect([&](TrainingJobSpec& s) { s.output_dir = out.File("alias"); }, "'model_dir' ('");
  // The dataset's directory.
  expect(
      [&](TrainingJobSpec& s) {
        std::filesystem::copy_file(s.dataset_path, out.File("data.jsonl"));
        s.dataset_path = out.File("data.jsonl");
        s.output_dir = out.path();
      },
      "the output directory is or holds the dataset's directory");
  expect([&](TrainingJobSpec& s) { s.dataset_path = s.model_dir + "/train.jsonl"; },
         "the dataset lies in the model directory");
  // Apart: accepted (the output may sit beside or below the dataset's directory).
  TrainingJobSpec ok = DemoSpec(out);
  EXPECT_TRUE(CheckTrainingJobOutput(ok).ok()) << CheckTrainingJobOutput(ok).ToString();
}

// The output directory is opened once; swapping its path for a symlink to a directory outside the allowed roots
// while the job runs must not move the export there.
TEST(TrainingJob, OutputDirSwappedForASymlinkMidRunIsNotFollowed) {
  JobEnvironment env;  // what the daemon would set
  testing::TempDir root, outside;
  TrainingJobSpec s = DemoSpec(root);
  s.steps = 4;
  s.eval_fraction = 0;
  const std::string model = root.File("model");
  std::filesystem::copy(s.model_dir, model);
  std::filesystem::copy_file(s.dataset_path, root.File("train.jsonl"));
  s.model_dir = model;
  s.dataset_path = root.File("train.jsonl");
  s.output_dir = root.File("out");
  env.allowed_roots = {root.path()};
  bool swapped = false;
  TrainingCallbacks cb;
  cb.on_step = [&](const TrainingStepEvent& e) {
    if (e.step != 2) return;
    std::filesystem::rename(root.File("out"), root.File("out-moved"));
    std::filesystem::create_directory_symlink(outside.path(), root.File("out"));
    swapped = true;
  };
  TrainingResult r = testing::ValueOrDie(RunTrainingJob(s, env, cb, nullptr));
  ASSERT_TRUE(swapped);
  EXPECT_EQ(r.steps, 4);
  EXPECT_FALSE(std::filesystem::exists(outside.File("config.json")));
  EXPECT_FALSE(std::filesystem::exists(outside.File("model.safetensors")));
  EXPECT_TRUE(std::filesystem::exists(root.File("out-moved/model.safetensors")));
}

// The demo model with its weights changed by `change`, written (fp32) to `out`/`name`; its directory.
std::string DemoModelWith(const testing::TempDir& out, const std::string& name,
                          const std::function<void(ModelParams&)>& change) {
  const std::string demo = DemoSpec(out).model_dir;
  const ModelConfig cfg = testing::ValueOrDie(LoadHfConfig(demo));
  ModelParams p = testing::ValueOrDie(LoadHfCheckpoint(demo, cfg, c10::kFloat));
  change(p);
  EXPECT_TRUE(ExportHfCheckpoint(out.File(name), demo, p, {.dtype = c10::kFloat}).ok());
  return out.File(name);
}

// A model whose weights hold NaN is refused while it loads, naming the tensor; nothing is exported.
TEST(TrainingJob, NonFiniteWeightsFailTheJobNamingTheTensor) {
  testing::TempDir out;
  TrainingJobSpec s = DemoSpec(out);
  s.model_dir = DemoModelWith(out, "nan-model", [](ModelParams& p) { p.Param(1, "mlp.down_proj.weight")[0][3] = NAN; });
  auto r = RunTrainingJob(s, {}, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  ExpectContains(r.status().message(), "mlp.down_proj.weight' holds NaN or infinite values");
  EXPECT_FALSE(std::filesystem::exists(out.File("export/model.safetensors")));
}

// Finite weights that overflow in the forward (norm scales near float's maximum) give a non-finite loss: the job
// fails at that step, exports nothing and writes no checkpoint after it.
TEST(TrainingJob, NonFiniteLossFailsTheJobWithoutExporting) {
  JobEnvironment env;  // what the daemon would set
  testing::TempDir out;
  TrainingJobSpec s = DemoSpec(out);
  s.model_dir = DemoModelWith(out, "hot-model", [](ModelParams& p) {
    for (const auto& [name, view] : p.Named())
      if (name.find("norm") != std::string::npos) view.fill_(3e38);
  });
  env.checkpoint_dir = out.File("ckpt");
  s.checkpoint_every = 1;
  int steps = 0;
  TrainingCallbacks cb{nullptr, [&](const TrainingStepEvent&) { ++steps; }};
  auto r = RunTrainingJob(s, env, cb, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  ExpectContains(r.status().message(), "step 1 gave a non-finite");
  EXPECT_EQ(steps, 1);
  EXPECT_FALSE(std::filesystem::exists(out.File("export/model.safetensors")));
  EXPECT_FALSE(std::filesystem::exists(out.File("ckpt/LATEST")));
}

TEST(TrainingJob, BadPathsAndDataFailTheJob) {
  testing::TempDir out;
  TrainingJobSpec s = DemoSpec(out);
  s.model_dir = "/nonexistent/model";
  auto r = RunTrainingJob(s, {}, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  ExpectContains(r.status().message(), "/nonexistent/model/config.json");

  s = DemoSpec(out);
  s.dataset_path = out.File("bad.jsonl");
  std::ofstream(s.dataset_path) << "{\"prompt\": \"x\", \"completion\": \"y\"}\n{oops\n";
  r = RunTrainingJob(s, {}, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  ExpectContains(r.status().message(), "bad.jsonl:2: not valid JSON");

  s = DemoSpec(out);
  s.gpu_budget_bytes = 1 << 16;  // too small for the plan
  r = RunTrainingJob(s, {}, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();

  // A spec that leaves the budget at 0 gets the environment's default: the daemon's setting, not the spec's.
  s = DemoSpec(out);
  ASSERT_EQ(s.gpu_budget_bytes, 0);
  JobEnvironment small;
  small.default_gpu_budget_bytes = 1 << 16;
  r = RunTrainingJob(s, small, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted) << r.status().ToString();
  auto planned = PlanTrainingJob(s, small);
  EXPECT_EQ(planned.status().code(), StatusCode::kResourceExhausted) << planned.status().ToString();
  EXPECT_TRUE(PlanTrainingJob(s, {}).ok());
}

// A messages dataset renders through the model's own template (chat_template: auto, the default): a model without
// one, or a template the engine cannot render, is refused at submission with the reason; with one the job trains.
TEST(TrainingJob, ChatJobsUseTheModelsOwnTemplate) {
  testing::TempDir root;
  TrainingJobSpec s = DemoSpec(root);
  const std::string model = root.File("model");
  std::filesystem::create_directories(model);
  for (const auto& e : std::filesystem::directory_iterator(s.model_dir))
    std::filesystem::copy_file(e.path(), model + "/" + e.path().filename().string());
  s.model_dir = model;
  s.dataset_path = root.File("chat.jsonl");
  {
    std::ofstream data(s.dataset_path);
    for (int i = 0; i < 40; ++i)
      data << R"({"messages": [{"role": "user", "content": "what is )" << i << R"( plus one?"}, )"
           << R"({"role": "assistant", "content": ")" << i + 1 << R"(."}]})"
           << "\n";
  }
  s.dataset_format = DatasetFormat::kMessages;
  s.steps = 4;
  ASSERT_EQ(s.chat_template, ChatTemplateChoice::kAuto);

  auto plan = PlanTrainingJob(s);
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  ExpectContains(plan.status().message(), "job field 'chat_template' is auto, but " + model +
                                              " has no chat template (no chat_template.jinja, no chat_template in");
  ExpectContains(plan.status().message(), "name a built-in one (llama3 or chatml)");

  std::ofstream(model + "/chat_template.jinja") << "{% for m in messages %}\n{{ m.content | shout }}{% endfor %}";
  plan = PlanTrainingJob(s);
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  ExpectContains(plan.status().message(), "chat template " + model +
                                              "/chat_template.jinja, line 2, column 16: filter "
                                              "'shout' is not supported by the template engine");
  // Also where the rendering probe never goes (a tool message): the check reads the whole template.
  std::ofstream(model + "/chat_template.jinja") << "{% for m in messages %}{% if m.role == 'tool' %}\n"
                                                   "{{ m.content | from_json }}{% else %}{{ m.content }}{% endif %}"
                                                   "{% endfor %}";
  plan = PlanTrainingJob(s);
  EXPECT_EQ(plan.status().code(), StatusCode::kInvalidArgument);
  ExpectContains(plan.status().message(), "line 2, column 16: filter 'from_json' is not supported");

  std::ofstream(model + "/chat_template.jinja") << "{{ bos_token }}{% for m in messages %}<|start_header_id|>"
                                                   "{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}"
                                                   "<|eot_id|>{% endfor %}{% if add_generation_prompt %}"
                                                   "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
  EXPECT_TRUE(PlanTrainingJob(s).ok());
  TrainingResult r = testing::ValueOrDie(RunTrainingJob(s, {}, {}, nullptr));
  EXPECT_EQ(r.steps, 4);
  EXPECT_TRUE(std::isfinite(r.final_loss));
}

// A cancel that arrives while the job loads (the daemon's PREPARING state) stops it before any step.
TEST(TrainingJob, CancelWhilePreparingStopsBeforeAnyStep) {
  testing::TempDir out;
  std::atomic<bool> cancel{true};
  int steps = 0;
  TrainingCallbacks cb;
  cb.on_step = [&](const TrainingStepEvent&) { ++steps; };
  auto r = RunTrainingJob(DemoSpec(out), {}, cb, &cancel);
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled) << r.status().ToString();
  ExpectContains(r.status().message(), "cancelled while preparing");
  EXPECT_EQ(steps, 0);
}

// Every file a confined job reads must resolve inside the roots: a tokenizer linked out of them is refused
// without its bytes being read, and an output path that is a file fails before training.
TEST(TrainingJob, ConfinedJobsOpenNothingOutsideTheRoots) {
  JobEnvironment env;  // what the daemon would set
  testing::TempDir root, outside;
  const std::string secret = outside.File("secret");
  std::ofstream(secret) << "TOPSECRET";
  TrainingJobSpec s = DemoSpec(root);
  const std::string model = root.File("model");
  std::filesystem::create_directories(model);
  for (const auto& e : std::filesystem::directory_iterator(s.model_dir))
    std::filesystem::copy_file(e.path(), model + "/" + e.path().filename().string());
  std::filesystem::remove(model + "/tokenizer.json");
  std::filesystem::create_symlink(secret, model + "/tokenizer.json");
  std::filesystem::copy_file(s.dataset_path, root.File("train.jsonl"));
  s.model_dir = model;
  s.dataset_path = root.File("train.jsonl");
  env.allowed_roots = {root.path()};
  auto r = RunTrainingJob(s, env, {}, nullptr);  // refused before anything is read
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
  ExpectContains(r.status().message(), model + "/tokenizer.json' (resolved to '" + secret);
  EXPECT_EQ(r.status().message().find("TOPSECRET"), std::string::npos);

  // The weights are opened while the job loads: refused at open.
  std::filesystem::remove(model + "/tokenizer.json");
  std::filesystem::copy_file(DemoSpec(root).model_dir + "/tokenizer.json", model + "/tokenizer.json");
  std::filesystem::copy_file(model + "/model.safetensors", outside.File("model.safetensors"));
  std::filesystem::remove(model + "/model.safetensors");
  std::filesystem::create_symlink(outside.File("model.safetensors"), model + "/model.safetensors");
  r = RunTrainingJob(s, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kPermissionDenied) << r.status().ToString();
  ExpectContains(r.status().message(), model + "/model.safetensors: resolves to '" + outside.File("model.safetensors"));
  std::filesystem::remove(model + "/tokenizer.json");
  std::filesystem::create_symlink(secret, model + "/tokenizer.json");

  env.allowed_roots.clear();  // unconfined, the same link is read (and is not a tokenizer)
  r = RunTrainingJob(s, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();

  s = DemoSpec(root);
  s.output_dir = secret;  // a file
  r = RunTrainingJob(s, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << r.status().ToString();
  ExpectContains(r.status().message(), "exists and is not a directory");
}

TEST(TrainingJob, CancelStopsAtAStepBoundary) {
  testing::TempDir out;
  std::atomic<bool> cancel{false};
  int seen = 0;
  TrainingCallbacks cb{nullptr, [&](const TrainingStepEvent& e) {
                         if (++seen == 3) cancel = true;
                       }};
  auto r = RunTrainingJob(DemoSpec(out), {}, cb, &cancel);
  EXPECT_EQ(r.status().code(), StatusCode::kCancelled);
  EXPECT_EQ(r.status().message(), "cancelled at step 3");
  EXPECT_FALSE(std::filesystem::exists(out.File("export/model.safetensors")));
}

// Suspend (checkpoint at a step boundary) and run again: the resumed steps are bit-identical to an
// uninterrupted run (CPU fp32: same data order, same optimizer state, same LR). Each of the three runs keeps its
// optimizer state where `nvme_state[run]` says (host memory, or the NVMe tier in a scratch directory: every
// unit's state, or with `nvme_layers` the last layers').
void ExpectExactResume(const std::array<TierMode, 3>& nvme_state, int64_t nvme_layers = -1,
                       OptimizerKind optimizer = OptimizerKind::kAdamW,
                       const std::function<void(TrainingJobSpec&)>& change = {}) {
  JobEnvironment env;  // what the daemon would set
  testing::TempDir out;
  TrainingJobSpec spec = DemoSpec(out);
  spec.steps = 8;
  spec.optimizer = optimizer;
  if (change) change(spec);
  ScratchDir nvme_dir;
  env.nvme.io.dirs = {nvme_dir.path()};
  env.nvme.chunk_bytes = 64 << 10;  // several chunks per unit of the demo model
  auto place = [&](TierMode mode) {
    spec.nvme_state = mode;
    spec.nvme_layers = mode == TierMode::kNone ? -1 : nvme_layers;
  };
  place(nvme_state[0]);
  std::vector<double> straight;
  TrainingCallbacks record{nullptr, [&](const TrainingStepEvent& e) { straight.push_back(e.loss); }};
  testing::ValueOrDie(RunTrainingJob(spec, env, record, nullptr));
  ASSERT_EQ(straight.size(), 8u);

  env.checkpoint_dir = out.File("ckpt");
  spec.checkpoint_every = 2;
  std::atomic<bool> suspend{false};
  std::vector<std::pair<int64_t, double>> first, second;
  TrainingCallbacks cb1{nullptr, [&](const TrainingStepEvent& e) {
                          first.emplace_back(e.step, e.loss);
                          if (e.step == 5) suspend = true;
                        }};
  place(nvme_state[1]);
  TrainingResult r1 = testing::ValueOrDie(RunTrainingJob(spec, env, cb1, nullptr, &suspend));
  EXPECT_TRUE(r1.suspended);
  EXPECT_EQ(r1.steps, 5);
  EXPECT_FALSE(std::filesystem::exists(out.File("export/model.safetensors.tmp")));
  std::ifstream latest(out.File("ckpt/LATEST"));
  std::string name;
  latest >> name;
  EXPECT_EQ(name, "step-00000005");  // the suspend checkpoint replaced the one at step 4
  EXPECT_FALSE(std::filesystem::exists(out.File("ckpt/step-00000004")));

  TrainingCallbacks cb2{nullptr, [&](const TrainingStepEvent& e) { second.emplace_back(e.step, e.loss); }};
  place(nvme_state[2]);
  TrainingResult r2 = testing::ValueOrDie(RunTrainingJob(spec, env, cb2, nullptr));
  EXPECT_EQ(r2.resumed_from, 5);
  EXPECT_EQ(r2.steps, 8);
  ASSERT_EQ(second.size(), 3u);
  for (size_t i = 0; i < first.size(); ++i) EXPECT_EQ(first[i].second, straight[i]) << "step " << first[i].first;
  for (size_t i = 0; i < second.size(); ++i) {
    EXPECT_EQ(second[i].first, int64_t(6 + i));
    EXPECT_EQ(second[i].second, straight[5 + i]) << "step " << second[i].first;  // bit-identical
  }
  EXPECT_TRUE(nvme_dir.Files().empty());  // the tier's files go with the job
}

TEST(TrainingJob, ResumesExactlyFromItsCheckpoint) {
  ExpectExactResume({TierMode::kNone, TierMode::kNone, TierMode::kNone});
}

// Checkpoints of a job whose state is on the NVMe tier hold the state read back from disk, and a job resumes
// onto the tier from them, whichever tier wrote them.
TEST(TrainingJob, ResumesExactlyWithStateOnNvme) {
  ExpectExactResume({TierMode::kNone, TierMode::kMomentsAndMaster, TierMode::kMomentsAndMaster});
  ExpectExactResume({TierMode::kMoments, TierMode::kMomentsAndMaster, TierMode::kNone});
}

TEST(TrainingJob, ResumesExactlyWithTheLastLayersOnNvme) {
  ExpectExactResume({TierMode::kMoments, TierMode::kMomentsAndMaster, TierMode::kNone}, 1);
  ExpectExactResume({TierMode::kNone, TierMode::kMoments, TierMode::kMomentsAndMaster}, 1);
  ExpectExactResume({TierMode::kMoments, TierMode::kNone, TierMode::kMomentsAndMaster}, 0);  // the planner's pick
}

// LoRA: the checkpoint holds the adapters' master and moments (the frozen base is the model directory's), and the
// resumed job draws the same dropout masks.
TEST(TrainingJob, ResumesExactlyWithLoraAdapters) {
  ExpectExactResume({TierMode::kNone, TierMode::kNone, TierMode::kNone}, -1, OptimizerKind::kAdamW,
                    [](TrainingJobSpec& s) {
                      s.adapter = AdapterMethod::kLora;
                      s.lora.r = 4;
                      s.lora.dropout = 0.1;
                    });
}

// QLoRA: the same, the base quantised afresh from the model directory on resume (the same bytes every time).
TEST(TrainingJob, ResumesExactlyWithQLoraAdapters) {
  ExpectExactResume({TierMode::kNone, TierMode::kNone, TierMode::kNone}, -1, OptimizerKind::kAdamW,
                    [](TrainingJobSpec& s) {
                      s.adapter = AdapterMethod::kQLora;
                      s.lora.r = 4;
                    });
}

// 8-bit moments: the checkpoint holds their bytes (codes, block absmax, the small parameters' fp32 moments).
TEST(TrainingJob, ResumesExactlyWithEightBitMoments) {
  ExpectExactResume({TierMode::kNone, TierMode::kNone, TierMode::kNone}, -1, OptimizerKind::kAdamW8bit);
  // and onto and off the NVMe tier, which holds them whole
  ExpectExactResume({TierMode::kNone, TierMode::kMoments, TierMode::kNone}, -1, OptimizerKind::kAdamW8bit);
  ExpectExactResume({TierMode::kMoments, TierMode::kNone, TierMode::kMoments}, 1, OptimizerKind::kAdamW8bit);
}

// nvme_layers 0: the planner tiers the fewest last layers with which the rest fits the host; the demo model fits any
// host, so one layer, and the job's log says so.
TEST(TrainingJob, NvmeLayersZeroTiersTheFewestThatFit) {
  JobEnvironment env;  // what the daemon would set
  testing::TempDir out;
  ScratchDir nvme_dir;
  TrainingJobSpec spec = DemoSpec(out);
  spec.steps = 2;
  env.nvme.io.dirs = {nvme_dir.path()};
  spec.nvme_state = TierMode::kMoments;
  spec.nvme_layers = 0;
  std::string log;
  TrainingCallbacks cb{[&](const std::string& line) { log += line + "\n"; }, nullptr};
  const TrainingResult r = testing::ValueOrDie(RunTrainingJob(spec, env, cb, nullptr));
  EXPECT_EQ(r.steps, 2);
  ExpectContains(log, "moments of the last 1 layers on NVMe");
  ExpectContains(log, "NVMe (the last 1 layers)");
}

// nvme_layers is a count of layers on the tier (0: the planner's pick): it needs the tier, and is at least 0 and at
// most the model's layer count; each mistake fails the job with the field named, before any step.
TEST(TrainingJob, NvmeLayersAreCheckedAgainstTheTierAndTheModel) {
  JobEnvironment env;  // what the daemon would set
  testing::TempDir out;
  ScratchDir nvme_dir;
  TrainingJobSpec spec = DemoSpec(out);
  env.nvme.io.dirs = {nvme_dir.path()};
  spec.nvme_layers = 1;
  auto r = RunTrainingJob(spec, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  ExpectContains(r.status().message(), "'nvme_layers' needs nvme_state");
  spec.nvme_state = TierMode::kMoments;
  spec.nvme_layers = -2;
  r = RunTrainingJob(spec, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  ExpectContains(r.status().message(), "'nvme_layers' must be >= 1");
  spec.nvme_layers = 1000;
  int steps = 0;
  r = RunTrainingJob(spec, env, {nullptr, [&](const TrainingStepEvent&) { ++steps; }}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  ExpectContains(r.status().message(), "'nvme_layers' (1000) exceeds the model's");
  EXPECT_EQ(steps, 0);
}

// The tier's settings come from the daemon: a job asking for it without directories is refused, and a directory the
// tier cannot create its files in fails that job before any step.
TEST(TrainingJob, NvmeStateNeedsAUsableDirectory) {
  JobEnvironment env;  // what the daemon would set
  testing::TempDir out;
  TrainingJobSpec spec = DemoSpec(out);
  spec.nvme_state = TierMode::kMoments;
  auto r = RunTrainingJob(spec, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  ExpectContains(r.status().message(), "nvme.dirs");
  env.nvme.io.dirs = {out.File("no-such-dir")};
  int steps = 0;
  r = RunTrainingJob(spec, env, {nullptr, [&](const TrainingStepEvent&) { ++steps; }}, nullptr);
  EXPECT_FALSE(r.ok());
  ExpectContains(r.status().message(), out.File("no-such-dir") + "/slide-unit-00000-");
  ExpectContains(r.status().message(), "cannot create");
  EXPECT_EQ(steps, 0);
}

// Suspending right after a periodic checkpoint keeps that checkpoint: the step is not written twice (a second
// write would first remove the directory LATEST names).
TEST(TrainingJob, SuspendRightAfterACheckpointDoesNotRewriteIt) {
  JobEnvironment env;  // what the daemon would set
  testing::TempDir out;
  TrainingJobSpec spec = DemoSpec(out);
  spec.steps = 8;
  env.checkpoint_dir = out.File("ckpt");
  spec.checkpoint_every = 2;
  std::atomic<bool> suspend{false};
  int writes_at_4 = 0;
  TrainingCallbacks cb{[&](const std::string& m) { writes_at_4 += m.rfind("checkpoint at step 4:", 0) == 0; },
                       [&](const TrainingStepEvent& e) { suspend = e.step == 4; }};
  TrainingResult r = testing::ValueOrDie(RunTrainingJob(spec, env, cb, nullptr, &suspend));
  EXPECT_TRUE(r.suspended);
  EXPECT_EQ(r.steps, 4);
  EXPECT_EQ(writes_at_4, 1);
  EXPECT_TRUE(std::filesystem::exists(out.File("ckpt/step-00000004/optimizer.safetensors")));
}

// A 4-step demo job suspended after step 2, its checkpoint in `out`/ckpt (`env` names it).
TrainingJobSpec SuspendedAtStepTwo(const testing::TempDir& out, JobEnvironment& env) {
  TrainingJobSpec spec = DemoSpec(out);
  spec.steps = 4;
  env.checkpoint_dir = out.File("ckpt");
  std::atomic<bool> suspend{false};
  TrainingCallbacks cb{nullptr, [&](const TrainingStepEvent& e) { suspend = e.step == 2; }};
  EXPECT_TRUE(testing::ValueOrDie(RunTrainingJob(spec, env, cb, nullptr, &suspend)).suspended);
  return spec;
}

TEST(TrainingJob, CorruptOrForeignCheckpointFailsTheJobWithTheFile) {
  JobEnvironment env;  // what the daemon would set
  testing::TempDir out;
  const TrainingJobSpec spec = SuspendedAtStepTwo(out, env);

  TrainingJobSpec other = spec;
  other.batch_size = 8;  // a different job must not pick this checkpoint up
  auto r = RunTrainingJob(other, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  ExpectContains(r.status().message(), "belongs to a different job");

  const std::string tensors = out.File("ckpt/step-00000002/optimizer.safetensors");
  std::filesystem::resize_file(tensors, std::filesystem::file_size(tensors) / 2);
  r = RunTrainingJob(spec, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  ExpectContains(r.status().message(), tensors);

  std::ofstream(out.File("ckpt/step-00000002/state.json")) << "{\"format\": 1, \"step\": ";
  r = RunTrainingJob(spec, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  ExpectContains(r.status().message(), "state.json' is corrupt");
}

// A checkpoint's moments are those of the optimizer that wrote it: a job with the other optimizer is refused,
// naming both, before anything is read (the bytes of 8-bit moments are no fp32 state, and back).
TEST(TrainingJob, CheckpointOfTheOtherOptimizerIsRefused) {
  JobEnvironment env;  // what the daemon would set
  testing::TempDir out;
  TrainingJobSpec spec = SuspendedAtStepTwo(out, env);
  spec.optimizer = OptimizerKind::kAdamW8bit;
  auto r = RunTrainingJob(spec, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  ExpectContains(r.status().message(), "holds the state of optimizer adamw, but this job's optimizer is adamw_8bit");
}

// A checkpoint is a file like any other: a state.json that claims more steps than the job has, or tensors that
// hold NaN, are refused before resuming rather than trained on to a SUCCEEDED job with a NaN loss.
TEST(TrainingJob, CheckpointClaimingTooManyStepsOrHoldingNaNIsRefused) {
  JobEnvironment env;  // what the daemon would set
  testing::TempDir out;
  const TrainingJobSpec spec = SuspendedAtStepTwo(out, env);
  const std::string state = out.File("ckpt/step-00000002/state.json");
  const std::string tensors = out.File("ckpt/step-00000002/optimizer.safetensors");
  std::filesystem::copy_file(state, out.File("state.json.good"));

  std::string text;
  {
    std::ifstream in(state);
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const size_t at = text.find("\"step\": 2");
  ASSERT_NE(at, std::string::npos) << text;
  std::ofstream(state) << text.replace(at, 9, "\"step\": 100000");
  auto r = RunTrainingJob(spec, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  ExpectContains(r.status().message(), "claims step 100000 of 4, but this job has 4 steps");

  std::filesystem::copy_file(out.File("state.json.good"), state, std::filesystem::copy_options::overwrite_existing);
  {
    auto file = testing::ValueOrDie(SafetensorsFile::Open(tensors));
    NamedTensors all;
    for (const auto& e : file->entries()) all.emplace_back(e.name, testing::ValueOrDie(file->Read(e)));
    for (auto& [name, t] : all)
      if (name == "exp_avg_sq.1") t[7] = std::nanf("");
    ASSERT_TRUE(WriteSafetensors(tensors, all, {{"format", "slideformer"}}).ok());
  }
  r = RunTrainingJob(spec, env, {}, nullptr);
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  ExpectContains(r.status().message(), "tensor 'exp_avg_sq.1' holds NaN or infinite values");
}

}  // namespace
}  // namespace slide
