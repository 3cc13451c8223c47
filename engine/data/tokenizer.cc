#include "engine/data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <climits>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <unordered_map>

#include "engine/common/files.h"
#include "engine/common/utf8.h"

namespace slide {
namespace {

using nlohmann::json;

// Every occurrence of `from` replaced by `to` (an empty `from` matches nothing).
std::string ReplaceAll(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string r;
  for (size_t pos = 0;;) {
    const size_t hit = s.find(from, pos);
    if (hit == std::string::npos) return r.append(s, pos, std::string::npos);
    r.append(s, pos, hit - pos).append(to);
    pos = hit + from.size();
  }
}

// ---- UTF-8 helpers --------------------------------------------------------------------------------------

void AppendUtf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

uint32_t DecodeUtf8(std::string_view s, size_t& i) {
  unsigned char c = s[i];
  size_t n = Utf8Len(c);
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  i += n;
  return cp;
}

// GPT-2's reversible byte -> printable code point map used by ByteLevel.
struct ByteLevelTable {
  uint32_t byte_to_cp[256];
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  std::string byte_to_str[256];
  ByteLevelTable() {
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      byte_to_cp[b] = printable ? b : 256 + n++;
      cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
      AppendUtf8(byte_to_str[b], byte_to_cp[b]);
    }
  }
};
const ByteLevelTable& ByteLevel() {
  static const ByteLevelTable table;
  return table;
}

const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// ---- regex (PCRE2, Unicode properties on) ---------------------------------------------------------------

class Regex {
 public:
  static StatusOr<std::shared_ptr<Regex>> Compile(const std::string& pattern) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                     PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof(msg));
      return InvalidArgument("regex '" + pattern + "' does not compile at offset " + std::to_string(offset) + ": " +
                             reinterpret_cast<char*>(msg));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // optional speed-up; falls back to the interpreter
    auto r = std::shared_ptr<Regex>(new Regex());
    r->code_ = code;
    return r;
  }
  ~Regex() { pcre2_code_free(code_); }

  // Isolated split: every match and every gap between matches becomes a piece.
  void Split(std::string_view s, std::vector<std::string>& out) const {
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    size_t pos = 0, last = 0;
    while (pos <= s.size()) {
      int rc =
          pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), pos, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc < 0) break;
      PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      size_t b = ov[0], e = ov[1];
      if (b > last) out.emplace_back(s.substr(last, b - last));
      if (e > b) out.emplace_back(s.substr(b, e - b));
      last = e;
      if (e == b) {
        if (e >= s.size()) break;
        pos = e + Utf8Len(static_cast<unsigned char>(s[e]));  // empty match: step one character
      } else {
        pos = e;
      }
    }
    if (last < s.size()) out.emplace_back(s.substr(last));
    pcre2_match_data_free(md);
  }

 private:
  Regex() = default;
  pcre2_code* code_ = nullptr;
};

// ---- pipeline components --------------------------------------------------------------------------------

struct NormalizerStep {
  enum Kind { kNfc, kPrepend, kReplace } kind;
  std::string a, b;  // prepend: a; replace: a -> b
};

struct PreTokenizerStep {
  enum Kind { kSplit, kByteLevel, kMetaspace } kind;
  std::shared_ptr<Regex> regex = nullptr;  // split, or byte-level with use_regex
  bool add_prefix_space = false;
  std::string replacement = "\xE2\x96\x81";  // metaspace "▁"
  std::string prepend_scheme = "always";
  bool split = true;
};

struct DecoderStep {
  enum Kind { kByteLevel, kMetaspace, kReplace, kByteFallback, kFuse, kStrip } kind;
  std::string a = {}, b = {};  // Replace: pattern and content
  std::string prepend_scheme = "always";
  size_t start = 0, stop = 0;
};

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

}  // namespace

struct Tokenizer::Impl {
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> id_to_token;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left, right) -> (rank, merged id)
  bool ignore_merges = false;
  bool byte_fallback = false;
  bool fuse_unk = false;
  int32_t unk_id = -1;
  int32_t byte_ids[256];
  std::vector<AddedToken> added;  // longest first
  std::vector<bool> special;
  std::vector<NormalizerStep> normalizer;
  std::vector<PreTokenizerStep> pre_tokenizer;
  std::vector<DecoderStep> decoder;
  std::vector<int32_t> prefix, suffix;            // TemplateProcessing single: specials around $A
  std::vector<int32_t> added_by_first_byte[256];  // indices into `added`, longest first

  // Pieces repeat (words), so their BPE result is cached; bounded, cleared when full.
  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;
  static constexpr size_t kCacheEntries = 1 << 18;

  static uint64_t Key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

  std::string Normalize(std::string_view s) const;
  void PreTokenize(const std::string& s, bool first_section, std::vector<std::string>& pieces) const;
  void Bpe(const std::string& piece, std::vector<int32_t>& out) const;
  void BpeUncached(const std::string& piece, std::vector<int32_t>& out) const;
};

