// A `messages` dataset line (or TRL's conversational prompt/completion: {"prompt": [messages], "completion":
// [messages]}, whose completion is trained whole) turned into tokens and labels through a chat template, as TRL's
// SFTTrainer would train it: the conversation rendered once (the variables transformers' apply_chat_template passes),
// encoded without the tokenizer's own special tokens (the template places BOS where it wants one), and, with train_on:
// assistant, only the tokens of each assistant reply trained, its end-of-turn included.
//
// Where a reply lies is found by rendering the conversation's prefixes, as TRL does for a prompt and its completion:
// the prompt is the conversation before the reply with the generation prompt, the reply what the conversation
// through it adds to that prompt. In the whole rendering the reply starts where the prompt stops agreeing with it
// and ends where the reply does. Templates that are not prefix-preserving render a turn inside the conversation
// without a head its standalone rendering has (Mistral places the system prompt only in the last user turn, Qwen3
// drops a reply's empty <think> block once later turns follow, DeepSeek-R1 its reasoning): where agreement stops
// early, the conversation may skip that head and go on with the rest of the prompt's or the reply's ending, which
// then counts too (the longest run that the prompt or reply ends with). For a prefix-preserving template this is
// exactly TRL's completion mask. Byte ranges become tokens by encoding the text before each boundary: a token that
// straddles a reply's start is trained, one that straddles its end is not.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/common/status.h"
#include "engine/data/chat_template.h"
#include "engine/data/special_tokens.h"

namespace slide {

class Tokenizer;

enum class TrainOn { kAssistant, kAll };                  // the assistant replies only (the default), or every token
StatusOr<TrainOn> ParseTrainOn(const std::string& name);  // assistant|all
const char* TrainOnName(TrainOn t);

struct ChatSampleOptions {
  std::shared_ptr<const ChatTemplate> chat_template;
  SpecialTokens special_tokens;
  TrainOn train_on = TrainOn::kAssistant;
  std::time_t now = 0;  // strftime_now's clock; 0 = the current time
};

struct ChatSample {
  std::string text;                                // the rendered conversation
  std::vector<int32_t> ids;                        // its tokens
  std::vector<int32_t> labels;                     // the token where trained, else -100
  std::vector<std::pair<size_t, size_t>> trained;  // byte ranges of `text` that are trained
};

// The variables apply_chat_template passes the template for `messages` of `line`: messages, tools and documents
// (null unless the line has them), add_generation_prompt, the special tokens, then the line's other keys (not
// prompt / completion) and the keys of its chat_template_kwargs object (e.g. enable_thinking).
nlohmann::ordered_json ChatTemplateVariables(const nlohmann::ordered_json& line, const nlohmann::ordered_json& messages,
                                             const SpecialTokens& tokens, bool add_generation_prompt);

// Renders a plain exchange (a user turn and a reply; the user turn with the generation prompt) to find, before a
// job starts, a construct the engine does not support (an unknown filter, test or operator, a builtin it lacks):
// INVALID_ARGUMENT naming it and, where the engine reports one, the template's line. A template's own refusal of
// the exchange (raise_exception) and other rendering errors are left to the lines, which report them.
Status CheckChatTemplateSupport(const ChatTemplate& chat_template, const SpecialTokens& tokens);

// Builds the sample; errors (INVALID_ARGUMENT) name the message or the template's line.
StatusOr<ChatSample> BuildChatSample(const nlohmann::ordered_json& line, const Tokenizer& tokenizer,
                                     const ChatSampleOptions& options);

}  // namespace slide
