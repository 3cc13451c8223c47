// Job files are read through the JobSpec schema: every field of slide.v1.JobSpec can be set from YAML by its own
// name and type, path fields resolve against the file's directory, and bad keys or values name the line.
#include "client/job_file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "proto/enum_short_names.h"

namespace {

namespace fs = std::filesystem;
using google::protobuf::FieldDescriptor;
using slide::v1::JobSpec;

class JobFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("job_file_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string Write(const std::string& text) {
    const fs::path p = dir_ / "job.yaml";
    std::ofstream(p) << text;
    return p.string();
  }
  fs::path dir_;
};

TEST_F(JobFileTest, EveryJobSpecFieldIsSetByItsNameAndType) {
  const auto* d = JobSpec::descriptor();
  const auto* r = JobSpec::GetReflection();
  ASSERT_GT(d->field_count(), 30);
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    SCOPED_TRACE(f->name());
    std::string value;
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING:
        value = "sub/x";
        break;
      case FieldDescriptor::CPPTYPE_INT64:
      case FieldDescriptor::CPPTYPE_UINT64:
      case FieldDescriptor::CPPTYPE_INT32:
        value = "7";
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        value = "0.25";
        break;
      case FieldDescriptor::CPPTYPE_BOOL:
        value = "true";
        break;
      case FieldDescriptor::CPPTYPE_ENUM:  // the last value, by its short name
        value = slide::v1::EnumShortName(f->enum_type()->value(f->enum_type()->value_count() - 1));
        break;
      default:
        FAIL() << "a JobSpec field of a type job files cannot set";
    }
    JobSpec spec;
    ASSERT_EQ(slidectl::LoadJobFile(Write(f->name() + ": " + value + "\n"), &spec), "");
    JobSpec only_this;  // nothing else was set
    switch (f->cpp_type()) {
      case FieldDescriptor::CPPTYPE_STRING: {
        const bool is_path = f->options().GetExtension(slide::v1::path);
        EXPECT_EQ(r->GetString(spec, f), is_path ? (dir_ / "sub/x").string() : "sub/x");
        r->SetString(&only_this, f, r->GetString(spec, f));
        break;
      }
      case FieldDescriptor::CPPTYPE_INT64:
        EXPECT_EQ(r->GetInt64(spec, f), 7);
        r->SetInt64(&only_this, f, 7);
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        EXPECT_EQ(r->GetUInt64(spec, f), 7u);
        r->SetUInt64(&only_this, f, 7);
        break;
      case FieldDescriptor::CPPTYPE_INT32:
        EXPECT_EQ(r->GetInt32(spec, f), 7);
        r->SetInt32(&only_this, f, 7);
        break;
      case FieldDescriptor::CPPTYPE_DOUBLE:
        EXPECT_EQ(r->GetDouble(spec, f), 0.25);
        r->SetDouble(&only_this, f, 0.25);
        break;
      case FieldDescriptor::CPPTYPE_ENUM: {
        const auto* last = f->enum_type()->value(f->enum_type()->value_count() - 1);
        EXPECT_EQ(r->GetEnum(spec, f), last);
        EXPECT_NE(last->number(), 0);
        r->SetEnum(&only_this, f, last);
        break;
      }
      default:
        EXPECT_TRUE(r->GetBool(spec, f));
        r->SetBool(&only_this, f, true);
    }
    if (f->has_presence()) {  // an explicit value of an optional field counts
      EXPECT_TRUE(r->HasField(spec, f));
    }
    EXPECT_EQ(spec.SerializeAsString(), only_this.SerializeAsString());
  }
}

