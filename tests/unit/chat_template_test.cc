// The chat-template engine against transformers: every case in tests/fixtures/chat_templates/goldens.json (real
// templates of 20 models, each rendered for a set of conversations by transformers' render_jinja_template; see
// scripts/make_chat_goldens.py) rendered with the same variables and compared byte for byte, errors included.
#include "engine/data/chat_template.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

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

TEST(ChatTemplate, UnknownFilterFailsTheRenderWithItsNameAndLine) {
  auto t = ChatTemplate::Compile("a\n{{ messages[0].content | no_such_filter }}", "t.jinja");
  ASSERT_TRUE(t.ok()) << t.status().message();
  auto r = (*t)->Render(ordered_json{{"messages", {{{"role", "user"}, {"content", "x"}}}}});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("no_such_filter"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("line 2"), std::string::npos) << r.status().message();
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

}  // namespace
}  // namespace slide