namespace {

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

}  // namespace

std::string Tokenizer::Impl::Normalize(std::string_view s) const {
  std::string out(s);
  for (const auto& n : normalizer) {
    switch (n.kind) {
      case NormalizerStep::kNfc: {
        UErrorCode err = U_ZERO_ERROR;
        const icu::Normalizer2* nfc = icu::Normalizer2::getNFCInstance(err);
        icu::UnicodeString u = icu::UnicodeString::fromUTF8(out);
        icu::UnicodeString r = nfc->normalize(u, err);
        if (U_SUCCESS(err)) {
          out.clear();
          r.toUTF8String(out);
        }
        break;
      }
      case NormalizerStep::kPrepend:
        if (!out.empty()) out = n.a + out;
        break;
      case NormalizerStep::kReplace:
        out = ReplaceAll(out, n.a, n.b);
        break;
    }
  }
  return out;
}

void Tokenizer::Impl::PreTokenize(const std::string& s, bool first_section, std::vector<std::string>& pieces) const {
  pieces.assign(1, s);
  for (const auto& p : pre_tokenizer) {
    std::vector<std::string> next;
    for (size_t k = 0; k < pieces.size(); ++k) {
      const std::string& piece = pieces[k];
      switch (p.kind) {
        case PreTokenizerStep::kSplit:
          p.regex->Split(piece, next);
          break;
        case PreTokenizerStep::kByteLevel: {
          std::vector<std::string> parts;
          std::string text = p.add_prefix_space && k == 0 && !piece.empty() && piece[0] != ' ' ? " " + piece : piece;
          if (p.regex) {
            p.regex->Split(text, parts);
          } else {
            parts.push_back(text);
          }
          for (const auto& part : parts) {
            std::string mapped;
            for (unsigned char c : part) mapped += ByteLevel().byte_to_str[c];
            next.push_back(std::move(mapped));
          }
          break;
        }
        case PreTokenizerStep::kMetaspace: {
          std::string r;
          for (char c : piece) {
            if (c == ' ') {
              r += p.replacement;
            } else {
              r += c;
            }
          }
          const bool prepend = p.prepend_scheme == "always" || (p.prepend_scheme == "first" && first_section && k == 0);
          if (prepend && r.compare(0, p.replacement.size(), p.replacement) != 0) r = p.replacement + r;
          if (!p.split) {
            next.push_back(std::move(r));
            break;
          }
          size_t start = 0;  // split before each replacement char, keeping it with the next piece
          for (size_t at = r.find(p.replacement, 1); at != std::string::npos; at = r.find(p.replacement, at + 1)) {
            next.push_back(r.substr(start, at - start));
            start = at;
          }
          next.push_back(r.substr(start));
          break;
        }
      }
    }
    pieces.swap(next);
  }
  pieces.erase(std::remove_if(pieces.begin(), pieces.end(), [](const std::string& x) { return x.empty(); }),
               pieces.end());
}

void Tokenizer::Impl::Bpe(const std::string& piece, std::vector<int32_t>& out) const {
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto hit = cache.find(piece);
    if (hit != cache.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
  }
  const size_t before = out.size();
  BpeUncached(piece, out);
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() >= kCacheEntries) cache.clear();
  cache.emplace(piece, std::vector<int32_t>(out.begin() + before, out.end()));
}

