// Chat templates from a model directory (chat_template.jinja / tokenizer_config.json) are untrusted input: compiled,
// then rendered for a conversation with a reply, a tool call and the generation prompt. An error is fine (it fails
// the job); a crash, a hang or an allocation past the limit is a finding.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "engine/data/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const nlohmann::ordered_json variables = nlohmann::ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <b>\"there\"</b>"},
                 {"role": "assistant", "content": "",
                  "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"x": [1, 2.5, null]}}}]},
                 {"role": "tool", "content": "{\"ok\": true}"}, {"role": "assistant", "content": "Done."}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "documents": null, "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>"})");
  auto compiled = slide::ChatTemplate::Compile(std::string(reinterpret_cast<const char*>(data), size), "fuzz.jinja");
  if (!compiled.ok()) return 0;
  (void)(*compiled)->Render(variables, 1785067200);
  return 0;
}
