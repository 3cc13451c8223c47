#include "engine/data/chat_template.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "engine/common/files.h"
#include "engine/data/json_file.h"
#include "engine/data/render_budget.h"
#include "engine/data/template_support.h"
#include "engine/data/tokenizer.h"
#include "jinja/lexer.h"
#include "jinja/parser.h"
#include "jinja/runtime.h"
#include "jinja/value.h"
#include "json.h"

namespace slide {
namespace {

// The engine's messages start with a newline and a rule; the first line of the rest is the useful summary, the
// following lines show the source around the error.
std::string Tidy(std::string what) {
  const size_t first = what.find_first_not_of("\n-");
  return first == std::string::npos ? what : what.substr(first);
}

// The lexer's and parser's errors show the source around the error rather than its line: their last two lines are
// "...<up to 40 bytes before and after, newlines shown as ↵>..." and a caret under the error. Reads the error's
// offset back from them (the snippet starts 40 bytes before the error, or at the start of the source), so that a
// compile error names its line as a rendering error does. Empty when the message has no such tail.
std::string LineOfCaret(const std::string& source, const std::string& what) {
  constexpr size_t kPeek = 40;  // the engine's peak_source window
  const size_t caret_line = what.rfind('\n');
  if (caret_line == std::string::npos || what.back() != '^') return "";
  const size_t caret = what.size() - 1 - (caret_line + 1);  // columns before '^' (3 of them for the "...")
  const size_t snippet_line = what.rfind('\n', caret_line - 1);
  if (caret < 3) return "";
  const size_t offset = caret - 3;
  if (offset < kPeek) return TemplateLineAndColumn(source, offset);
  // The snippet starts kPeek bytes before the error: find it in the source (its first occurrence).
  std::string snippet = what.substr(snippet_line == std::string::npos ? 0 : snippet_line + 1);
  snippet = snippet.substr(3, snippet.find('\n') - 3);
  for (size_t at; (at = snippet.find("\u21b5")) != std::string::npos;) snippet.replace(at, 3, "\n");
  if (snippet.size() >= 3 && snippet.compare(snippet.size() - 3, 3, "...") == 0) snippet.resize(snippet.size() - 3);
  const size_t start = source.find(snippet);
  return start == std::string::npos ? "" : TemplateLineAndColumn(source, start + offset);
}

// Some parser errors carry no position at all. The parser reads left to right, so the error lies at the first token
// whose inclusion makes a prefix of the token list fail other than for running out of tokens (binary search).
std::string LineOfFailingToken(const jinja::lexer_result& lexed) {
  auto fails_before_its_end = [&](size_t n) {
    jinja::lexer_result prefix{{lexed.tokens.begin(), lexed.tokens.begin() + static_cast<std::ptrdiff_t>(n)},
                               lexed.source};
    try {
      jinja::parse_from_tokens(prefix);
      return false;
    } catch (const std::exception& e) {
      const std::string what = e.what();
      return what.find("Unexpected EOF") == std::string::npos && what.find("(Got )") == std::string::npos;
    }
  };
  size_t lo = 1, hi = lexed.tokens.size();
  if (hi == 0 || !fails_before_its_end(hi)) return "";
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (fails_before_its_end(mid))
      hi = mid;
    else
      lo = mid + 1;
  }
  return TemplateLineAndColumn(lexed.source, lexed.tokens[lo - 1].pos);
}

// The parser recurses once per nested bracket, block and unary operator without allocating on the way down, where
// a RenderBudget could stop it: such nesting is bounded here, on the tokens, before parsing. Real templates nest a
// few levels deep.
constexpr int kMaxNesting = 64;
std::string TooDeep(const jinja::lexer_result& lexed) {
  int brackets = 0, blocks = 0, unary = 0;
  bool after_open_statement = false;
  for (const jinja::token& t : lexed.tokens) {
    switch (t.t) {
      case jinja::token::open_paren:
      case jinja::token::open_square_bracket:
      case jinja::token::open_curly_bracket:
        ++brackets;
        break;
      case jinja::token::close_paren:
      case jinja::token::close_square_bracket:
      case jinja::token::close_curly_bracket:
        brackets = std::max(0, brackets - 1);
        break;
      case jinja::token::unary_operator:
        ++unary;
        break;
      case jinja::token::identifier:
        if (t.value == "not") ++unary;
        if (after_open_statement) {
          if (t.value == "if" || t.value == "for" || t.value == "macro" || t.value == "call" || t.value == "filter")
            ++blocks;
          else if (t.value.rfind("end", 0) == 0)
            blocks = std::max(0, blocks - 1);
        }
        break;
      case jinja::token::open_expression:
      case jinja::token::close_expression:
      case jinja::token::close_statement:
        unary = 0;
        break;
      default:
        break;
    }
    after_open_statement = t.t == jinja::token::open_statement;
    if (brackets > kMaxNesting || blocks > kMaxNesting || unary > kMaxNesting)
      return TemplateLineAndColumn(lexed.source, t.pos) + ": nests deeper than " + std::to_string(kMaxNesting) +
             " levels (brackets, blocks or unary operators)";
  }
  return "";
}

// Untrusted template code runs within these (RenderBudget): far above what a real template needs.
RenderBudget::Limits TemplateLimits() { return RenderBudget::Limits{}; }

Status TooLarge(const std::string& origin, const RenderBudget& budget) {
  return InvalidArgument("chat template " + origin + ": compiling it went past its limit of " + budget.exceeded());
}

}  // namespace

