#include "engine/data/dataset.h"

#include <unistd.h>
#include <ext/stdio_filebuf.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "engine/common/path_confinement.h"
#include "engine/common/utf8.h"

namespace slide {
namespace {

using json = nlohmann::ordered_json;  // key order kept: templates render tool schemas as written

constexpr int32_t kIgnore = -100;
constexpr size_t kMaxReportedErrors = 5;

// One tokenized sample before packing: tokens and their labels.
struct Sample {
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;
  void Add(const std::vector<int32_t>& t, bool train) {
    ids.insert(ids.end(), t.begin(), t.end());
    labels.insert(labels.end(), t.size(), kIgnore);
    if (train) std::copy(t.begin(), t.end(), labels.end() - static_cast<std::ptrdiff_t>(t.size()));
  }
};

class SampleBuilder {
 public:
  SampleBuilder(const Tokenizer& tok, const DatasetOptions& o) : tok_(tok), o_(o) {}

  Status Init() {
    const SpecialTokens& t = o_.special_tokens;
    if (t.add_bos_token != false) {
      SLIDE_ASSIGN_OR_RETURN(bos_, Token(t.bos_token, "bos_token"));
    }
    SLIDE_ASSIGN_OR_RETURN(eos_, Token(t.eos_token, "eos_token"));
    chat_.chat_template = o_.chat_template;
    chat_.special_tokens = t;
    chat_.train_on = o_.train_on;
    chat_.now = o_.now;
    return Status::Ok();
  }

  // Builds one sample from a parsed line; errors name the problem (the caller adds file and line). `format`, when
  // given, receives the line's format.
  StatusOr<Sample> Build(const json& j, DatasetFormat* format = nullptr) const {
    if (!j.is_object()) return InvalidArgument("a line must be a JSON object");
    DatasetFormat f = o_.format;
    if (f == DatasetFormat::kAuto) {
      if (j.contains("messages"))
        f = DatasetFormat::kMessages;
      else if (j.contains("prompt") || j.contains("completion"))
        f = DatasetFormat::kPromptCompletion;
      else if (j.contains("input_ids"))
        f = DatasetFormat::kTokens;
      else if (j.contains("text"))
        f = DatasetFormat::kText;
      else
        return InvalidArgument("no known field (text, prompt/completion, messages, input_ids)");
    }
    if (format != nullptr) *format = f;
    Sample s;
    switch (f) {
      case DatasetFormat::kText: {
        SLIDE_ASSIGN_OR_RETURN(std::string text, Field(j, "text"));
        AddSpecial(s, bos_, false);
        SLIDE_RETURN_IF_ERROR(AddText(s, text, true));
        AddSpecial(s, eos_, true);
        break;
      }
      case DatasetFormat::kPromptCompletion: {
        if (j.contains("prompt") && j["prompt"].is_array()) {  // conversational: through the chat template
          SLIDE_RETURN_IF_ERROR(BuildChat(j, s));
          break;
        }
        SLIDE_ASSIGN_OR_RETURN(std::string prompt, Field(j, "prompt"));
        SLIDE_ASSIGN_OR_RETURN(std::string completion, Field(j, "completion"));
        AddSpecial(s, bos_, false);
        SLIDE_RETURN_IF_ERROR(AddText(s, prompt, false));
        SLIDE_RETURN_IF_ERROR(AddText(s, completion, true));
        AddSpecial(s, eos_, true);
        break;
      }
      case DatasetFormat::kMessages:
        SLIDE_RETURN_IF_ERROR(BuildChat(j, s));
        break;
      case DatasetFormat::kTokens:
        SLIDE_RETURN_IF_ERROR(BuildTokens(j, s));
        break;
      case DatasetFormat::kAuto:
        break;
    }
    if (s.ids.empty()) return InvalidArgument("the sample has no tokens");
    return s;
  }

