// The chat-template engine against transformers: every case in tests/fixtures/chat_templates/goldens.json (real
// templates of 23 models, each rendered for a set of conversations by transformers' render_jinja_template; see
// scripts/make_chat_goldens.py) rendered with the same variables and compared byte for byte, errors included; and
// every conversation of masks.json built into a sample (tokens and the assistant-only mask) as the reference did:
// TRL's prompt/completion masks where the template is prefix-preserving, the documented rule elsewhere.
#include "engine/data/chat_template.h"

#include "engine/data/chat_sample.h"
#include "engine/data/render_budget.h"
#include "engine/data/tokenizer.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

namespace slide {
namespace {

using nlohmann::ordered_json;

const std::string kDir = std::string(SLIDE_FIXTURES_DIR) + "/chat_templates/";

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const ordered_json& Goldens() {
  static const ordered_json goldens = ordered_json::parse(ReadFile(kDir + "goldens.json"));
  return goldens;
}

std::vector<std::string> TemplateNames() {
  std::vector<std::string> names;
  for (const auto& c : Goldens()["cases"]) {
    const std::string name = c["template"];
    if (names.empty() || names.back() != name) names.push_back(name);
  }
  return names;
}

// The instant the goldens' strftime_now used (2026-07-26 12:00), read back as local time in UTC.
std::time_t GoldenNow() {
  setenv("TZ", "UTC", 1);
  tzset();
  std::tm tm{};
  tm.tm_year = 2026 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 12;
  return timegm(&tm);
}

// Where two renderings first differ, with a little context, for a readable failure.
std::string FirstDifference(const std::string& want, const std::string& got) {
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "first difference at byte " + std::to_string(i) + "\n  want: " + ordered_json(want.substr(from, 80)).dump() +
         "\n  got:  " + ordered_json(got.substr(from, 80)).dump();
}

class TransformersGolden : public testing::TestWithParam<std::string> {};

TEST_P(TransformersGolden, RendersEveryCaseByteForByte) {
  const std::string name = GetParam();
  auto compiled = ChatTemplate::Compile(ReadFile(kDir + name), name);
  ASSERT_TRUE(compiled.ok()) << compiled.status().message();
  const std::time_t now = GoldenNow();
  int cases = 0;
  for (const auto& c : Goldens()["cases"]) {
    if (c["template"] != name) continue;
    ++cases;
    SCOPED_TRACE(c["case"].get<std::string>());
    StatusOr<std::string> got = (*compiled)->Render(c["variables"], now);
    if (c.contains("error")) {
      EXPECT_FALSE(got.ok()) << "transformers raised " << c["error"] << " but we rendered " << ordered_json(*got);
      continue;
    }
    ASSERT_TRUE(got.ok()) << got.status().message();
    const std::string want = c["rendered"];
    EXPECT_EQ(*got, want) << FirstDifference(want, *got);
  }
  EXPECT_GE(cases, 8);
}

INSTANTIATE_TEST_SUITE_P(Models, TransformersGolden, testing::ValuesIn(TemplateNames()),
                         [](const testing::TestParamInfo<std::string>& info) {
                           std::string n = info.param.substr(0, info.param.find(".jinja"));
                           for (char& ch : n)
                             if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

std::shared_ptr<const ChatTemplate> CompileFixture(const std::string& file) {
  auto t = ChatTemplate::Compile(ReadFile(kDir + file), file);
  EXPECT_TRUE(t.ok()) << t.status().message();
  return t.ok() ? *t : nullptr;
}

const ordered_json& Masks() {
  static const ordered_json masks = ordered_json::parse(ReadFile(kDir + "masks.json"));
  return masks;
}

const Tokenizer& FixtureTokenizer(const std::string& name) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> loaded;
  auto& t = loaded[name];
  if (!t) {
    auto got = Tokenizer::FromFile(std::string(SLIDE_FIXTURES_DIR) + "/tokenizers/" + name + "/tokenizer.json");
    EXPECT_TRUE(got.ok()) << got.status().message();
    t = std::move(*got);
  }
  return *t;
}

SpecialTokens TokensOf(const ordered_json& j) {
  SpecialTokens t;
  t.bos_token = j.value("bos_token", "");
  t.eos_token = j.value("eos_token", "");
  t.pad_token = j.value("pad_token", "");
  t.unk_token = j.value("unk_token", "");
  return t;
}

TEST_P(TransformersGolden, VariablesBuiltFromTheLineRenderAsTransformersDoes) {
  const std::string name = GetParam();
  auto compiled = ChatTemplate::Compile(ReadFile(kDir + name), name);
  ASSERT_TRUE(compiled.ok()) << compiled.status().message();
  for (const auto& c : Goldens()["cases"]) {
    if (c["template"] != name || c.contains("error")) continue;
    SCOPED_TRACE(c["case"].get<std::string>());
    // The dataset line the golden's variables came from: the messages, tools, and the extra keys.
    const ordered_json& v = c["variables"];
    ordered_json line = ordered_json::object();
    for (const auto& [key, value] : v.items())
      if (key != "add_generation_prompt" && key != "documents" && key.find("_token") == std::string::npos &&
          !(key == "tools" && value.is_null()))
        line[key] = value;
    const ordered_json built = ChatTemplateVariables(line, line["messages"], TokensOf(v), v["add_generation_prompt"]);
    auto got = (*compiled)->Render(built, GoldenNow());
    ASSERT_TRUE(got.ok()) << got.status().message();
    EXPECT_EQ(*got, c["rendered"].get<std::string>());
  }
}

TEST_P(TransformersGolden, AssistantMasksEqualTheReference) {
  const std::string name = GetParam();
  ChatSampleOptions o;
  o.chat_template = CompileFixture(name);
  GoldenNow();
  int compared = 0;
  for (const auto& c : Masks()["cases"]) {
    if (c["template"] != name) continue;
    SCOPED_TRACE(c["case"].get<std::string>() + (c.value("trl", false) ? " (TRL's masks)" : " (the rule's)"));
    o.special_tokens = TokensOf(c["special_tokens"]);
    o.now = GoldenNow();
    auto sample = BuildChatSample(c["line"], FixtureTokenizer(c["tokenizer"]), o);
    ASSERT_TRUE(sample.ok()) << sample.status().message();
    EXPECT_EQ(sample->text, c["text"].get<std::string>());
    ASSERT_EQ(sample->ids, c["ids"].get<std::vector<int32_t>>());
    std::vector<int32_t> want(sample->ids.size(), -100);
    for (const auto& range : c["trained"])
      for (int64_t t = range[0]; t < range[1].get<int64_t>(); ++t) want[t] = sample->ids[t];
    EXPECT_EQ(sample->labels, want);
    ++compared;
  }
  EXPECT_GE(compared, 1);
}

TEST(ChatSample, TrainOnAllTrainsEveryToken) {
  ChatSampleOptions o;
  o.chat_template = CompileFixture("Qwen-Qwen2.5-7B-Instruct.jinja");
  o.train_on = TrainOn::kAll;
  const ordered_json line = ordered_json::parse(R"({"messages": [{"role": "user", "content": "Hi"},
                                                                  {"role": "assistant", "content": "Hello"}]})");
  auto s = BuildChatSample(line, FixtureTokenizer("qwen2"), o);
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(s->labels, s->ids);
}

TEST(ChatSample, BadLinesGetPreciseErrors) {
  ChatSampleOptions o;
  o.chat_template = CompileFixture("Qwen-Qwen2.5-7B-Instruct.jinja");
  const Tokenizer& tok = FixtureTokenizer("qwen2");
  auto error = [&](const char* line) {
    auto s = BuildChatSample(ordered_json::parse(line), tok, o);
    return s.ok() ? std::string("(built)") : s.status().message();
  };
  EXPECT_EQ(error(R"({"text": "x"})"), "missing field 'messages'");
  EXPECT_EQ(error(R"({"messages": []})"), "field 'messages' must be a non-empty array");
  EXPECT_EQ(error(R"({"messages": [{"content": "x"}]})"), "messages[0] needs a string field 'role'");
  EXPECT_EQ(error(R"({"messages": [{"role": "user", "content": 3}]})"),
            "messages[0]: 'content' must be a string, a list or null");
  EXPECT_EQ(error(R"({"messages": [{"role": "user", "content": "x"}]})"),
            "'messages' has no assistant turn to train on");
  EXPECT_EQ(error(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                      "chat_template_kwargs": 1})"),
            "field 'chat_template_kwargs' must be an object");
  // A line cannot set what the trainer sets (transformers raises on the duplicate keyword).
  EXPECT_EQ(error(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                      "add_generation_prompt": true})"),
            "field 'add_generation_prompt' is the trainer's to set, not a line's");
  EXPECT_EQ(error(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
                      "chat_template_kwargs": {"eos_token": "<x>"}})"),
            "field 'eos_token' is the trainer's to set, not a line's");
  // The template's own refusal reaches the line's error.
  o.chat_template = CompileFixture("google-gemma-2-2b-it.jinja");
  EXPECT_NE(error(R"({"messages": [{"role": "system", "content": "x"}, {"role": "user", "content": "y"},
                                   {"role": "assistant", "content": "z"}]})")
                .find("System role not supported"),
            std::string::npos);
}