struct ChatTemplate::Impl {
  std::string origin;
  std::string source;
  jinja::program program;
};

ChatTemplate::ChatTemplate(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ChatTemplate::~ChatTemplate() = default;
const std::string& ChatTemplate::origin() const { return impl_->origin; }
const std::string& ChatTemplate::source() const { return impl_->source; }

StatusOr<std::shared_ptr<const ChatTemplate>> ChatTemplate::Compile(const std::string& source,
                                                                    const std::string& origin) {
  auto impl = std::make_unique<Impl>();
  impl->origin = origin;
  impl->source = source;
  auto error = [&](const std::string& what, const std::string& where) {
    return InvalidArgument("chat template " + origin + (where.empty() ? "" : ", " + where) + ": " + Tidy(what));
  };
  RenderBudget budget(TemplateLimits());
  jinja::lexer_result lexed;
  try {
    lexed = jinja::lexer().tokenize(source);
  } catch (const std::exception& e) {
    budget.End();
    if (!budget.exceeded().empty()) return TooLarge(origin, budget);
    return error(e.what(), LineOfCaret(source, e.what()));
  }
  if (const std::string deep = TooDeep(lexed); !deep.empty()) {
    budget.End();
    return InvalidArgument("chat template " + origin + ", " + deep);
  }
  try {
    impl->program = jinja::parse_from_tokens(lexed);
  } catch (const std::exception& e) {
    budget.End();
    if (!budget.exceeded().empty()) return TooLarge(origin, budget);
    std::string where = LineOfCaret(source, e.what());
    if (where.empty()) where = LineOfFailingToken(lexed);
    return error(e.what(), where);
  }
  if (const std::string unsupported = FirstUnsupportedConstruct(impl->program, source); !unsupported.empty())
    return InvalidArgument("chat template " + origin + ", " + unsupported);
  return std::shared_ptr<const ChatTemplate>(new ChatTemplate(std::move(impl)));
}

StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& variables, std::time_t now) const {
  if (!variables.is_object()) return InvalidArgument("chat template variables must be a JSON object");
  // The engine reads its own JSON type; the text round trip keeps the two libraries apart. The variables are the
  // caller's data, converted before the template's budget starts.
  common_json converted;
  try {
    converted = common_json::parse(variables.dump());
  } catch (const std::exception& e) {
    return InvalidArgument(std::string("chat template variables: ") + e.what());
  }
  RenderBudget budget(TemplateLimits());
  try {
    jinja::context ctx(impl_->source);
    if (now != 0) ctx.current_time = now;
    jinja::global_from_json(ctx, converted, /*mark_input=*/false);
    jinja::runtime runtime(ctx);
    const jinja::value_string parts = jinja::runtime::gather_string_parts(runtime.execute(impl_->program));
    std::string out;
    for (const auto& part : parts->as_string().parts) out += part.val;
    return out;
  } catch (const std::exception& e) {
    budget.End();
    if (!budget.exceeded().empty())
      return InvalidArgument("chat template " + impl_->origin + ": rendering went past its limit of " +
                             budget.exceeded() + " (a template that recurses, loops or grows a value without end)");
    return InvalidArgument("chat template " + impl_->origin + ": " + Tidy(e.what()));
  }
}

