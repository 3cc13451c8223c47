// What a LoRA adapter is (PEFT's LoraConfig fields this engine trains), as a plain struct: the job's spec carries
// it across the engine boundary, where no LibTorch header may go (engine/model/lora.h has the rest).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slide {

struct LoraOptions {
  int64_t r = 16;
  double alpha = 32;
  double dropout = 0;  // PEFT's lora_dropout: on the adapter's input only, in training steps only
  // Module names as PEFT's target_modules lists them; every linear projection of attention and MLP by default.
  std::vector<std::string> target_modules = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                             "gate_proj", "up_proj", "down_proj"};
  uint64_t seed = 0;  // A's initialisation and the dropout masks

  double scale() const { return alpha / static_cast<double>(r); }
};

}  // namespace slide
