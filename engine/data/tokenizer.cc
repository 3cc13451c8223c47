#include "engine/data/tokenizer.h"

#include <unicode/normalizer2.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>
#include <unordered_map>

#include "engine/common/files.h"
#include "engine/common/utf8.h"
#include "engine/data/tokenizer_components.h"

namespace slide {

using nlohmann::json;
using namespace tokenizer_detail;

// Ids may reach 4x the token count, and any vocabulary may use ids up to this (toy files with sparse specials).
constexpr int64_t kMinIdLimit = int64_t(1) << 18;

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
  // Repeatedly merge the adjacent pair with the lowest rank (leftmost among equals), through a min-heap of
  // candidate pairs over a linked list of symbols: O(n log n) in the piece's length. A rescan per merge is
  // quadratic, and one long dataset line without spaces (a base64 blob) would stall the job for minutes.
  const int n = static_cast<int>(sym.size());
  if (n > 1) {
    std::vector<int> next(n), prev(n);
    for (int i = 0; i < n; ++i) next[i] = i + 1 < n ? i + 1 : -1, prev[i] = i - 1;
    struct Candidate {
      int32_t rank;
      int at;  // the left symbol's original position; positions keep their left-to-right order
      int32_t left, right, merged;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : at > o.at; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
    auto offer = [&](int at) {
      if (at < 0 || next[at] < 0) return;
      auto it = merges.find(Key(sym[at], sym[next[at]]));
      if (it != merges.end()) heap.push({it->second.first, at, sym[at], sym[next[at]], it->second.second});
    };
    for (int i = 0; i + 1 < n; ++i) offer(i);
    while (!heap.empty()) {
      const Candidate c = heap.top();
      heap.pop();
      // Stale when either side has merged since: a position's id only ever grows into a longer token, and its
      // right neighbour changes only when the position itself merges.
      const int right = next[c.at];
      if (sym[c.at] != c.left || right < 0 || sym[right] != c.right) continue;
      sym[c.at] = c.merged;
      sym[right] = -1;
      next[c.at] = next[right];
      if (next[right] >= 0) prev[next[right]] = c.at;
      offer(prev[c.at]);
      offer(c.at);
    }
    size_t kept = 0;
    for (int i = 0; i >= 0; i = next[i]) sym[kept++] = sym[i];
    sym.resize(kept);
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
    const std::string* max_token = nullptr;
    for (const auto& [tok, id] : impl->vocab) {
      if (id < 0) return InvalidArgument(source + ": token '" + tok + "' has negative id");
      if (id > max_id) max_id = id, max_token = &tok;
    }
    // The id table is dense: one token with a huge id would make a few bytes of JSON allocate gigabytes (a fuzzed
    // 64 KiB file took 1.2 GB). Real vocabularies are dense (Llama 3: 128,256 tokens, ids 0..128,255).
    const int64_t id_limit = std::max<int64_t>(4 * static_cast<int64_t>(impl->vocab.size()), kMinIdLimit);
    if (max_id >= id_limit)
      return InvalidArgument(source + ": token '" + *max_token + "' has id " + std::to_string(max_id) +
                             ", far beyond the vocabulary's " + std::to_string(impl->vocab.size()) +
                             " tokens (ids must be below " + std::to_string(id_limit) + ")");
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

int32_t Tokenizer::vocab_size() const { return static_cast<int32_t>(impl_->id_to_token.size()); }

int32_t Tokenizer::TokenId(const std::string& token) const {
  auto it = impl_->vocab.find(token);
  return it == impl_->vocab.end() ? -1 : it->second;
}

std::string Tokenizer::TokenText(int32_t id) const {
  return id >= 0 && id < static_cast<int32_t>(impl_->id_to_token.size()) ? impl_->id_to_token[id] : "";
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < static_cast<int32_t>(impl_->special.size()) && impl_->special[id];
}

}  // namespace slide