void Tokenizer::Impl::BpeUncached(const std::string& piece, std::vector<int32_t>& out) const {
  if (ignore_merges) {
    auto it = vocab.find(piece);
    if (it != vocab.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Initial symbols: one per character, or its bytes through byte fallback, or unk.
  std::vector<int32_t> sym;
  for (size_t i = 0; i < piece.size();) {
    size_t n = std::min(Utf8Len(static_cast<unsigned char>(piece[i])), piece.size() - i);
    auto it = vocab.find(piece.substr(i, n));
    if (it != vocab.end()) {
      sym.push_back(it->second);
    } else if (byte_fallback && byte_ids[static_cast<unsigned char>(piece[i])] >= 0) {
      for (size_t k = 0; k < n; ++k) sym.push_back(byte_ids[static_cast<unsigned char>(piece[i + k])]);
    } else if (unk_id >= 0 && !(fuse_unk && !sym.empty() && sym.back() == unk_id)) {
      sym.push_back(unk_id);
    }
    i += n;
  }
  // Repeatedly merge the adjacent pair with the lowest rank.
  while (sym.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max(), best_id = -1;
    size_t best_at = 0;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto it = merges.find(Key(sym[i], sym[i + 1]));
      if (it != merges.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        best_id = it->second.second;
        best_at = i;
      }
    }
    if (best_id < 0) break;
    sym[best_at] = best_id;
    sym.erase(sym.begin() + best_at + 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Tokenizer::~Tokenizer() = default;

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path) {
  SLIDE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return FromJson(text, path);
}

StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(const std::string& text, const std::string& source) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::exception& e) {  // a parse_error, or out_of_range: a number too large for a double
    return InvalidArgument(source + ": not valid JSON (" + e.what() + ")");
  }
  try {
    auto impl = std::make_unique<Impl>();
    const json& model = root.at("model");
    const std::string type = model.value("type", "BPE");
    if (type != "BPE") return InvalidArgument(source + ": model type '" + type + "' is not supported (BPE only)");
    for (auto it = model.at("vocab").begin(); it != model.at("vocab").end(); ++it)
      impl->vocab[it.key()] = TokenIdValue(*it);
    for (const auto& t : root.value("added_tokens", json::array()))
      impl->vocab.emplace(t.at("content").get<std::string>(), TokenIdValue(t.at("id")));
    int32_t max_id = -1;
    for (const auto& [tok, id] : impl->vocab) {
      if (id < 0) return InvalidArgument(source + ": token '" + tok + "' has negative id");
      max_id = std::max(max_id, id);
    }
    impl->id_to_token.assign(max_id + 1, "");
    for (const auto& [tok, id] : impl->vocab) impl->id_to_token[id] = tok;
    impl->special.assign(max_id + 1, false);

    int32_t rank = 0;
    for (const auto& m : model.at("merges")) {
      std::string a, b;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ');
        if (sp == std::string::npos) return InvalidArgument(source + ": merge '" + s + "' has no space");
        a = s.substr(0, sp), b = s.substr(sp + 1);
      } else {
        a = m.at(0).get<std::string>(), b = m.at(1).get<std::string>();
      }
      auto ia = impl->vocab.find(a), ib = impl->vocab.find(b), iab = impl->vocab.find(a + b);
      if (ia == impl->vocab.end() || ib == impl->vocab.end() || iab == impl->vocab.end())
        return InvalidArgument(source + ": merge '" + a + " " + b + "' uses a token missing from the vocabulary");
      impl->merges.emplace(Impl::Key(ia->second, ib->second), std::make_pair(rank++, iab->second));
    }
    impl->ignore_merges = model.value("ignore_merges", false);
    impl->byte_fallback = model.value("byte_fallback", false);
    impl->fuse_unk = model.value("fuse_unk", false);
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      auto it = impl->vocab.find(model["unk_token"].get<std::string>());
      if (it != impl->vocab.end()) impl->unk_id = it->second;
    }
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      auto it = impl->vocab.find(name);
      impl->byte_ids[b] = it == impl->vocab.end() ? -1 : it->second;
    }
    for (const auto& t : root.value("added_tokens", json::array())) {
      AddedToken a{t.at("content").get<std::string>(), TokenIdValue(t.at("id")), t.value("special", false)};
      if (a.content.empty()) continue;
      impl->special[a.id] = a.special;
      impl->added.push_back(a);
    }
    std::sort(impl->added.begin(), impl->added.end(),
              [](const AddedToken& x, const AddedToken& y) { return x.content.size() > y.content.size(); });
    for (size_t k = 0; k < impl->added.size(); ++k)
      impl->added_by_first_byte[static_cast<unsigned char>(impl->added[k].content[0])].push_back(
          static_cast<int32_t>(k));

    Status s = ParseNormalizer(root.value("normalizer", json()), impl->normalizer);
    if (s.ok()) s = ParsePreTokenizer(root.value("pre_tokenizer", json()), impl->pre_tokenizer);
    if (s.ok()) s = ParseDecoder(root.value("decoder", json()), impl->decoder);
    if (s.ok()) s = ParsePostProcessor(root.value("post_processor", json()), impl->prefix, impl->suffix);
    if (!s.ok()) return s.WithContext(source);
    return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
  } catch (const json::exception& e) {
    return InvalidArgument(source + ": malformed tokenizer.json (" + e.what() + ")");
  }
}

StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text, bool add_special_tokens) const {
  if (!IsValidUtf8(text)) return InvalidArgument("text is not valid UTF-8");
  const Impl& m = *impl_;
  std::vector<int32_t> ids(add_special_tokens ? m.prefix : std::vector<int32_t>{});
  std::vector<std::string> pieces;
  bool first_section = true;
  auto encode_section = [&](std::string_view section) {
    if (section.empty()) return;
    m.PreTokenize(m.Normalize(section), first_section, pieces);
    for (const auto& p : pieces) m.Bpe(p, ids);
    first_section = false;
  };
  // Added tokens are matched in the raw text, longest first, leftmost wins.
  size_t start = 0, i = 0;
  while (i < text.size()) {
    const AddedToken* hit = nullptr;
    for (int32_t k : m.added_by_first_byte[static_cast<unsigned char>(text[i])]) {
      const AddedToken& a = m.added[k];
      if (text.compare(i, a.content.size(), a.content) == 0) {
        hit = &a;
        break;
      }
    }
    if (hit == nullptr) {
      ++i;
      continue;
    }
    encode_section(text.substr(start, i - start));
    ids.push_back(hit->id);
    first_section = false;
    i += hit->content.size();
    start = i;
  }
  encode_section(text.substr(start));
  if (add_special_tokens) ids.insert(ids.end(), m.suffix.begin(), m.suffix.end());
  return ids;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& m = *impl_;
  std::vector<std::string> toks;
  for (int32_t id : ids) {
    if (id < 0 || id >= static_cast<int32_t>(m.id_to_token.size())) continue;
    if (skip_special_tokens && m.special[id]) continue;
    toks.push_back(m.id_to_token[id]);
  }
  for (const auto& d : m.decoder) {
    switch (d.kind) {
      case DecoderStep::kByteLevel: {
        std::string bytes;
        for (const auto& t : toks) {
          for (size_t i = 0; i < t.size();) {
            size_t at = i;
            uint32_t cp = DecodeUtf8(t, i);
            auto it = ByteLevel().cp_to_byte.find(cp);
            if (it != ByteLevel().cp_to_byte.end()) {
              bytes += static_cast<char>(it->second);
            } else {
              bytes.append(t, at, i - at);
            }
          }
        }
        toks.assign(1, Utf8Lossy(bytes));
        break;
      }
      case DecoderStep::kMetaspace:
      case DecoderStep::kReplace: {
        // Metaspace turns the replacement char back into a space, except in the first token, where (unless
        // the prepend scheme is "never") every replacement char is dropped, as Hugging Face does.
        for (size_t k = 0; k < toks.size(); ++k) {
          const bool drop = d.kind == DecoderStep::kMetaspace && k == 0 && d.prepend_scheme != "never";
          const std::string to = d.kind == DecoderStep::kMetaspace ? (drop ? "" : " ") : d.b;
          toks[k] = ReplaceAll(toks[k], d.a, to);
        }
        break;
      }
      case DecoderStep::kByteFallback: {
        std::vector<std::string> next;
        std::string pending;
        auto flush = [&] {
          if (!pending.empty()) next.push_back(Utf8Lossy(pending));
          pending.clear();
        };
        for (const auto& t : toks) {
          if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>') {
            pending += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
          } else {
            flush();
            next.push_back(t);
          }
        }
        flush();
        toks.swap(next);
        break;
      }
      case DecoderStep::kFuse: {
        std::string all;
        for (const auto& t : toks) all += t;
        toks.assign(1, all);
        break;
      }
      case DecoderStep::kStrip:
        for (auto& t : toks) {
          size_t s = 0;
          while (s < d.start && s < t.size() && t.compare(s, d.a.size(), d.a) == 0) s += d.a.size();
          t.erase(0, s);
          for (size_t k = 0;
               k < d.stop && t.size() >= d.a.size() && t.compare(t.size() - d.a.size(), d.a.size(), d.a) == 0; ++k)
            t.erase(t.size() - d.a.size());
        }
        break;
    }
  }
  std::string out;
  for (const auto& t : toks) out += t;
  return out;
}

StatusOr<TokenizerConfig> LoadTokenizerConfig(const std::string& model_dir) {
  const std::string path = model_dir + "/tokenizer_config.json";
  if (!PathExists(path)) return TokenizerConfig{};
  SLIDE_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {  // a parse_error, or out_of_range: a number too large for a double
    return InvalidArgument(path + ": not valid JSON (" + e.what() + ")");
  }
  if (!j.is_object()) return InvalidArgument(path + ": expected a JSON object");
  auto name = [&](const char* key, std::string& out) -> Status {
    if (!j.contains(key) || j[key].is_null()) return Status::Ok();
    const json& v = j[key];
    if (v.is_string()) {
      out = v.get<std::string>();
    } else if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      out = v["content"].get<std::string>();
    } else {
      return InvalidArgument(path + ": field '" + key + "' must be a string or {\"content\": ...}");
    }
    return Status::Ok();
  };
  TokenizerConfig c;
  SLIDE_RETURN_IF_ERROR(name("bos_token", c.bos_token));
  SLIDE_RETURN_IF_ERROR(name("eos_token", c.eos_token));
  SLIDE_RETURN_IF_ERROR(name("pad_token", c.pad_token));
  return c;
}

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

int32_t Tokenizer::TokenId(const std::string& token) const {
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < static_cast<int32_t>(impl_->special.size()) && impl_->special[id];
}

}  // namespace slide
