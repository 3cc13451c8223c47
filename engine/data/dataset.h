// Fine-tuning datasets from JSONL: formats, chat templates, loss masks, packing or truncation + padding,
// a held-out split, and a seeded, resumable batch order. Bad lines are reported with file and line and either
// fail the load or are skipped and counted, as the policy says.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/common/status.h"
#include "engine/data/chat_sample.h"
#include "engine/data/special_tokens.h"
#include "engine/data/tokenizer.h"

namespace slide {

enum class DatasetFormat {
  kAuto,              // decided per line from its keys
  kText,              // {"text": ...}: loss on every token
  kPromptCompletion,  // {"prompt": ..., "completion": ...}: loss on the completion only (lists of messages: through
                      // the chat template, as TRL's conversational prompt/completion)
  kMessages,          // {"messages": [{"role", "content"}, ...]}: through the chat template (chat_sample.h)
  kTokens,            // {"input_ids": [...], "labels"?: [...]}: pre-tokenized
};
enum class SequenceMode { kPack, kTruncate };  // pack samples into full windows, or one sample per row + padding
enum class BadLinePolicy { kFail, kSkip };
enum class LongSamplePolicy { kTruncate, kSkip, kFail };  // truncate mode only

StatusOr<DatasetFormat> ParseDatasetFormat(const std::string& name);  // auto|text|prompt_completion|messages|tokens
const char* DatasetFormatName(DatasetFormat format);

struct DatasetOptions {
  int64_t seq_len = 1024;
  SequenceMode mode = SequenceMode::kPack;
  DatasetFormat format = DatasetFormat::kAuto;
  BadLinePolicy bad_lines = BadLinePolicy::kFail;
  LongSamplePolicy long_samples = LongSamplePolicy::kTruncate;
  // The BOS (unless add_bos_token is false) goes before text and prompt/completion samples, the EOS after them
  // (trained); padding is the pad token, else the EOS, else id 0. Chat samples get what their template renders.
  SpecialTokens special_tokens;
  // `messages` lines: the template (null: such a line fails with no_chat_template's message), what is trained,
  // and strftime_now's clock (0 = the current time).
  std::shared_ptr<const ChatTemplate> chat_template;
  std::string no_chat_template = "no chat template was given";
  TrainOn train_on = TrainOn::kAssistant;
  std::time_t now = 0;
  double eval_fraction = 0;  // held-out share of the sequences
  uint64_t seed = 0;
  // Asked before each line when set: its error stops the load (a job cancelled or suspended while it prepares).
  std::function<Status()> interrupted;
};

// One training row: input_ids and HF-style labels (label t is the token at t; -100 = no loss), seq_len long.
struct Sequence {
  std::vector<int32_t> input_ids;
  std::vector<int32_t> labels;
};

struct DatasetStats {
  int64_t lines = 0;                // non-empty lines read
  int64_t samples = 0;              // lines turned into samples
  int64_t skipped = 0;              // bad lines skipped (policy kSkip) plus over-long samples skipped
  int64_t truncated = 0;            // samples cut to seq_len
  int64_t tokens = 0;               // tokens in all samples
  int64_t loss_tokens = 0;          // tokens with a label
  std::vector<std::string> errors;  // the first few skipped-line messages
};

struct Dataset {
  std::vector<Sequence> train;
  std::vector<Sequence> eval;
  DatasetStats stats;
};

StatusOr<Dataset> LoadJsonlDataset(const std::string& path, const Tokenizer& tokenizer, const DatasetOptions& options);

// The options that depend on the model directory: its special tokens (as transformers reads them) and, for
// `messages` lines, the chat template `choice` names, checked against the tokenizer. A messages dataset without a
// template is an error; with format auto only the lines that hold messages fail, with the reason.
StatusOr<DatasetOptions> ModelDatasetOptions(const std::string& model_dir, const Tokenizer& tokenizer,
                                             DatasetFormat format, ChatTemplateChoice choice, TrainOn train_on);

// One line as a sample, before packing, truncation or padding (what `slidectl render` shows).
struct LineSample {
  DatasetFormat format = DatasetFormat::kAuto;  // the line's, when the options say auto
  std::vector<int32_t> ids;
  std::vector<int32_t> labels;  // -100 where not trained
};
StatusOr<LineSample> BuildLineSample(const std::string& line, const Tokenizer& tokenizer,
                                     const DatasetOptions& options);

// The order in which a training run visits sequences: a fresh seeded permutation each epoch. The position is
// two integers, saved in checkpoints so a resumed run continues exactly where the data stood.
class BatchOrder {
 public:
  struct Position {
    int64_t epoch = 0;
    int64_t index = 0;  // next sequence within the epoch's permutation
  };
  BatchOrder(int64_t num_sequences, uint64_t seed);
  std::vector<int64_t> Next(int64_t batch_size);  // indices; crosses into the next epoch when needed
  Position position() const { return pos_; }
  void Seek(Position pos);

 private:
  void Permute();
  int64_t n_;
  uint64_t seed_;
  Position pos_;
  std::vector<int64_t> perm_;
};

}  // namespace slide