// Each choice is written by its short name: every value of every enum field of the schema is reachable.
TEST_F(JobFileTest, EveryChoiceIsSetByItsShortName) {
  const auto* d = JobSpec::descriptor();
  int enum_fields = 0;
  for (int i = 0; i < d->field_count(); ++i) {
    const FieldDescriptor* f = d->field(i);
    if (f->enum_type() == nullptr) continue;
    ++enum_fields;
    for (int v = 1; v < f->enum_type()->value_count(); ++v) {
      const auto* value = f->enum_type()->value(v);
      JobSpec spec;
      ASSERT_EQ(slidectl::LoadJobFile(Write(f->name() + ": " + slide::v1::EnumShortName(value) + "\n"), &spec), "")
          << value->name();
      EXPECT_EQ(JobSpec::GetReflection()->GetEnum(spec, f), value);
    }
  }
  EXPECT_EQ(enum_fields, 14);
  EXPECT_EQ(slide::v1::EnumShortName(slide::v1::Optimizer_descriptor()->FindValueByName("OPTIMIZER_ADAMW_8BIT")),
            "adamw_8bit");
  EXPECT_EQ(slide::v1::EnumShortName(
                slide::v1::DatasetFormat_descriptor()->FindValueByName("DATASET_FORMAT_PROMPT_COMPLETION")),
            "prompt_completion");
}

TEST_F(JobFileTest, AbsolutePathsStayAndAnExplicitZeroIsPresent) {
  JobSpec spec;
  ASSERT_EQ(slidectl::LoadJobFile(Write("model_dir: /models/llama\nbatch_size: 0\nlr: 0\n"), &spec), "");
  EXPECT_EQ(spec.model_dir(), "/models/llama");
  EXPECT_TRUE(spec.has_batch_size());  // the daemon refuses it rather than taking the default
  EXPECT_TRUE(spec.has_lr());
  EXPECT_FALSE(spec.has_epochs());
}

TEST_F(JobFileTest, BadKeysAndValuesNameTheLine) {
  JobSpec spec;
  const std::string path = Write("name: a\nlearning_rate: 0.1\n");
  EXPECT_EQ(slidectl::LoadJobFile(path, &spec), path + ":2: unknown field 'learning_rate'");
  EXPECT_EQ(slidectl::LoadJobFile(Write("steps: 3\nsteps: 4\n"), &spec), path + ":2: field 'steps' is given twice");
  EXPECT_EQ(slidectl::LoadJobFile(Write("\nepochs: many\n"), &spec),
            path + ":2: field 'epochs' has the wrong type ('many')");
  EXPECT_EQ(slidectl::LoadJobFile(Write("allow_seq_len_beyond_model: maybe\n"), &spec),
            path + ":1: field 'allow_seq_len_beyond_model' has the wrong type ('maybe')");
  EXPECT_EQ(slidectl::LoadJobFile(Write("seed: -1\n"), &spec), path + ":1: field 'seed' has the wrong type ('-1')");
  EXPECT_EQ(slidectl::LoadJobFile(Write("lr: [1, 2]\n"), &spec), path + ":1: field 'lr' must be a single value");
  EXPECT_EQ(slidectl::LoadJobFile(Write("steps: 3\ndevice: gpu\n"), &spec),
            path + ":2: field 'device' must be auto, cpu or cuda, got 'gpu'");
  EXPECT_EQ(slidectl::LoadJobFile(Write("lr_schedule: LR_SCHEDULE_COSINE\n"), &spec),
            path + ":1: field 'lr_schedule' must be constant, linear or cosine, got 'LR_SCHEDULE_COSINE'");
  EXPECT_EQ(slidectl::LoadJobFile(Write("nvme_state: unspecified\n"), &spec),
            path + ":1: field 'nvme_state' must be none, moments or moments_and_master, got 'unspecified'");
  EXPECT_EQ(slidectl::LoadJobFile(Write("- steps\n"), &spec), path + ": a job file is a mapping of JobSpec fields");
  EXPECT_EQ(slidectl::LoadJobFile(Write("steps: [\n"), &spec).rfind(path + ":", 0), 0u);
  EXPECT_NE(slidectl::LoadJobFile((dir_ / "missing.yaml").string(), &spec).find("cannot open job file"),
            std::string::npos);
}

