#include "engine/data/chat_sample.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <string_view>

#include "engine/data/tokenizer.h"

namespace slide {
namespace {

using nlohmann::ordered_json;

constexpr int32_t kIgnore = -100;

// Back to the start of the UTF-8 character that byte `pos` of `text` lies in: spans end on character boundaries,
// as the Python reference (which compares characters) has them.
size_t CharStart(const std::string& text, size_t pos) {
  while (pos > 0 && pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) --pos;
  return pos;
}

// How many bytes a[a_from..] and b[b_from..] share, ending on a character boundary.
size_t CommonPrefix(const std::string& a, size_t a_from, const std::string& b, size_t b_from) {
  size_t n = 0;
  while (a_from + n < a.size() && b_from + n < b.size() && a[a_from + n] == b[b_from + n]) ++n;
  return CharStart(a, a_from + n) - a_from;
}

ordered_json Prefix(const ordered_json& messages, size_t n) {
  ordered_json out = ordered_json::array();
  for (size_t i = 0; i < n; ++i) out.push_back(messages[i]);
  return out;
}

Status CheckMessages(const ordered_json& messages) {
  if (!messages.is_array() || messages.empty()) return InvalidArgument("field 'messages' must be a non-empty array");
  for (size_t k = 0; k < messages.size(); ++k) {
    const ordered_json& m = messages[k];
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string())
      return InvalidArgument("messages[" + std::to_string(k) + "] needs a string field 'role'");
    if (m.contains("content") && !m["content"].is_string() && !m["content"].is_null() && !m["content"].is_array())
      return InvalidArgument("messages[" + std::to_string(k) + "]: 'content' must be a string, a list or null");
  }
  return Status::Ok();
}

// The largest m such that `text` ends with pattern[0, m) (KMP: the matcher's state after reading all of `text`).
size_t LongestPrefixThatEnds(std::string_view pattern, std::string_view text) {
  if (pattern.empty()) return 0;
  std::vector<size_t> border(pattern.size(), 0);
  for (size_t i = 1, k = 0; i < pattern.size(); ++i) {
    while (k > 0 && pattern[i] != pattern[k]) k = border[k - 1];
    if (pattern[i] == pattern[k]) ++k;
    border[i] = k;
  }
  size_t q = 0;
  for (char c : text) {
    while (q > 0 && (q == pattern.size() || c != pattern[q])) q = border[q - 1];
    if (c == pattern[q]) ++q;
  }
  return q;
}

// Where the text that agrees with `rendering` from `from` on ends, when `rendering` stopped agreeing with `text`
// before its own end: `text` may skip a part of it and go on with its ending (the conversation renders a turn
// without a head its standalone rendering has: a system prompt placed only in the last user turn, the empty
// <think> block of a last reply). That is `from` plus the longest run of `text` from `from`, at most `limit` bytes,
// that `rendering` ends with.
size_t ExtendByEnding(const std::string& text, size_t from, size_t limit, const std::string& rendering) {
  return CharStart(text, from + LongestPrefixThatEnds(std::string_view(text).substr(from, limit), rendering));
}

// The variables the trainer sets: a line that sets one too is refused (transformers raises on the duplicate).
bool Reserved(const std::string& key) {
  for (const char* k : {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token",
                        "unk_token", "pad_token", "sep_token", "cls_token", "mask_token", "additional_special_tokens"})
    if (key == k) return true;
  return false;
}

// How many of `ids` (the tokens of `text`) lie wholly before byte `pos`: the tokens `text`'s first `pos` bytes
// encode to, as far as they agree with `ids` (a token merged across `pos` is not counted).
StatusOr<size_t> TokensBefore(const Tokenizer& tok, const std::string& text, const std::vector<int32_t>& ids,
                              size_t pos) {
  if (pos == 0) return size_t{0};
  if (pos >= text.size()) return ids.size();
  SLIDE_ASSIGN_OR_RETURN(std::vector<int32_t> head, tok.Encode(std::string_view(text).substr(0, pos)));
  size_t n = 0;
  while (n < head.size() && n < ids.size() && head[n] == ids[n]) ++n;
  return n;
}

}  // namespace

