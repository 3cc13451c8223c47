#include "engine/data/chat_template.h"

#include <nlohmann/json.hpp>

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

std::string LineAndColumn(const std::string& source, size_t pos) {
  size_t line = 1, column = 1;
  for (size_t i = 0; i < pos && i < source.size(); ++i) {
    if (source[i] == '\n') {
      ++line;
      column = 1;
    } else {
      ++column;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(column);
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
  if (offset < kPeek) return LineAndColumn(source, offset);
  // The snippet starts kPeek bytes before the error: find it in the source (its first occurrence).
  std::string snippet = what.substr(snippet_line == std::string::npos ? 0 : snippet_line + 1);
  snippet = snippet.substr(3, snippet.find('\n') - 3);
  for (size_t at; (at = snippet.find("\u21b5")) != std::string::npos;) snippet.replace(at, 3, "\n");
  if (snippet.size() >= 3 && snippet.compare(snippet.size() - 3, 3, "...") == 0) snippet.resize(snippet.size() - 3);
  const size_t start = source.find(snippet);
  return start == std::string::npos ? "" : LineAndColumn(source, start + offset);
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
  return LineAndColumn(lexed.source, lexed.tokens[lo - 1].pos);
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
  jinja::lexer_result lexed;
  try {
    lexed = jinja::lexer().tokenize(source);
  } catch (const std::exception& e) {
    return error(e.what(), LineOfCaret(source, e.what()));
  }
  try {
    impl->program = jinja::parse_from_tokens(lexed);
  } catch (const std::exception& e) {
    std::string where = LineOfCaret(source, e.what());
    if (where.empty()) where = LineOfFailingToken(lexed);
    return error(e.what(), where);
  }
  return std::shared_ptr<const ChatTemplate>(new ChatTemplate(std::move(impl)));
}

StatusOr<std::string> ChatTemplate::Render(const nlohmann::ordered_json& variables, std::time_t now) const {
  if (!variables.is_object()) return InvalidArgument("chat template variables must be a JSON object");
  try {
    jinja::context ctx(impl_->source);
    if (now != 0) ctx.current_time = now;
    // The engine reads its own JSON type; the text round trip keeps the two libraries apart.
    jinja::global_from_json(ctx, common_json::parse(variables.dump()), /*mark_input=*/false);
    jinja::runtime runtime(ctx);
    const jinja::value_string parts = jinja::runtime::gather_string_parts(runtime.execute(impl_->program));
    std::string out;
    for (const auto& part : parts->as_string().parts) out += part.val;
    return out;
  } catch (const std::exception& e) {
    return InvalidArgument("chat template " + impl_->origin + ": " + Tidy(e.what()));
  }
}

}  // namespace slide