 private:
  StatusOr<int32_t> Token(const std::string& name, const char* what) const {
    if (name.empty()) return -1;
    const int32_t id = tok_.TokenId(name);
    if (id < 0) return InvalidArgument(std::string(what) + " '" + name + "' is not in the tokenizer's vocabulary");
    return id;
  }
  static StatusOr<std::string> Field(const json& j, const char* key) {
    if (!j.contains(key)) return InvalidArgument(std::string("missing field '") + key + "'");
    if (!j[key].is_string()) return InvalidArgument(std::string("field '") + key + "' must be a string");
    return j[key].get<std::string>();
  }
  static void AddSpecial(Sample& s, int32_t id, bool train) {
    if (id >= 0) s.Add({id}, train);
  }
  Status AddText(Sample& s, const std::string& text, bool train) const {
    SLIDE_ASSIGN_OR_RETURN(std::vector<int32_t> ids, tok_.Encode(text));
    s.Add(ids, train);
    return Status::Ok();
  }

  Status BuildChat(const json& j, Sample& s) const {
    // The job's configuration, not the line: it fails the load whatever the bad-line policy.
    if (!chat_.chat_template) return FailedPrecondition(o_.no_chat_template);
    SLIDE_ASSIGN_OR_RETURN(ChatSample chat, BuildChatSample(j, tok_, chat_));
    s.ids = std::move(chat.ids);
    s.labels = std::move(chat.labels);
    return Status::Ok();
  }

  Status BuildTokens(const json& j, Sample& s) const {
    auto ints = [&](const char* key, bool allow_ignore, std::vector<int32_t>& out) -> Status {
      const json& a = j[key];
      if (!a.is_array()) return InvalidArgument(std::string("field '") + key + "' must be an array of integers");
      for (const json& v : a) {
        if (!v.is_number_integer()) return InvalidArgument(std::string("field '") + key + "' must hold integers");
        const int64_t x = v.get<int64_t>();
        const bool ok = (x >= 0 && x < tok_.vocab_size()) || (allow_ignore && x == kIgnore);
        if (!ok)
          return InvalidArgument(std::string("field '") + key + "' holds " + std::to_string(x) +
                                 ", outside the vocabulary [0, " + std::to_string(tok_.vocab_size()) + ")");
        out.push_back(static_cast<int32_t>(x));
      }
      return Status::Ok();
    };
    SLIDE_RETURN_IF_ERROR(ints("input_ids", false, s.ids));
    if (j.contains("labels")) {
      SLIDE_RETURN_IF_ERROR(ints("labels", true, s.labels));
      if (s.labels.size() != s.ids.size())
        return InvalidArgument("'labels' has " + std::to_string(s.labels.size()) + " entries but 'input_ids' has " +
                               std::to_string(s.ids.size()));
    } else {
      s.labels = s.ids;
    }
    return Status::Ok();
  }