StatusOr<TrainOn> ParseTrainOn(const std::string& name) {
  if (name == "assistant") return TrainOn::kAssistant;
  if (name == "all") return TrainOn::kAll;
  return InvalidArgument("unknown train_on '" + name + "' (assistant, all)");
}

const char* TrainOnName(TrainOn t) { return t == TrainOn::kAll ? "all" : "assistant"; }

ordered_json ChatTemplateVariables(const ordered_json& line, const ordered_json& messages, const SpecialTokens& tokens,
                                   bool add_generation_prompt) {
  ordered_json v = ordered_json::object();
  for (const auto& [key, value] : line.items())
    if (key != "prompt" && key != "completion" && key != "chat_template_kwargs" && !Reserved(key)) v[key] = value;
  if (line.contains("chat_template_kwargs") && line["chat_template_kwargs"].is_object())
    for (const auto& [key, value] : line["chat_template_kwargs"].items())
      if (!Reserved(key)) v[key] = value;
  // Last, so that nothing of the line's replaces them (BuildChatSample refuses a line that tries).
  v["messages"] = messages;
  v["tools"] = line.contains("tools") ? line["tools"] : ordered_json();
  v["documents"] = line.contains("documents") ? line["documents"] : ordered_json();
  v["add_generation_prompt"] = add_generation_prompt;
  tokens.AddTo(v);
  return v;
}

Status CheckChatTemplateSupport(const ChatTemplate& chat_template, const SpecialTokens& tokens) {
  const ordered_json line = ordered_json::parse(R"({"messages": [{"role": "user", "content": "Hello"},
                                                                 {"role": "assistant", "content": "Hi"}]})");
  for (const bool generation_prompt : {false, true}) {
    const ordered_json messages = generation_prompt ? Prefix(line["messages"], 1) : line["messages"];
    auto rendered = chat_template.Render(ChatTemplateVariables(line, messages, tokens, generation_prompt));
    if (rendered.ok()) continue;
    const std::string why = rendered.status().message();
    for (const char* unsupported :
         {"Unknown (built-in) filter", "Unknown test", "Unknown operator", "Unknown unary operator", "NotImplemented"})
      if (why.find(unsupported) != std::string::npos)
        return InvalidArgument("the engine does not support a construct of " + why);
  }
  return Status::Ok();
}

