// Writes a random-init Llama-shaped model as a Hugging Face directory (config.json, model.safetensors and the
// demo tokenizer, whose ids fit any of these vocabularies), so daemon benchmarks can run real-size jobs.
// Usage: make_random_model SHAPE OUT_DIR [TOKENIZER_DIR=deploy/demo/model]
//   SHAPE: llama-1b | llama-3b | llama-8b | llama-100m | tiny, optionally @LAYERS (llama-8b@48)
#include <cstdio>
#include <fstream>
#include <string>

#include "bench/llama_shapes.h"
#include "engine/common/files.h"

using namespace slide;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: make_random_model SHAPE OUT_DIR [TOKENIZER_DIR]\n");
    return 2;
  }
  const std::string shape = argv[1], out = argv[2];
  const std::string tokenizer_dir = argc > 3 ? argv[3] : "deploy/demo/model";
  const auto named = bench::LlamaShape(shape);
  if (!named.ok()) return std::fprintf(stderr, "make_random_model: %s\n", named.status().ToString().c_str()), 2;
  const ModelConfig& c = named.value();
  // The export copies config.json and the tokenizer files from a source directory: build that first.
  const std::string src = out + ".src";
  Status st = MakeDirs(src);
  if (!st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
  std::ofstream(src + "/config.json")
      << "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n  \"hidden_act\": \"silu\",\n"
      << "  \"vocab_size\": " << c.vocab_size << ",\n  \"hidden_size\": " << c.hidden_size
      << ",\n  \"intermediate_size\": " << c.intermediate_size << ",\n  \"num_hidden_layers\": " << c.num_layers
      << ",\n  \"num_attention_heads\": " << c.num_heads << ",\n  \"num_key_value_heads\": " << c.num_kv_heads
      << ",\n  \"head_dim\": " << c.head_dim << ",\n  \"rope_theta\": " << c.rope_theta
      << ",\n  \"rms_norm_eps\": " << c.rms_norm_eps
      << ",\n  \"tie_word_embeddings\": " << (c.tie_word_embeddings ? "true" : "false")
      << ",\n  \"max_position_embeddings\": 131072,\n  \"bos_token_id\": 0,\n  \"eos_token_id\": 1,\n"
      << "  \"torch_dtype\": \"bfloat16\"\n}\n";
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    auto text = ReadFileToString(tokenizer_dir + "/" + f);
    if (!text.ok()) return std::fprintf(stderr, "%s\n", text.status().ToString().c_str()), 1;
    std::ofstream(src + "/" + f) << text.value();
  }
  st = ExportHfCheckpoint(out, src, bench::RandomLlamaParams(c));
  if (!st.ok()) return std::fprintf(stderr, "%s\n", st.ToString().c_str()), 1;
  (void)RemoveTree(src);
  std::printf("%s: %lld parameters in %s\n", shape.c_str(), static_cast<long long>(c.TotalParamCount()), out.c_str());
  return 0;
}