TEST(ChatTemplate, SyntaxErrorNamesTheOriginAndLine) {
  auto t = ChatTemplate::Compile("{% for m in messages %}\n{{ m.content }\n{% endfor %}", "model/chat_template.jinja");
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(t.status().message().find("model/chat_template.jinja"), std::string::npos) << t.status().message();
  EXPECT_NE(t.status().message().find("line 2, column 14"), std::string::npos) << t.status().message();
  // Far from the start (the engine shows only the 40 bytes around the error).
  auto far = ChatTemplate::Compile(
      "{#- a long comment line to push the error well past the first forty bytes #}\n"
      "{%- set x = 1 %}\nplain text here\n{{ messages | }}\n",
      "t.jinja");
  ASSERT_FALSE(far.ok());
  EXPECT_NE(far.status().message().find("line 4, column 1"), std::string::npos) << far.status().message();
}

// The engine looks filters, tests, methods and functions up only when an expression runs: one it lacks, in a branch
// that only some lines reach, must still fail the job at submission, naming the line and the construct.
TEST(ChatTemplate, UnsupportedConstructsFailAtCompileWithLineAndName) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a\n{% if false %}{{ messages[0].content | no_such_filter }}{% endif %}",
       "line 2, column 40: filter 'no_such_filter'"},
      {"{% for m in messages %}\n\n{% if m is no_such_test %}x{% endif %}{% endfor %}",
       "line 3, column 12: test 'is no_such_test'"},
      {"{% if add_generation_prompt %}\n  {{ messages[0].content.no_such_method(1) }}{% endif %}",
       "line 2, column 26: method 'no_such_method()'"},
      {"{{ lipsum(2) }}", "line 1, column 4: function 'lipsum'"},
      {"{% filter no_such_block_filter %}x{% endfilter %}", "filter 'no_such_block_filter'"},
      {"{{ [1, {'k': messages | no_such_in_literal}] }}", "filter 'no_such_in_literal'"},
  };
  for (const auto& [source, want] : cases) {
    SCOPED_TRACE(source);
    auto t = ChatTemplate::Compile(source, "model/chat_template.jinja");
    ASSERT_FALSE(t.ok());
    EXPECT_EQ(t.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(t.status().message().find("model/chat_template.jinja"), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find(want), std::string::npos) << t.status().message();
    EXPECT_NE(t.status().message().find("not supported by the template engine"), std::string::npos)
        << t.status().message();
  }
}

