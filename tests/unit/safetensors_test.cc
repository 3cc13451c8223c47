// safetensors: round trips, files written by Hugging Face, and one precise error per kind of corruption.
#include "engine/model/safetensors.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <fstream>

#include "tests/support/expect_contains.h"
#include "tests/support/fixtures.h"

namespace slide {
namespace {

using testing::TempDir;

// Writes [u64 header_len][header][data]; header_len defaults to the header's real size.
void WriteRaw(const std::string& path, const std::string& header, size_t data_bytes, int64_t header_len = -1) {
  std::ofstream out(path, std::ios::binary);
  uint64_t n = header_len < 0 ? header.size() : static_cast<uint64_t>(header_len);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << header;
  out << std::string(data_bytes, '\0');
}

std::string OpenError(const std::string& path) {
  auto r = SafetensorsFile::Open(path);
  EXPECT_FALSE(r.ok());
  return r.ok() ? "" : r.status().message();
}

using testing::ExpectContains;

TEST(Safetensors, RoundTripKeepsDtypeShapeAndValues) {
  TempDir dir;
  const std::string path = dir.File("t.safetensors");
  NamedTensors in = {{"b", at::randn({3, 5}).to(at::kBFloat16)},
                     {"a", at::randn({7})},
                     {"h", at::randn({2, 2, 2}).to(at::kHalf)},
                     {"ids", at::arange(10, at::kLong)},
                     {"empty", at::empty({0, 4})}};
  ASSERT_OK(WriteSafetensors(path, in, {{"format", "pt"}, {"note", "x"}}));
  auto file = testing::ValueOrDie(SafetensorsFile::Open(path));
  EXPECT_EQ(file->entries().size(), in.size());
  EXPECT_EQ(file->metadata().at("note"), "x");
  for (const auto& [name, t] : in) {
    const SafetensorsEntry* e = file->Find(name);
    ASSERT_NE(e, nullptr) << name;
    at::Tensor v = testing::ValueOrDie(file->Read(*e));
    EXPECT_EQ(v.scalar_type(), t.scalar_type()) << name;
    EXPECT_TRUE(at::equal(v, t)) << name;
  }
  EXPECT_EQ(file->Find("missing"), nullptr);
}

TEST(Safetensors, ReadTensorOutlivesTheFileObject) {
  TempDir dir;
  ASSERT_OK(WriteSafetensors(dir.File("t.safetensors"), {{"x", at::arange(4, at::kFloat)}}));
  at::Tensor v;
  {
    auto file = testing::ValueOrDie(SafetensorsFile::Open(dir.File("t.safetensors")));
    v = testing::ValueOrDie(file->Read(*file->Find("x")));
  }
  EXPECT_FLOAT_EQ(v[3].item<float>(), 3.0f);
}

// `cp new old` truncates the file in place while a reader has it open. A mapped reader dies of SIGBUS on the
// missing pages (taking the daemon and every job with it); this one must fail the read with an error instead.
TEST(Safetensors, FileTruncatedWhileOpenFailsTheReadNotTheProcess) {
  TempDir dir;
  const std::string path = dir.File("t.safetensors");
  ASSERT_OK(WriteSafetensors(path, {{"a", at::arange(1 << 16, at::kFloat)}, {"b", at::ones({1 << 16})}}));
  auto file = testing::ValueOrDie(SafetensorsFile::Open(path));
  ASSERT_EQ(::truncate(path.c_str(), 4096), 0);
  auto read = file->Read(*file->Find("b"));
  ASSERT_FALSE(read.ok());
  EXPECT_EQ(read.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(read.status().message().find("tensor 'b'"), std::string::npos) << read.status().message();
  EXPECT_NE(read.status().message().find("truncated"), std::string::npos) << read.status().message();
}

TEST(Safetensors, ReadsHuggingFaceShards) {
  auto file = testing::ValueOrDie(
      SafetensorsFile::Open(testing::FixturePath("models/llama3/model-00001-of-00008.safetensors")));
  EXPECT_FALSE(file->entries().empty());
  EXPECT_EQ(file->metadata().at("format"), "pt");
}

TEST(Safetensors, RejectsEachKindOfCorruption) {
  TempDir dir;
  const std::string p = dir.File("bad.safetensors");

  { std::ofstream(p) << "abc"; }
  ExpectContains(OpenError(p), "too short");

  WriteRaw(p, "{}", 0, 1000);
  ExpectContains(OpenError(p), "header length 1000 runs past the end");

  WriteRaw(p, "{}", 0, int64_t(1) << 40);
  ExpectContains(OpenError(p), "exceeds the 100 MiB limit");

  WriteRaw(p, "{\"a\": ", 0);
  ExpectContains(OpenError(p), "header is not valid JSON");

  WriteRaw(p, "[1]", 0);
  ExpectContains(OpenError(p), "header is not a JSON object");

  // A number beyond a double's range: nlohmann throws out_of_range, not parse_error (found by the fuzzer; it
  // used to escape and terminate the process).
  WriteRaw(p, R"({"w": {"dtype": "F32", "shape": 1e999, "data_offsets": [0, 4]}})", 4);
  ExpectContains(OpenError(p), "header is not valid JSON");

  WriteRaw(p, R"({"w": {"dtype": "Q4", "shape": [2], "data_offsets": [0, 2]}})", 2);
  ExpectContains(OpenError(p), "tensor 'w': unknown dtype 'Q4'");

  WriteRaw(p, R"({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}})", 8);
  ExpectContains(OpenError(p), "tensor 'w': data_offsets [0,16] run past the data section (8 bytes)");

  WriteRaw(p, R"({"w": {"dtype": "F32", "shape": [3], "data_offsets": [0, 16]}})", 16);
  ExpectContains(OpenError(p), "tensor 'w': data_offsets [0,16] hold 16 bytes but dtype and shape need 12");

  WriteRaw(p, R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})", 16);
  ExpectContains(OpenError(p), "end before begin");

  WriteRaw(p, R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",
           12);
  ExpectContains(OpenError(p), "tensors 'a' and 'b' overlap");

  WriteRaw(p, R"({"w": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8);
  ExpectContains(OpenError(p), "non-natural dimension");

  WriteRaw(p, R"({"w": {"dtype": "F32", "shape": [2]}})", 8);
  ExpectContains(OpenError(p), "tensor 'w': 'data_offsets' must be [begin, end]");

  WriteRaw(p, R"({"w": 5})", 0);
  ExpectContains(OpenError(p), "tensor 'w': header entry is not an object");

  WriteRaw(p, R"({"__metadata__": {"format": 1}})", 0);
  ExpectContains(OpenError(p), "__metadata__ value 'format' is not a string");

  // Every message names the file.
  ExpectContains(OpenError(p), p);
}

TEST(Safetensors, MissingFileIsNotFound) {
  auto r = SafetensorsFile::Open("/nonexistent/x.safetensors");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
}

TEST(Safetensors, WriterRefusesDuplicateNames) {
  TempDir dir;
  Status s = WriteSafetensors(dir.File("d.safetensors"), {{"x", at::ones({1})}, {"x", at::ones({1})}});
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  ExpectContains(s.message(), "tensor 'x' given twice");
}

}  // namespace
}  // namespace slide
