// A model's chat template: Jinja source compiled once by llama.cpp's engine (third_party/llama_jinja) and rendered
// with the semantics of transformers' apply_chat_template (trim_blocks, lstrip_blocks, raise_exception,
// strftime_now). The variables are the caller's (see chat_render.h); this class only compiles and renders.
#pragma once

#include <ctime>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "engine/common/status.h"

namespace slide {

class Tokenizer;

class ChatTemplate {
 public:
  // Parses `source`; a syntax error or a construct the engine lacks is INVALID_ARGUMENT naming `origin` (the file
  // or field the template came from) with the line and column.
  static StatusOr<std::shared_ptr<const ChatTemplate>> Compile(const std::string& source, const std::string& origin);
  ~ChatTemplate();

  // Renders with `variables`, a JSON object (messages, tools, add_generation_prompt, the special tokens, ...).
  // `now` is strftime_now's clock (local time, as transformers'); 0 = the current time. A template's
  // raise_exception or an error while rendering is INVALID_ARGUMENT with the template's line.
  StatusOr<std::string> Render(const nlohmann::ordered_json& variables, std::time_t now = 0) const;

  const std::string& origin() const;
  const std::string& source() const;

  struct Impl;

 private:
  explicit ChatTemplate(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Which template renders a job's `messages` lines: the model's own (auto, the default) or a built-in fallback for a
// model without one (llama3: Llama 3's header/eot format; chatml: <|im_start|>/<|im_end|>).
enum class ChatTemplateChoice { kAuto, kLlama3, kChatML };
StatusOr<ChatTemplateChoice> ParseChatTemplateChoice(const std::string& name);  // auto|llama3|chatml
const char* ChatTemplateChoiceName(ChatTemplateChoice choice);

// The model directory's own template as transformers finds it: chat_template.jinja, else tokenizer_config.json's
// chat_template (a string, or a list of {name, template} of which "default" is taken). NOT_FOUND when it has none;
// INVALID_ARGUMENT when the file is malformed or the template does not compile.
StatusOr<std::shared_ptr<const ChatTemplate>> LoadModelChatTemplate(const std::string& model_dir);

// The template for `choice`: kAuto is the model's own (a model without one is INVALID_ARGUMENT naming the
// fallbacks); the named ones are built in.
StatusOr<std::shared_ptr<const ChatTemplate>> ResolveChatTemplate(ChatTemplateChoice choice,
                                                                  const std::string& model_dir);

// The built-in templates write their special tokens as text, which a tokenizer without them would split into plain
// pieces: INVALID_ARGUMENT naming the first one `tokenizer` lacks. The model's own template (kAuto) passes.
Status CheckChatTemplateTokens(ChatTemplateChoice choice, const Tokenizer& tokenizer);

}  // namespace slide