// What the check must let through: the engine's aliases, methods on strings, lists and dicts, the template's own
// macros (also passed by name, and `caller` in a call block), names it binds, and the globals transformers passes.
TEST(ChatTemplate, SupportedConstructsCompile) {
  const char* source =
      "{%- macro render(m, prefix='') -%}{{ prefix }}{{ m.content | trim | d('') }}{%- endmacro -%}"
      "{%- macro wrap() -%}[{{ caller() }}]{%- endmacro -%}"
      "{%- set r = render -%}{%- set ns = namespace(n=0) -%}"
      "{%- for m in messages if m.role is defined and m is mapping -%}"
      "{{ r(m) }}{{ m.content.startswith('x') }}{{ m.items() | list | count }}{{ (messages | map(attribute='role') | "
      "join(',')).split(',') | length }}{%- call wrap() -%}{{ loop.index0 is divisibleby(2) }}{%- endcall -%}"
      "{%- endfor -%}{{ raise_exception('x') if false }}{{ strftime_now('%Y') }}{{ range(3) | list | tojson }}";
  auto t = ChatTemplate::Compile(source, "t.jinja");
  ASSERT_TRUE(t.ok()) << t.status().message();
}

TEST(ChatTemplate, RaiseExceptionIsAnErrorWithTheTemplatesMessage) {
  auto t = ChatTemplate::Compile("{{ raise_exception('System role not supported') }}", "t.jinja");
  ASSERT_TRUE(t.ok());
  auto r = (*t)->Render(ordered_json::object());
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("System role not supported"), std::string::npos) << r.status().message();
}

