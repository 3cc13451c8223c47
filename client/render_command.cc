#include "client/render_command.h"

#include <cstdio>
#include <fstream>

#include "client/terminal_text.h"
#include "engine/data/dataset.h"
#include "engine/data/tokenizer.h"
#include "proto/enum_short_names.h"

namespace slidectl {
namespace {

// A JobSpec choice as the engine's enum, through the value's short name (UNSPECIFIED: the engine's default).
template <typename E>
slide::StatusOr<E> Choice(const google::protobuf::EnumDescriptor* type, int number, E engine_default,
                          slide::StatusOr<E> (*parse)(const std::string&)) {
  if (number == 0) return engine_default;
  const auto* value = type->FindValueByNumber(number);
  if (value == nullptr)
    return slide::InvalidArgument("unknown value " + std::to_string(number) + " of " + type->name());
  return parse(slide::v1::EnumShortName(value));
}

// The sample's text, run by run of trained and untrained tokens, the trained runs marked.
void PrintSample(const slide::Tokenizer& tok, const slide::LineSample& s, bool color) {
  std::string out;
  size_t t = 0;
  while (t < s.ids.size()) {
    const bool trained = s.labels[t] != -100;
    size_t end = t;
    while (end < s.ids.size() && (s.labels[end] != -100) == trained) ++end;
    const std::string text = Printable(
        tok.Decode({s.ids.begin() + static_cast<std::ptrdiff_t>(t), s.ids.begin() + static_cast<std::ptrdiff_t>(end)}),
        /*keep_newlines=*/true);
    if (trained)
      out += (color ? "\x1b[32m" : "\u27e6") + text + (color ? "\x1b[0m" : "\u27e7");
    else
      out += text;
    t = end;
  }
  std::printf("%s\n", out.c_str());
}

}  // namespace

std::string RenderJobLines(const slide::v1::JobSpec& spec, const RenderOptions& o) {
  if (o.first_line < 1 || o.lines < 1) return "--line and --lines must be at least 1";
  auto format = Choice(slide::v1::DatasetFormat_descriptor(), spec.dataset_format(), slide::DatasetFormat::kAuto,
                       &slide::ParseDatasetFormat);
  auto choice = Choice(slide::v1::ChatTemplate_descriptor(), spec.chat_template(), slide::ChatTemplateChoice::kAuto,
                       &slide::ParseChatTemplateChoice);
  auto train_on =
      Choice(slide::v1::TrainOn_descriptor(), spec.train_on(), slide::TrainOn::kAssistant, &slide::ParseTrainOn);
  for (const slide::Status& s : {format.status(), choice.status(), train_on.status()})
    if (!s.ok()) return s.message();
  auto tokenizer = slide::Tokenizer::FromFile(spec.model_dir() + "/tokenizer.json");
  if (!tokenizer.ok()) return tokenizer.status().message();
  auto options = slide::ModelDatasetOptions(spec.model_dir(), **tokenizer, *format, *choice, *train_on);
  if (!options.ok()) return options.status().message();
  std::ifstream in(spec.dataset());
  if (!in) return spec.dataset() + ": cannot open dataset";

  std::string line;
  int64_t number = 0, shown = 0;
  while (shown < o.lines && std::getline(in, line)) {
    ++number;
    if (number < o.first_line || line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++shown;
    auto sample = slide::BuildLineSample(line, **tokenizer, *options);
    if (!sample.ok()) {
      std::printf("%s:%lld: %s\n\n", Printable(spec.dataset()).c_str(), static_cast<long long>(number),
                  Printable(sample.status().message(), true).c_str());
      continue;
    }
    int64_t trained = 0;
    for (int32_t l : sample->labels) trained += l != -100;
    std::printf("%s:%lld: %s, %zu tokens, %lld trained\n", Printable(spec.dataset()).c_str(),
                static_cast<long long>(number), slide::DatasetFormatName(sample->format), sample->ids.size(),
                static_cast<long long>(trained));
    PrintSample(**tokenizer, *sample, o.color);
    std::printf("\n");
  }
  if (shown == 0) return spec.dataset() + ": no non-empty line at or after line " + std::to_string(o.first_line);
  return "";
}

}  // namespace slidectl
