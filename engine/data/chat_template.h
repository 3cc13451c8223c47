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

}  // namespace slide
