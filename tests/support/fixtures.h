// Helpers shared by tests: fixture paths, the Hugging Face reference files, tensor comparison, temp dirs.
#pragma once

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/model/config.h"
#include "engine/model/lora.h"
#include "engine/model/safetensors.h"
#include "engine/runtime/reference_trainer.h"

namespace slide::testing {

std::string FixturePath(const std::string& relative);

// One architecture's parity fixture: tests/fixtures/models/<name>/ written by scripts/make_model_fixtures.py.
struct ModelFixture {
  std::string name;
  std::string dir;
  ModelConfig config;
  std::shared_ptr<SafetensorsFile> reference;
  nlohmann::json training;

  static ModelFixture Load(const std::string& name);
  at::Tensor Ref(const std::string& tensor) const;  // a private copy of reference.safetensors[tensor]
};

const std::vector<std::string>& FixtureArchitectures();

// A safetensors fixture (tests/fixtures/<relative>) read by tensor name; a missing file or tensor fails the test.
class FixtureTensors {
 public:
  explicit FixtureTensors(const std::string& relative);
  at::Tensor operator[](const std::string& name) const;  // contiguous

 private:
  std::shared_ptr<SafetensorsFile> file_;
};

// The trainer options a fixture's training.json records (torch AdamW's hyper-parameters, clipping, the HF
// schedule), computing in fp32 with several LM-head chunks.
TrainerOptions FixtureTrainerOptions(const nlohmann::json& training);

// `accum` micro-batches of 2 random rows of 16 tokens drawn after at::manual_seed(seed), micro-batch m with its first
// 2 + m targets masked (different valid counts per micro-batch).
std::vector<MicroBatch> RandomMicroBatches(uint64_t seed, int64_t accum, int64_t vocab, c10::Device device);

// The fixture's two layers repeated to `layers` (scaled copies, so no two are alike) and `cfg` changed to match:
// windows of 1-2 slots are then smaller than the model.
ModelParams RepeatedLayers(const ModelFixture& fx, ModelConfig* cfg, int64_t layers);

// One forward (logits, without autograd) and one loss with backward of `base` with LoRA adapters (`adapter`, one flat
// tensor per layer in `layout`, cast to `dtype` as leaves that take the gradients), as the PEFT parity tests compare.
struct AdapterPass {
  at::Tensor logits, loss;
  std::vector<at::Tensor> leaves;  // the adapters, their .grad() filled
};
AdapterPass RunAdapterPass(const ModelConfig& cfg, const ModelParams& base, const AdapterLayout& layout,
                           const std::vector<at::Tensor>& adapter, double scale, const at::Tensor& ids,
                           const at::Tensor& labels, c10::ScalarType dtype);

// max |a - b|, max |b|, and their ratio (relative to the reference's scale).
struct TensorDiff {
  double max_abs = 0;
  double ref_scale = 0;
  double rel = 0;       // max_abs / ref_scale
  double norm_rel = 0;  // ||a - b|| / ||b||
};
TensorDiff Compare(const at::Tensor& actual, const at::Tensor& expected);

// A fresh directory under the system temp dir, removed when the object goes away.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string File(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Fails the test with the status message when not OK.
#define ASSERT_OK(expr)                                \
  do {                                                 \
    auto slide_s_ = (expr);                            \
    ASSERT_TRUE(slide_s_.ok()) << slide_s_.ToString(); \
  } while (0)
// The same, going on after a failure (usable where ASSERT cannot return, e.g. in functions returning a value).
#define EXPECT_OK(expr)                                \
  do {                                                 \
    auto slide_s_ = (expr);                            \
    EXPECT_TRUE(slide_s_.ok()) << slide_s_.ToString(); \
  } while (0)

template <typename T>
T ValueOrDie(StatusOr<T> v) {
  if (!v.ok()) throw std::runtime_error(v.status().ToString());
  return std::move(v).value();
}

}  // namespace slide::testing
