#include "engine/data/tokenizer_components.h"

#include <climits>
#include <nlohmann/json.hpp>

namespace slide::tokenizer_detail {

using nlohmann::json;

// A token id: an integer in [0, 2^31). get<int32_t> on a float or a larger number is undefined behaviour (found by
// the tokenizer.json fuzzer: an id of 2.2e48); this throws the JSON library's type_error instead, which FromJson
// reports as a malformed file.
int32_t TokenIdValue(const json& v) {
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > INT32_MAX ||
      (v.is_number_unsigned() && v.get<uint64_t>() > INT32_MAX))
    throw json::type_error::create(302, "token id " + v.dump() + " is not an integer in [0, 2^31)", &v);
  return static_cast<int32_t>(v.get<int64_t>());
}

Status ParseNormalizer(const json& n, std::vector<NormalizerStep>& out) {
  if (n.is_null()) return Status::Ok();
  const std::string type = n.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : n.at("normalizers")) SLIDE_RETURN_IF_ERROR(ParseNormalizer(s, out));
  } else if (type == "NFC") {
    out.push_back({NormalizerStep::kNfc, "", ""});
  } else if (type == "Prepend") {
    out.push_back({NormalizerStep::kPrepend, n.at("prepend").get<std::string>(), ""});
  } else if (type == "Replace") {
    if (!n.at("pattern").contains("String"))
      return InvalidArgument("Replace normalizer with a regex pattern is not supported");
    out.push_back({NormalizerStep::kReplace, n.at("pattern").at("String").get<std::string>(),
                   n.at("content").get<std::string>()});
  } else {
    return InvalidArgument("normalizer '" + type + "' is not supported (supported: NFC, Prepend, Replace, Sequence)");
  }
  return Status::Ok();
}

Status ParsePreTokenizer(const json& p, std::vector<PreTokenizerStep>& out) {
  if (p.is_null()) return Status::Ok();
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : p.at("pretokenizers")) SLIDE_RETURN_IF_ERROR(ParsePreTokenizer(s, out));
  } else if (type == "Split") {
    if (!p.at("pattern").contains("Regex") && !p.at("pattern").contains("String"))
      return InvalidArgument("Split pre-tokenizer without a pattern");
    if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
      return InvalidArgument("Split pre-tokenizer behavior '" + p.value("behavior", "") +
                             "' is not supported (Isolated)");
    std::string pattern = p.at("pattern").contains("Regex") ? p.at("pattern").at("Regex").get<std::string>()
                                                            : p.at("pattern").at("String").get<std::string>();
    PreTokenizerStep s{PreTokenizerStep::kSplit};
    SLIDE_ASSIGN_OR_RETURN(s.regex, Regex::Compile(pattern));
    out.push_back(s);
  } else if (type == "ByteLevel") {
    PreTokenizerStep s{PreTokenizerStep::kByteLevel};
    s.add_prefix_space = p.value("add_prefix_space", false);
    if (p.value("use_regex", true)) {
      SLIDE_ASSIGN_OR_RETURN(s.regex, Regex::Compile(kGpt2Pattern));
    }
    out.push_back(s);
  } else if (type == "Metaspace") {
    PreTokenizerStep s{PreTokenizerStep::kMetaspace};
    s.replacement = p.value("replacement", s.replacement);
    s.prepend_scheme = p.value("prepend_scheme", p.value("add_prefix_space", true) ? "always" : "never");
    s.split = p.value("split", true);
    out.push_back(s);
  } else {
    return InvalidArgument("pre-tokenizer '" + type +
                           "' is not supported (supported: Split, ByteLevel, Metaspace, Sequence)");
  }
  return Status::Ok();
}

Status ParseDecoder(const json& d, std::vector<DecoderStep>& out) {
  if (d.is_null()) return Status::Ok();
  const std::string type = d.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : d.at("decoders")) SLIDE_RETURN_IF_ERROR(ParseDecoder(s, out));
  } else if (type == "ByteLevel") {
    out.push_back({DecoderStep::kByteLevel});
  } else if (type == "Metaspace") {
    DecoderStep s{DecoderStep::kMetaspace};
    s.a = d.value("replacement", "\xE2\x96\x81");
    s.prepend_scheme = d.value("prepend_scheme", d.value("add_prefix_space", true) ? "always" : "never");
    out.push_back(s);
  } else if (type == "Replace") {
    if (!d.at("pattern").contains("String"))
      return InvalidArgument("Replace decoder with a regex pattern is not supported");
    out.push_back(
        {DecoderStep::kReplace, d.at("pattern").at("String").get<std::string>(), d.at("content").get<std::string>()});
  } else if (type == "ByteFallback") {
    out.push_back({DecoderStep::kByteFallback});
  } else if (type == "Fuse") {
    out.push_back({DecoderStep::kFuse});
  } else if (type == "Strip") {
    DecoderStep s{DecoderStep::kStrip, d.value("content", " "), ""};
    s.start = d.value("start", 0);
    s.stop = d.value("stop", 0);
    out.push_back(s);
  } else {
    return InvalidArgument("decoder '" + type + "' is not supported");
  }
  return Status::Ok();
}

Status ParsePostProcessor(const json& p, std::vector<int32_t>& prefix, std::vector<int32_t>& suffix) {
  if (p.is_null()) return Status::Ok();
  const std::string type = p.value("type", "");
  if (type == "Sequence") {
    for (const auto& s : p.at("processors")) SLIDE_RETURN_IF_ERROR(ParsePostProcessor(s, prefix, suffix));
  } else if (type == "ByteLevel") {
    // offsets only
  } else if (type == "TemplateProcessing") {
    bool seen_a = false;
    for (const auto& item : p.at("single")) {
      if (item.contains("Sequence")) {
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        const std::string name = item.at("SpecialToken").at("id").get<std::string>();
        const auto& st = p.at("special_tokens");
        if (!st.contains(name)) return InvalidArgument("template names special token '" + name + "' without ids");
        for (const auto& id : st.at(name).at("ids")) (seen_a ? suffix : prefix).push_back(TokenIdValue(id));
      }
    }
  } else {
    return InvalidArgument("post-processor '" + type + "' is not supported");
  }
  return Status::Ok();
}

}  // namespace slide::tokenizer_detail