TEST(ChatTemplate, VariablesMustBeAnObject) {
  auto t = ChatTemplate::Compile("x", "t.jinja");
  ASSERT_TRUE(t.ok());
  EXPECT_FALSE((*t)->Render(ordered_json::array()).ok());
}

// Templates are programs from the model directory: ones that recurse, nest or grow without end fail with an error
// naming the limit (the process would otherwise die of a stack overflow or run out of memory).
TEST(ChatTemplate, RunawayTemplatesFailWithAnError) {
  auto render = [](const std::string& source) -> std::string {
    auto t = ChatTemplate::Compile(source, "evil.jinja");
    if (!t.ok()) return t.status().message();
    auto r = (*t)->Render(ordered_json{{"messages", ordered_json::array()}});
    return r.ok() ? "(rendered " + std::to_string(r->size()) + " bytes)" : r.status().message();
  };
  const std::string parens = "{{ " + std::string(50000, '(') + "1" + std::string(50000, ')') + " }}";
  EXPECT_NE(render(parens).find("nests deeper than 64 levels"), std::string::npos) << render(parens);
  std::string ifs;
  for (int i = 0; i < 20000; ++i) ifs += "{% if true %}";
  EXPECT_NE(render(ifs + "x").find("line 1, column "), std::string::npos);
  EXPECT_NE(render(ifs + "x").find("nests deeper than 64 levels"), std::string::npos);
  EXPECT_NE(render("{{ " + std::string(100000, '-') + "1 }}").find("nests deeper"), std::string::npos);
  EXPECT_NE(render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}").find("went past its limit of stack depth"),
            std::string::npos)
      << render("{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}");
  EXPECT_NE(render("{{ 'a' * 4000000000 }}").find("went past its limit of memory"), std::string::npos)
      << render("{{ 'a' * 4000000000 }}");
  EXPECT_NE(render("{% for i in range(2000000000) %}{% endfor %}").find("went past its limit of memory"),
            std::string::npos);
  const std::string doubling =
      "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}{{ ns.s | length }}";
  EXPECT_NE(render(doubling).find("went past its limit of memory"), std::string::npos) << render(doubling);
  // And the same engine renders a legitimate template afterwards.
  EXPECT_EQ(render("{% for i in range(3) %}{{ i }}{% endfor %}"), "(rendered 3 bytes)");
}

TEST(RenderBudget, BoundsTimeAndRefundsWhatItFrees) {
  RenderBudget::Limits limits;
  limits.seconds = 0.05;
  limits.bytes = size_t{64} << 20;
  {
    RenderBudget budget(limits);
    bool refused = false;
    try {
      for (;;) delete new std::string(100, 'x');  // live memory stays small: only the clock stops it
    } catch (const std::bad_alloc&) {
      refused = true;
    }
    EXPECT_TRUE(refused);
    EXPECT_EQ(budget.exceeded(), "time (0 s)");
  }
  auto* outside = new std::vector<char>(size_t{128} << 20);  // no budget outside the scope
  delete outside;
}

}  // namespace
}  // namespace slide
