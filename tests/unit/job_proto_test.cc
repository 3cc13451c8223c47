// The API's choices meet the engine's enums in one table per choice (server/job_proto.cc): every value of every
// enum field of JobSpec maps to the engine and back unchanged, UNSPECIFIED takes the engine's default, and a
// number the schema does not know fails the request naming the field.
#include "server/job_proto.h"

#include <gtest/gtest.h>

#include "proto/enum_short_names.h"

namespace {

using google::protobuf::FieldDescriptor;
using slide::v1::JobSpec;

TEST(JobProto, EveryChoiceMapsToTheEngineAndBack) {
  const auto* d = JobSpec::descriptor();
  const auto* r = JobSpec::GetReflection();
  int values = 0;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->enum_type() == nullptr) continue;
    for (int v = 1; v < f->enum_type()->value_count(); ++v, ++values) {
      SCOPED_TRACE(f->enum_type()->value(v)->name());
      JobSpec in;
      r->SetEnum(&in, f, f->enum_type()->value(v));
      if (f->name() == "adapter_export") in.set_adapter(slide::v1::ADAPTER_LORA);  // meaningful with an adapter
      auto spec = slide::SpecFromProto(in);
      ASSERT_TRUE(spec.ok()) << spec.status().message();
      JobSpec out;
      slide::SpecToProto("x", *spec, &out);
      EXPECT_EQ(r->GetEnum(out, f), f->enum_type()->value(v));
    }
  }
  EXPECT_EQ(values, 38);  // every value of every choice, ADAPTER_QLORA the latest
}

TEST(JobProto, UnspecifiedTakesTheEnginesDefaults) {
  auto spec = slide::SpecFromProto(JobSpec());
  ASSERT_TRUE(spec.ok());
  const slide::TrainingJobSpec defaults;
  EXPECT_EQ(spec->lr_schedule, defaults.lr_schedule);
  EXPECT_EQ(spec->device, defaults.device);
  EXPECT_EQ(spec->nvme_state, defaults.nvme_state);
  EXPECT_EQ(spec->export_dtype, defaults.export_dtype);
  EXPECT_EQ(spec->optimizer, slide::OptimizerKind::kAdamW);
  JobSpec served;
  slide::SpecToProto("x", *spec, &served);  // what GetJob shows: the defaults by name, never UNSPECIFIED
  EXPECT_EQ(served.lr_schedule(), slide::v1::LR_SCHEDULE_COSINE);
  EXPECT_EQ(served.device(), slide::v1::DEVICE_AUTO);
  EXPECT_EQ(served.sequence_mode(), slide::v1::SEQUENCE_MODE_PACK);
  EXPECT_EQ(served.nvme_state(), slide::v1::NVME_STATE_NONE);
  EXPECT_EQ(served.chat_template(), slide::v1::CHAT_TEMPLATE_AUTO);  // the model's own template by default
  EXPECT_EQ(served.train_on(), slide::v1::TRAIN_ON_ASSISTANT);
  EXPECT_EQ(served.optimizer(), slide::v1::OPTIMIZER_ADAMW);
}

// nvme_layers is optional: absent means every unit on the tier (the engine's -1) and stays absent in what GetJob
// serves; a count given comes back as given.
TEST(JobProto, NvmeLayersKeepTheirPresence) {
  JobSpec absent;
  auto spec = slide::SpecFromProto(absent);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->nvme_layers, -1);
  JobSpec served;
  slide::SpecToProto("x", *spec, &served);
  EXPECT_FALSE(served.has_nvme_layers());
  JobSpec given;
  given.set_nvme_state(slide::v1::NVME_STATE_MOMENTS);
  given.set_nvme_layers(6);
  spec = slide::SpecFromProto(given);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->nvme_layers, 6);
  slide::SpecToProto("x", *spec, &served);
  ASSERT_TRUE(served.has_nvme_layers());
  EXPECT_EQ(served.nvme_layers(), 6);
}

TEST(JobProto, AnUnknownNumberNamesTheField) {
  JobSpec in;
  in.set_device(static_cast<slide::v1::Device>(9));
  auto spec = slide::SpecFromProto(in);
  EXPECT_EQ(spec.status().code(), slide::StatusCode::kInvalidArgument);
  EXPECT_EQ(spec.status().message(), "job field 'device' has no value 9 (it takes auto, cpu or cuda)");
  in.clear_device();
  in.set_chat_template(static_cast<slide::v1::ChatTemplate>(-1));
  EXPECT_EQ(slide::SpecFromProto(in).status().message(),
            "job field 'chat_template' has no value -1 (it takes llama3, chatml or auto)");
}

}  // namespace