// yaml-cpp reads an unclosed quote to the end of the file: the job file names the line instead of sending a
// name made of the rest of the file.
TEST_F(JobFileTest, AnUnclosedQuoteNamesItsLine) {
  JobSpec spec;
  const std::string path = (dir_ / "job.yaml").string();
  EXPECT_EQ(slidectl::LoadJobFile(Write("steps: 3\nname: \"half\nlr: 0.001\nseed: 4\n"), &spec),
            path + ":2: field 'name': a quoted value is never closed (its quote runs to the end of the file)");
  EXPECT_EQ(slidectl::LoadJobFile(Write("name: 'it''s\n"), &spec),
            path + ":1: field 'name': a quoted value is never closed (its quote runs to the end of the file)");
  EXPECT_EQ(slidectl::LoadJobFile(Write("name: \"say \\\"hi\\\"\"\nname2: x\n"), &spec),
            path + ":2: unknown field 'name2'");  // escaped quotes inside a closed value are fine
  EXPECT_EQ(slidectl::LoadJobFile(Write("name: 'it''s'\nsteps: 2\n"), &spec), "");
  EXPECT_EQ(spec.name(), "it's");
}

// Whatever path slidectl is given, it reads a regular file of bounded size or says in one line why not.
TEST_F(JobFileTest, PathsThatAreNotReadableFilesGetOneLine) {
  JobSpec spec;
  EXPECT_EQ(slidectl::LoadJobFile(dir_.string(), &spec), dir_.string() + ": is a directory, not a job file");
  const std::string fifo = (dir_ / "fifo").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_EQ(slidectl::LoadJobFile(fifo, &spec), fifo + ": is a FIFO, not a job file");  // and does not hang
  EXPECT_EQ(slidectl::LoadJobFile("/dev/null", &spec), "/dev/null: is a device, not a job file");
  const std::string huge = (dir_ / "huge.yaml").string();
  { std::ofstream(huge) << std::string(slidectl::kMaxJobFileBytes + 1, '#'); }
  EXPECT_EQ(slidectl::LoadJobFile(huge, &spec), huge + ": is " + std::to_string(slidectl::kMaxJobFileBytes + 1) +
                                                    " bytes; a job file is at most " +
                                                    std::to_string(slidectl::kMaxJobFileBytes));
  if (::geteuid() != 0) {  // root reads any file
    const std::string locked = Write("steps: 1\n");
    ASSERT_EQ(::chmod(locked.c_str(), 0), 0);
    EXPECT_NE(slidectl::LoadJobFile(locked, &spec).find("cannot open job file (Permission denied)"), std::string::npos);
  }
}

}  // namespace

namespace {

// The bundled demo job files read as the README says: the full fine-tuning demo and its LoRA and QLoRA variants.
TEST(BundledJobFiles, DemoJobsRead) {
  slide::v1::JobSpec full, lora;
  EXPECT_EQ(slidectl::LoadJobFile(std::string(SLIDE_SOURCE_DIR) + "/deploy/demo/job.yaml", &full), "");
  EXPECT_EQ(full.adapter(), slide::v1::ADAPTER_UNSPECIFIED);
  EXPECT_EQ(slidectl::LoadJobFile(std::string(SLIDE_SOURCE_DIR) + "/deploy/demo/lora-job.yaml", &lora), "");
  EXPECT_EQ(lora.adapter(), slide::v1::ADAPTER_LORA);
  EXPECT_EQ(lora.lora_r(), 8);
  EXPECT_EQ(lora.adapter_export(), slide::v1::ADAPTER_EXPORT_ADAPTER);
  EXPECT_EQ(lora.model_dir(), std::string(SLIDE_SOURCE_DIR) + "/deploy/demo/model");  // relative to the file
  slide::v1::JobSpec qlora;
  EXPECT_EQ(slidectl::LoadJobFile(std::string(SLIDE_SOURCE_DIR) + "/deploy/demo/qlora-job.yaml", &qlora), "");
  EXPECT_EQ(qlora.adapter(), slide::v1::ADAPTER_QLORA);
  EXPECT_EQ(qlora.lora_r(), 8);
}

}  // namespace