  const Tokenizer& tok_;
  const DatasetOptions& o_;
  ChatSampleOptions chat_;
  int32_t bos_ = -1, eos_ = -1;
};

}  // namespace

const char* DatasetFormatName(DatasetFormat f) {
  switch (f) {
    case DatasetFormat::kText:
      return "text";
    case DatasetFormat::kPromptCompletion:
      return "prompt_completion";
    case DatasetFormat::kMessages:
      return "messages";
    case DatasetFormat::kTokens:
      return "tokens";
    case DatasetFormat::kAuto:
      break;
  }
  return "auto";
}

StatusOr<DatasetFormat> ParseDatasetFormat(const std::string& n) {
  if (n == "auto") return DatasetFormat::kAuto;
  if (n == "text") return DatasetFormat::kText;
  if (n == "prompt_completion") return DatasetFormat::kPromptCompletion;
  if (n == "messages") return DatasetFormat::kMessages;
  if (n == "tokens") return DatasetFormat::kTokens;
  return InvalidArgument("unknown dataset format '" + n + "' (auto, text, prompt_completion, messages, tokens)");
}

StatusOr<Dataset> LoadJsonlDataset(const std::string& path, const Tokenizer& tokenizer, const DatasetOptions& o) {
  if (o.seq_len < 2) return InvalidArgument("seq_len must be at least 2");
  if (o.eval_fraction < 0 || o.eval_fraction >= 1) return InvalidArgument("eval_fraction must be in [0, 1)");
  // Resolved, confined and refused unless a regular file (a FIFO would block the engine thread forever).
  auto fd = OpenRegularFile(path);
  if (!fd.ok() && fd.status().code() == StatusCode::kNotFound) return NotFound(path + ": cannot open dataset");
  if (!fd.ok()) return fd.status().WithContext("dataset");
  __gnu_cxx::stdio_filebuf<char> file(fd.value(), std::ios::in | std::ios::binary);  // closes the fd
  std::istream in(&file);
  SampleBuilder builder(tokenizer, o);
  SLIDE_RETURN_IF_ERROR(builder.Init());
  const SpecialTokens& t = o.special_tokens;
  const std::string& pad_name = t.pad_token.empty() ? t.eos_token : t.pad_token;
  const int32_t pad = pad_name.empty() ? 0 : tokenizer.TokenId(pad_name);
  if (pad < 0) return InvalidArgument("pad_token '" + pad_name + "' is not in the tokenizer's vocabulary");

  Dataset ds;
  DatasetStats& st = ds.stats;
  std::vector<Sequence> seqs;
  Sample stream;  // pack mode: samples concatenated
  std::string line;
  int64_t line_no = 0;
  auto fail_or_skip = [&](const std::string& msg) -> Status {
    const std::string where = path + ":" + std::to_string(line_no) + ": " + msg;
    if (o.bad_lines == BadLinePolicy::kFail) return InvalidArgument(where);
    ++st.skipped;
    if (st.errors.size() < kMaxReportedErrors) st.errors.push_back(where);
    return Status::Ok();
  };
  while (std::getline(in, line)) {
    ++line_no;
    if (o.interrupted) SLIDE_RETURN_IF_ERROR(o.interrupted());
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    ++st.lines;
    if (!IsValidUtf8(line)) {
      SLIDE_RETURN_IF_ERROR(fail_or_skip("not valid UTF-8"));
      continue;
    }
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {  // a parse_error, or out_of_range: a number too large for a double
      SLIDE_RETURN_IF_ERROR(fail_or_skip(std::string("not valid JSON (") + e.what() + ")"));
      continue;
    }
    auto sample = builder.Build(j);
    if (!sample.ok() && sample.status().code() == StatusCode::kFailedPrecondition)
      return FailedPrecondition(path + ":" + std::to_string(line_no) + ": " + sample.status().message());
    if (!sample.ok()) {
      SLIDE_RETURN_IF_ERROR(fail_or_skip(sample.status().message()));
      continue;
    }
    Sample& s = sample.value();
    if (o.mode == SequenceMode::kTruncate && static_cast<int64_t>(s.ids.size()) > o.seq_len) {
      if (o.long_samples == LongSamplePolicy::kFail)
        return InvalidArgument(path + ":" + std::to_string(line_no) + ": sample has " + std::to_string(s.ids.size()) +
                               " tokens, more than seq_len " + std::to_string(o.seq_len));
      if (o.long_samples == LongSamplePolicy::kSkip) {
        ++st.skipped;
        continue;
      }
      s.ids.resize(o.seq_len);
      s.labels.resize(o.seq_len);
      ++st.truncated;
    }
    ++st.samples;
    st.tokens += static_cast<int64_t>(s.ids.size());
    st.loss_tokens += std::count_if(s.labels.begin(), s.labels.end(), [](int32_t l) { return l != kIgnore; });
    if (o.mode == SequenceMode::kTruncate) {
      Sequence q{std::move(s.ids), std::move(s.labels)};
      q.labels.resize(o.seq_len, kIgnore);
      q.input_ids.resize(o.seq_len, pad);
      seqs.push_back(std::move(q));
    } else {
      stream.ids.insert(stream.ids.end(), s.ids.begin(), s.ids.end());
      stream.labels.insert(stream.labels.end(), s.labels.begin(), s.labels.end());
      // Whole sequences are cut from the front, then the rest moves once: erasing each sequence as it was cut
      // moved the whole stream every time, quadratic in a long sample's length.
      size_t cut = 0;
      const size_t seq = static_cast<size_t>(o.seq_len);
      for (; stream.ids.size() - cut >= seq; cut += seq)
        seqs.push_back({{stream.ids.begin() + cut, stream.ids.begin() + cut + seq},
                        {stream.labels.begin() + cut, stream.labels.begin() + cut + seq}});
      stream.ids.erase(stream.ids.begin(), stream.ids.begin() + cut);
      stream.labels.erase(stream.labels.begin(), stream.labels.begin() + cut);
    }
  }
  if (o.mode == SequenceMode::kPack && !stream.ids.empty()) {  // the tail, padded
    Sequence q{stream.ids, stream.labels};
    q.input_ids.resize(o.seq_len, pad);
    q.labels.resize(o.seq_len, kIgnore);
    seqs.push_back(std::move(q));
  }
  if (seqs.empty())
    return InvalidArgument(path + ": no usable samples (" + std::to_string(st.lines) + " lines, " +
                           std::to_string(st.skipped) + " skipped)");

  // Held-out split: a seeded choice of whole sequences.
  std::vector<int64_t> idx(seqs.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::mt19937_64 rng(o.seed ^ 0x5eedda7a5e7ull);
  std::shuffle(idx.begin(), idx.end(), rng);
  int64_t n_eval = static_cast<int64_t>(o.eval_fraction * static_cast<double>(seqs.size()));
  if (o.eval_fraction > 0 && n_eval == 0 && seqs.size() >= 2) n_eval = 1;
  std::vector<bool> is_eval(seqs.size(), false);
  for (int64_t k = 0; k < n_eval; ++k) is_eval[idx[k]] = true;
  for (size_t k = 0; k < seqs.size(); ++k) (is_eval[k] ? ds.eval : ds.train).push_back(std::move(seqs[k]));
  return ds;
}

StatusOr<DatasetOptions> ModelDatasetOptions(const std::string& model_dir, const Tokenizer& tokenizer,
                                             DatasetFormat format, ChatTemplateChoice choice, TrainOn train_on) {
  DatasetOptions d;
  d.format = format;
  d.train_on = train_on;
  SLIDE_ASSIGN_OR_RETURN(d.special_tokens, LoadSpecialTokens(model_dir, &tokenizer));
  auto chat_template = ResolveChatTemplate(choice, model_dir);
  if (chat_template.ok()) {
    SLIDE_RETURN_IF_ERROR(CheckChatTemplateTokens(choice, tokenizer));
    d.chat_template = *chat_template;
  } else if (format == DatasetFormat::kMessages) {
    return chat_template.status();
  } else {
    d.no_chat_template = chat_template.status().message();
  }
  return d;
}

StatusOr<LineSample> BuildLineSample(const std::string& line, const Tokenizer& tokenizer, const DatasetOptions& o) {
  if (!IsValidUtf8(line)) return InvalidArgument("not valid UTF-8");
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {
    return InvalidArgument(std::string("not valid JSON (") + e.what() + ")");
  }
  SampleBuilder builder(tokenizer, o);
  SLIDE_RETURN_IF_ERROR(builder.Init());
  LineSample out;
  SLIDE_ASSIGN_OR_RETURN(Sample s, builder.Build(j, &out.format));
  out.ids = std::move(s.ids);
  out.labels = std::move(s.labels);
  return out;
}

BatchOrder::BatchOrder(int64_t num_sequences, uint64_t seed) : n_(num_sequences), seed_(seed) { Permute(); }

void BatchOrder::Permute() {
  perm_.resize(n_);
  std::iota(perm_.begin(), perm_.end(), 0);
  std::mt19937_64 rng(seed_ + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(pos_.epoch + 1));
  std::shuffle(perm_.begin(), perm_.end(), rng);
}

std::vector<int64_t> BatchOrder::Next(int64_t batch_size) {
  std::vector<int64_t> out;
  while (static_cast<int64_t>(out.size()) < batch_size && n_ > 0) {
    if (pos_.index >= n_) {
      ++pos_.epoch;
      pos_.index = 0;
      Permute();
    }
    out.push_back(perm_[pos_.index++]);
  }
  return out;
}

void BatchOrder::Seek(Position pos) {
  pos_ = pos;
  Permute();
}

}  // namespace slide