namespace {

// The built-in fallbacks render what the engine's earlier hand-written formats produced (no trimming of content).
constexpr const char* kLlama3Template =
    "<|begin_of_text|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}";
constexpr const char* kChatMLTemplate =
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";

}  // namespace

StatusOr<ChatTemplateChoice> ParseChatTemplateChoice(const std::string& name) {
  if (name == "auto") return ChatTemplateChoice::kAuto;
  if (name == "llama3") return ChatTemplateChoice::kLlama3;
  if (name == "chatml" || name == "qwen") return ChatTemplateChoice::kChatML;
  return InvalidArgument("unknown chat template '" + name + "' (auto, llama3, chatml)");
}

const char* ChatTemplateChoiceName(ChatTemplateChoice choice) {
  switch (choice) {
    case ChatTemplateChoice::kAuto:
      return "auto";
    case ChatTemplateChoice::kLlama3:
      return "llama3";
    case ChatTemplateChoice::kChatML:
      return "chatml";
  }
  return "?";
}

StatusOr<std::shared_ptr<const ChatTemplate>> LoadModelChatTemplate(const std::string& model_dir) {
  const std::string jinja_path = model_dir + "/chat_template.jinja";
  if (PathExists(jinja_path)) {
    SLIDE_ASSIGN_OR_RETURN(std::string source, ReadFileToString(jinja_path));
    return ChatTemplate::Compile(source, jinja_path);
  }
  const std::string config_path = model_dir + "/tokenizer_config.json";
  SLIDE_ASSIGN_OR_RETURN(nlohmann::json config, ReadOptionalJsonObject(config_path));
  if (config.is_null()) return NotFound(model_dir + " has neither chat_template.jinja nor tokenizer_config.json");
  if (!config.contains("chat_template") || config["chat_template"].is_null())
    return NotFound(model_dir + " has no chat template (no chat_template.jinja, no chat_template in " + config_path +
                    ")");
  const nlohmann::json& t = config["chat_template"];
  if (t.is_string()) return ChatTemplate::Compile(t.get<std::string>(), config_path + " (chat_template)");
  if (t.is_array()) {  // named templates, as some tool-use models ship them: transformers takes "default"
    for (const auto& entry : t) {
      if (entry.is_object() && entry.value("name", "") == "default" && entry.contains("template") &&
          entry["template"].is_string())
        return ChatTemplate::Compile(entry["template"].get<std::string>(), config_path + " (chat_template: default)");
    }
    return InvalidArgument(config_path + ": chat_template is a list without an entry named \"default\"");
  }
  return InvalidArgument(config_path + ": chat_template must be a string or a list of {name, template}");
}

StatusOr<std::shared_ptr<const ChatTemplate>> ResolveChatTemplate(ChatTemplateChoice choice,
                                                                  const std::string& model_dir) {
  switch (choice) {
    case ChatTemplateChoice::kLlama3:
      return ChatTemplate::Compile(kLlama3Template, "the built-in llama3 template");
    case ChatTemplateChoice::kChatML:
      return ChatTemplate::Compile(kChatMLTemplate, "the built-in chatml template");
    case ChatTemplateChoice::kAuto:
      break;
  }
  auto own = LoadModelChatTemplate(model_dir);
  if (own.ok() || own.status().code() != StatusCode::kNotFound) return own;
  return InvalidArgument("job field 'chat_template' is auto, but " + own.status().message() +
                         "; name a built-in one (llama3 or chatml) for this model");
}

Status CheckChatTemplateTokens(ChatTemplateChoice choice, const Tokenizer& tokenizer) {
  std::vector<const char*> needed;
  if (choice == ChatTemplateChoice::kLlama3)
    needed = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  if (choice == ChatTemplateChoice::kChatML) needed = {"<|im_start|>", "<|im_end|>"};
  for (const char* token : needed)
    if (tokenizer.TokenId(token) < 0)
      return InvalidArgument(std::string("chat template ") + ChatTemplateChoiceName(choice) + " needs token " + token +
                             ", which the tokenizer lacks");
  return Status::Ok();
}

}  // namespace slide