// Every StepMetrics field is carried: an event with each field set comes back equal, and its message has every
// field set (a field added to the schema but not to the mapping fails here).
TEST(JobProto, StepMetricsCarryEveryField) {
  slide::TrainingStepEvent e;
  e.step = 7, e.total_steps = 9, e.loss = 1.5, e.lr = 2e-5, e.grad_norm = 0.7, e.tokens_per_second = 8000;
  e.model_tflops = 400, e.step_seconds = 4.0, e.compute_seconds = 3.2, e.h2d_seconds = 0.6, e.d2h_seconds = 0.3;
  e.cpu_update_seconds = 2.0, e.update_wait_seconds = 1.6, e.weights_first = true, e.overlap_ratio = 1.25;
  e.bounded_by = "update_dependency", e.device_bytes = 1 << 30, e.host_bytes = 2ll << 30, e.pinned_bytes = 3;
  e.nvme_wait_seconds = 0.1, e.nvme_read_bytes = 4, e.nvme_written_bytes = 5, e.nvme_backend = "io_uring";
  e.trainable_params = 7168, e.model_params = 835968;
  slide::v1::StepMetrics m;
  slide::MetricsToProto(e, /*replayed=*/true, &m);
  const auto* d = slide::v1::StepMetrics::descriptor();
  for (int i = 0; i < d->field_count(); ++i)
    EXPECT_TRUE(slide::v1::StepMetrics::GetReflection()->HasField(m, d->field(i))) << d->field(i)->name();
  const slide::TrainingStepEvent back = slide::MetricsFromProto(m);
  EXPECT_EQ(back.weights_first, true);
  EXPECT_EQ(back.update_wait_seconds, 1.6);
  EXPECT_EQ(back.nvme_backend, "io_uring");
  EXPECT_EQ(back.trainable_params, 7168);
  EXPECT_EQ(back.model_params, 835968);
  EXPECT_EQ(back.step, 7);
}

namespace {

// LoRA's settings: defaults served by value once adapter is lora, targets parsed from the comma list, and lora_*
// fields without adapter: lora refused naming them.
TEST(JobProto, LoraSettingsRoundTrip) {
  JobSpec in;
  in.set_adapter(slide::v1::ADAPTER_LORA);
  auto spec = slide::SpecFromProto(in);
  ASSERT_TRUE(spec.ok()) << spec.status().message();
  EXPECT_EQ(spec->adapter, slide::AdapterMethod::kLora);
  EXPECT_EQ(spec->lora.r, 16);
  EXPECT_EQ(spec->lora.target_modules.size(), 7u);
  JobSpec served;
  slide::SpecToProto("x", *spec, &served);
  EXPECT_EQ(served.lora_r(), 16);
  EXPECT_EQ(served.lora_alpha(), 32);
  EXPECT_EQ(served.lora_target_modules(), "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj");
  EXPECT_EQ(served.adapter_export(), slide::v1::ADAPTER_EXPORT_ADAPTER);

  in.set_lora_r(8);
  in.set_lora_alpha(16);
  in.set_lora_dropout(0.05);
  in.set_lora_target_modules("q_proj, v_proj");
  in.set_adapter_export(slide::v1::ADAPTER_EXPORT_MERGED);
  spec = slide::SpecFromProto(in);
  ASSERT_TRUE(spec.ok());
  EXPECT_EQ(spec->lora.r, 8);
  EXPECT_EQ(spec->lora.target_modules, (std::vector<std::string>{"q_proj", "v_proj"}));
  EXPECT_EQ(spec->adapter_export, slide::AdapterExport::kMerged);

  in.set_lora_target_modules("q_proj,,v_proj");
  EXPECT_NE(slide::SpecFromProto(in).status().message().find("lora_target_modules"), std::string::npos);
  JobSpec stray;
  stray.set_lora_r(4);  // without adapter: lora
  EXPECT_NE(slide::SpecFromProto(stray).status().message().find("need adapter: lora"), std::string::npos);
  auto full = slide::SpecFromProto(JobSpec());
  ASSERT_TRUE(full.ok());
  JobSpec full_served;
  slide::SpecToProto("x", *full, &full_served);
  EXPECT_FALSE(full_served.has_lora_r());  // full fine-tuning shows no LoRA settings
}

}  // namespace