StatusOr<ChatSample> BuildChatSample(const ordered_json& line, const Tokenizer& tok, const ChatSampleOptions& o) {
  // TRL's conversational prompt/completion: the conversation is the prompt's messages then the completion's.
  const bool prompt_completion = !line.contains("messages") && line.contains("prompt") && line["prompt"].is_array();
  ordered_json messages;
  if (prompt_completion) {
    if (!line.contains("completion") || !line["completion"].is_array() || line["completion"].empty())
      return InvalidArgument("field 'completion' must be a non-empty list of messages, as 'prompt' is");
    messages = line["prompt"];
    for (const ordered_json& m : line["completion"]) messages.push_back(m);
  } else if (line.contains("messages")) {
    messages = line["messages"];
  } else {
    return InvalidArgument("missing field 'messages'");
  }
  SLIDE_RETURN_IF_ERROR(CheckMessages(messages));
  if (line.contains("chat_template_kwargs") && !line["chat_template_kwargs"].is_object())
    return InvalidArgument("field 'chat_template_kwargs' must be an object");
  auto set_by_line = [](const std::string& key) {
    return InvalidArgument("field '" + key + "' is the trainer's to set, not a line's");
  };
  for (const auto& [key, value] : line.items())  // messages, tools and documents are the line's to give
    if (Reserved(key) && key != "messages" && key != "tools" && key != "documents") return set_by_line(key);
  if (line.contains("chat_template_kwargs"))
    for (const auto& [key, value] : line["chat_template_kwargs"].items())
      if (Reserved(key)) return set_by_line(key);
  auto render = [&](const ordered_json& msgs, bool generation_prompt) {
    return o.chat_template->Render(ChatTemplateVariables(line, msgs, o.special_tokens, generation_prompt), o.now);
  };

  ChatSample s;
  SLIDE_ASSIGN_OR_RETURN(s.text, render(messages, false));
  SLIDE_ASSIGN_OR_RETURN(s.ids, tok.Encode(s.text));
  if (o.train_on == TrainOn::kAll) {
    s.labels = s.ids;
    s.trained.emplace_back(0, s.text.size());
    return s;
  }

  if (prompt_completion) {  // as TRL trains it: all that the completion adds to the prompt with the generation prompt
    SLIDE_ASSIGN_OR_RETURN(std::string prompt, render(line["prompt"], true));
    size_t start = CommonPrefix(s.text, 0, prompt, 0);
    if (start < prompt.size()) start = ExtendByEnding(s.text, start, prompt.size(), prompt);
    if (start >= s.text.size()) return InvalidArgument("the completion adds nothing to the rendered prompt");
    s.trained.emplace_back(start, s.text.size());
  }

  std::vector<size_t> replies;
  for (size_t k = 0; k < messages.size() && !prompt_completion; ++k)
    if (messages[k]["role"] == "assistant") replies.push_back(k);
  if (replies.empty() && !prompt_completion) return InvalidArgument("'messages' has no assistant turn to train on");

  // Each reply's prompt: the conversation before it with the generation prompt.
  std::vector<std::string> prompts;
  for (size_t k : replies) {
    SLIDE_ASSIGN_OR_RETURN(std::string prompt, render(Prefix(messages, k), true));
    prompts.push_back(std::move(prompt));
  }
  size_t previous_end = 0;
  for (size_t r = 0; r < replies.size(); ++r) {
    const size_t k = replies[r];
    const std::string& prompt = prompts[r];
    SLIDE_ASSIGN_OR_RETURN(std::string last, render(Prefix(messages, k + 1), false));
    // The reply starts where the prompt ends in the conversation.
    size_t start = CommonPrefix(s.text, 0, prompt, 0);
    if (start < prompt.size()) start = ExtendByEnding(s.text, start, prompt.size(), prompt);
    start = std::max(start, previous_end);
    // The reply as the template renders it when it is the last turn, end-of-turn text included; it ends where the
    // conversation stops agreeing with it (all of it, for a prefix-preserving template), within the text before
    // the next reply's prompt.
    const std::string reply = last.substr(CommonPrefix(last, 0, prompt, 0));
    size_t end = start + CommonPrefix(s.text, start, reply, 0);
    if (end < start + reply.size()) {
      const size_t next_prompt = r + 1 < replies.size() ? CommonPrefix(s.text, 0, prompts[r + 1], 0) : s.text.size();
      if (next_prompt > end) end = ExtendByEnding(s.text, end, std::min(reply.size(), next_prompt - end), reply);
    }
    if (end <= start)
      return InvalidArgument("messages[" + std::to_string(k) + "] (assistant): its reply could not be located in " +
                             "the rendered conversation (the template " + o.chat_template->origin() +
                             " renders it differently once later turns follow); train_on: all trains every token");
    s.trained.emplace_back(start, end);
    previous_end = end;
  }

  s.labels.assign(s.ids.size(), kIgnore);
  for (const auto& [from, to] : s.trained) {
    SLIDE_ASSIGN_OR_RETURN(size_t t0, TokensBefore(tok, s.text, s.ids, from));
    SLIDE_ASSIGN_OR_RETURN(size_t t1, TokensBefore(tok, s.text, s.ids, to));
    for (size_t t = t0; t < t1; ++t) s.labels[t] = s.ids[t];
  }
  return s;
}

}  // namespace slide
