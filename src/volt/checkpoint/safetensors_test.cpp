#include "volt/checkpoint/safetensors.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "volt/checkpoint/checkpoint_io.h"
#include "volt/core/error.h"
#include "volt/core/testing.h"

namespace volt {
namespace {

namespace fs = std::filesystem;
using testing::error_message;
using testing::TempDir;

// The bytes of a safetensors file: the header's length (8 bytes, little-endian), `header`, `data`.
std::string safetensors_bytes(const std::string& header, const std::string& data = "") {
  std::string bytes(8, '\0');
  uint64_t length = header.size();
  for (char& byte : bytes) {
    byte = static_cast<char>(length & 0xFF);
    length >>= 8;
  }
  return bytes + header + data;
}

// A file of one tensor "w" with these JSON values for dtype, shape and data_offsets, and 8 data bytes.
std::string one_tensor(const std::string& dtype, const std::string& shape, const std::string& offsets) {
  return safetensors_bytes(fmt::format(R"({{"w":{{"dtype":{},"shape":{},"data_offsets":{}}}}})", dtype, shape, offsets),
                           std::string(8, '\0'));
}

std::string file_contents(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string put_file(const TempDir& dir, const std::string& name, const std::string& bytes) {
  const std::string path = dir.file(name);
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// The message SafetensorsFile::open throws for a file holding `bytes`; checks that it names the
// file and says what to do.
std::string open_error(const std::string& bytes) {
  TempDir dir;
  const std::string path = put_file(dir, "bad.safetensors", bytes);
  const std::string message = error_message<CheckpointError>([&] { SafetensorsFile::open(path); });
  EXPECT_NE(message.find(path), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  return message;
}

// The same dtype, sizes and bytes (NaNs and -0.0 included, which at::equal would not tell apart).
void expect_identical(const at::Tensor& expected, const at::Tensor& actual, const std::string& name) {
  ASSERT_TRUE(actual.defined()) << name;
  EXPECT_EQ(actual.scalar_type(), expected.scalar_type()) << name;
  ASSERT_EQ(actual.sizes(), expected.sizes()) << name;
  EXPECT_EQ(actual.device(), at::Device(at::kCPU)) << name;
  const at::Tensor a = expected.contiguous();
  const at::Tensor b = actual.contiguous();
  EXPECT_EQ(std::memcmp(a.data_ptr(), b.data_ptr(), a.nbytes()), 0) << name << ": " << expected << " vs " << actual;
}

// One tensor of every dtype LibTorch and the format share, with values each dtype holds exactly,
// and the shapes that are easy to get wrong: 0-d, empty, non-contiguous.
NamedTensors every_dtype() {
  const at::Tensor base = at::arange(-6, 6, at::kLong).reshape({3, 4});
  at::Tensor f32 = base.to(at::kFloat) * 0.25;
  f32.index_put_({0, 0}, std::numeric_limits<float>::quiet_NaN());
  f32.index_put_({0, 1}, -std::numeric_limits<float>::infinity());
  f32.index_put_({0, 2}, -0.0);
  at::Tensor f64 = base.to(at::kDouble) / 3;
  f64.index_put_({2, 3}, std::numeric_limits<double>::max());
  at::Tensor i64 = base * (int64_t{1} << 40);
  i64.index_put_({1, 1}, std::numeric_limits<int64_t>::min());
  return {
      {"f64", f64},
      {"f32", f32},
      {"f16", (base.to(at::kFloat) * 0.5).to(at::kHalf)},
      {"bf16", (base.to(at::kFloat) * 0.125).to(at::kBFloat16)},
      {"i64", i64},
      {"i32", base.to(at::kInt) * 100000},
      {"i16", base.to(at::kShort) * 1000},
      {"i8", base.to(at::kChar) * 20},
      {"u8", at::arange(0, 250, 20, at::kLong).to(at::kByte)},
      {"bool", base.remainder(3) == 0},
      {"scalar", at::scalar_tensor(2.5, at::kFloat)},
      {"scalar_bool", at::scalar_tensor(true, at::kBool)},
      {"empty", at::zeros({0, 3}, at::kBFloat16)},
      {"transposed", at::arange(6, at::kFloat).reshape({2, 3}).t()},
  };
}

TEST(Safetensors, EveryDtypeSurvivesARoundTrip) {
  TempDir dir;
  const NamedTensors tensors = every_dtype();
  save_safetensors(dir.file("all.safetensors"), tensors);
  const SafetensorsFile file = SafetensorsFile::open(dir.file("all.safetensors"));
  EXPECT_EQ(file.names().size(), tensors.size());
  for (const auto& [name, expected] : tensors) {
    expect_identical(expected, file.tensor(name), name);
    const SafetensorsTensorInfo info = file.info(name);
    EXPECT_EQ(info.dtype, expected.scalar_type()) << name;
    EXPECT_EQ(info.shape, expected.sizes().vec()) << name;
    EXPECT_EQ(info.end - info.begin, static_cast<int64_t>(expected.nbytes())) << name;
  }
  EXPECT_EQ(file.info("bf16").dtype_name, "BF16");
  EXPECT_EQ(file.info("bool").dtype_name, "BOOL");
  EXPECT_TRUE(file.metadata().empty());
}

TEST(Safetensors, LoadSafetensorsReturnsEveryTensorSortedByName) {
  TempDir dir;
  save_safetensors(dir.file("m.safetensors"), {{"b", at::ones({2})}, {"a", at::zeros({1}, at::kLong)}});
  const NamedTensors loaded = load_safetensors(dir.file("m.safetensors"));
  ASSERT_EQ(loaded.size(), 2U);
  EXPECT_EQ(loaded[0].first, "a");
  EXPECT_EQ(loaded[1].first, "b");
  expect_identical(at::ones({2}), loaded[1].second, "b");
  EXPECT_EQ(SafetensorsFile::open(dir.file("m.safetensors")).names(), (std::vector<std::string>{"a", "b"}));
}

TEST(Safetensors, MetadataSurvivesARoundTrip) {
  TempDir dir;
  const SafetensorsMetadata metadata = {{"format", "pt"}, {"note", "ünïcode, \"quotes\" and \\ slashes"}};
  save_safetensors(dir.file("m.safetensors"), {{"w", at::ones({2})}}, metadata);
  EXPECT_EQ(SafetensorsFile::open(dir.file("m.safetensors")).metadata(), metadata);
}

// The reference implementation's own tests pin these bytes (safetensors/src/tensor.rs:
// test_serialization, test_empty): Volt writes what it writes.
TEST(Safetensors, WritesTheBytesTheReferenceWriterWrites) {
  TempDir dir;
  save_safetensors(dir.file("one.safetensors"), {{"attn.0", at::arange(6, at::kFloat).reshape({1, 2, 3})}});
  const std::string header = R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})";
  ASSERT_EQ(header.size(), 64U);  // already a multiple of 8: no padding
  std::string data(24, '\0');
  const float values[] = {0, 1, 2, 3, 4, 5};
  std::memcpy(data.data(), values, sizeof(values));
  EXPECT_EQ(file_contents(dir.file("one.safetensors")), safetensors_bytes(header, data));

  save_safetensors(dir.file("empty.safetensors"), {});
  EXPECT_EQ(file_contents(dir.file("empty.safetensors")), safetensors_bytes("{}      "));
  save_safetensors(dir.file("meta.safetensors"), {}, {{"framework", "pt"}});
  EXPECT_EQ(file_contents(dir.file("meta.safetensors")),
            safetensors_bytes(R"({"__metadata__":{"framework":"pt"}})" + std::string(5, ' ')));
}

TEST(Safetensors, WrittenTensorsAreOrderedByDtypeThenNameAndStayAligned) {
  TempDir dir;
  save_safetensors(dir.file("m.safetensors"), {{"flag", at::ones({3}, at::kBool)},
                                               {"b_half", at::ones({1}, at::kHalf)},
                                               {"a_half", at::ones({1}, at::kHalf)},
                                               {"double", at::ones({2}, at::kDouble)}});
  const SafetensorsFile file = SafetensorsFile::open(dir.file("m.safetensors"));
  EXPECT_LT(file.info("double").begin, file.info("a_half").begin);
  EXPECT_LT(file.info("a_half").begin, file.info("b_half").begin);
  EXPECT_LT(file.info("b_half").begin, file.info("flag").begin);
  EXPECT_EQ(file.info("double").begin % 8, 0);
  EXPECT_EQ(file.info("a_half").begin % 2, 0);
}

TEST(Safetensors, TensorsAreCopyOnWriteViewsThatOutliveTheFileObject) {
  TempDir dir;
  save_safetensors(dir.file("m.safetensors"), {{"w", at::arange(4, at::kFloat)}});
  at::Tensor w;
  {
    const SafetensorsFile file = SafetensorsFile::open(dir.file("m.safetensors"));
    w = file.tensor("w");
  }
  expect_identical(at::arange(4, at::kFloat), w, "w");  // the map is still alive
  w.add_(1);                                            // a private copy of the page, not the file
  expect_identical(at::arange(1, 5, at::kFloat), w, "w");
  expect_identical(at::arange(4, at::kFloat), SafetensorsFile::open(dir.file("m.safetensors")).tensor("w"), "w");
}

TEST(Safetensors, SliceReadsRowsOfTheFirstDimension) {
  TempDir dir;
  const at::Tensor table = at::arange(15, at::kDouble).reshape({5, 3});
  save_safetensors(dir.file("m.safetensors"), {{"table", table}, {"vector", at::arange(4, at::kInt)}});
  const SafetensorsFile file = SafetensorsFile::open(dir.file("m.safetensors"));
  expect_identical(table.slice(0, 1, 4), file.slice("table", 1, 4), "table[1:4]");
  expect_identical(table.slice(0, 4, 5), file.slice("table", 4, 5), "table[4:5]");
  expect_identical(table.slice(0, 2, 2), file.slice("table", 2, 2), "table[2:2]");
  expect_identical(at::arange(1, 3, at::kInt), file.slice("vector", 1, 3), "vector[1:3]");
}

TEST(Safetensors, SliceRefusesBoundsOutsideTheTensorAndZeroDimensionalTensors) {
  TempDir dir;
  save_safetensors(dir.file("m.safetensors"), {{"table", at::zeros({5, 3})}, {"scalar", at::scalar_tensor(1.0)}});
  const SafetensorsFile file = SafetensorsFile::open(dir.file("m.safetensors"));
  for (const auto& [begin, end] : std::vector<std::pair<int64_t, int64_t>>{{-1, 2}, {3, 2}, {0, 6}}) {
    const std::string message = error_message<CheckpointError>([&, b = begin, e = end] { file.slice("table", b, e); });
    EXPECT_NE(message.find("expected 0 <= begin <= end <= 5"), std::string::npos) << message;
    EXPECT_NE(message.find(dir.file("m.safetensors")), std::string::npos) << message;
  }
  const std::string message = error_message<CheckpointError>([&] { file.slice("scalar", 0, 1); });
  EXPECT_NE(message.find("0-d"), std::string::npos) << message;
}

TEST(Safetensors, AMisalignedTensorIsCopiedWithTheRightValues) {
  TempDir dir;
  // A U8 first puts the F32 at an odd address; no writer Volt knows does this, but it is valid.
  std::string data = "\x07";
  const float values[] = {1.5F, -2.0F};
  data.append(reinterpret_cast<const char*>(values), sizeof(values));
  std::string header =
      R"({"b":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"f":{"dtype":"F32","shape":[2],"data_offsets":[1,9]}})";
  header.append((8 - header.size() % 8) % 8, ' ');  // the buffer 8-aligned, so "f" lies at an odd address
  const SafetensorsFile file = SafetensorsFile::open(put_file(dir, "odd.safetensors", safetensors_bytes(header, data)));
  expect_identical(at::tensor({1.5F, -2.0F}), file.tensor("f"), "f");
  expect_identical(at::tensor({7}, at::kByte), file.tensor("b"), "b");
}

TEST(Safetensors, ATypeLibTorchLacksIsListedButNotRead) {
  TempDir dir;
  const std::string header =
      R"({"f8":{"dtype":"F8_E4M3","shape":[2],"data_offsets":[0,2]},"w":{"dtype":"I8","shape":[2],"data_offsets":[2,4]}})";
  const SafetensorsFile file =
      SafetensorsFile::open(put_file(dir, "f8.safetensors", safetensors_bytes(header, "\x01\x02\x03\x04")));
  EXPECT_EQ(file.info("f8").dtype_name, "F8_E4M3");
  EXPECT_EQ(file.info("f8").dtype, c10::ScalarType::Undefined);
  expect_identical(at::tensor({3, 4}, at::kChar), file.tensor("w"), "w");
  const std::string message = error_message<CheckpointError>([&] { file.tensor("f8"); });
  EXPECT_NE(message.find("F8_E4M3"), std::string::npos) << message;
  EXPECT_NE(message.find("LibTorch"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
}

TEST(Safetensors, AMissingNameIsAnErrorNamingTheClosestNames) {
  TempDir dir;
  save_safetensors(dir.file("m.safetensors"),
                   {{"fc1.weight", at::ones({1})}, {"fc1.bias", at::ones({1})}, {"zzzzzzzz", at::ones({1})}});
  const SafetensorsFile file = SafetensorsFile::open(dir.file("m.safetensors"));
  const std::string message = error_message<CheckpointError>([&] { file.tensor("fc1.weigth"); });
  EXPECT_NE(message.find("no tensor named 'fc1.weigth'"), std::string::npos) << message;
  EXPECT_NE(message.find("closest names: fc1.weight, fc1.bias"), std::string::npos) << message;
  EXPECT_NE(message.find(dir.file("m.safetensors")), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  EXPECT_FALSE(file.contains("fc1.weigth"));
  EXPECT_NE(error_message<CheckpointError>([&] { file.info("x"); }).find("no tensor named 'x'"), std::string::npos);
}

TEST(Safetensors, MissingFilesAndDirectoriesAreErrorsWithAHint) {
  TempDir dir;
  std::string message = error_message<CheckpointError>([&] { SafetensorsFile::open(dir.file("none.safetensors")); });
  EXPECT_NE(message.find("is missing"), std::string::npos) << message;
  EXPECT_NE(message.find(dir.file("none.safetensors")), std::string::npos) << message;
  message = error_message<CheckpointError>([&] { SafetensorsFile::open(dir.path().string()); });
  EXPECT_NE(message.find("is a directory"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
}

TEST(Safetensors, AHeaderPaddedWithSpacesIsRead) {
  const std::string header = R"({"w":{"dtype":"I16","shape":[],"data_offsets":[0,2]}})" + std::string(13, ' ');
  TempDir dir;
  const SafetensorsFile file =
      SafetensorsFile::open(put_file(dir, "pad.safetensors", safetensors_bytes(header, std::string("\xff\x7f", 2))));
  expect_identical(at::scalar_tensor(32767, at::kShort), file.tensor("w"), "w");
}

TEST(Safetensors, EveryBadInputIsAnErrorThatSaysWhatIsWrong) {
  const std::string ok_entry = R"("w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string eight(8, '\0');
  const struct {
    const char* why;
    std::string bytes;
    const char* expected;
  } cases[] = {
      {"empty file", "", "is 0 bytes long"},
      {"shorter than 8 bytes", "abc", "is 3 bytes long, shorter than the 8-byte header length"},
      {"header beyond the file", safetensors_bytes("{}").substr(0, 9), "declares a header of 2 bytes, but only 1"},
      {"header beyond 100 MB", std::string("\x01\xe1\xf5\x05\x00\x00\x00\x00", 8) + "{}",
       "declares a header of 100000001 bytes, more than the 100000000 a safetensors header may take"},
      {"a zip archive", "PK\x03\x04" + std::string(40, 'x'), "torch.save zip archive"},
      {"not JSON", safetensors_bytes("{\"w\": nope}"), "is not valid JSON"},
      {"not an object", safetensors_bytes("[1, 2]"), "expected a JSON object starting with '{'"},
      {"empty header", safetensors_bytes(""), "is empty (N = 0)"},
      {"invalid UTF-8", safetensors_bytes("{\"\xff\": 1}"), "is not valid JSON"},
      {"a name twice", safetensors_bytes("{" + ok_entry + "," + ok_entry + "}", eight), "names 'w' twice"},
      {"entry not an object", safetensors_bytes(R"({"w": 3})"), "entry for tensor 'w' is 3, expected an object"},
      {"entry lacking a field", safetensors_bytes(R"({"w":{"dtype":"F32","shape":[2]}})", eight),
       "entry for tensor 'w' lacks \"data_offsets\" (it has [dtype, shape])"},
      {"unknown dtype", one_tensor(R"("F12")", "[2]", "[0,8]"),
       "has dtype \"F12\", which the safetensors format does not have; expected one of BOOL, U8"},
      {"lower-case dtype", one_tensor(R"("f32")", "[2]", "[0,8]"), "has dtype \"f32\""},
      {"negative size", one_tensor(R"("F32")", "[-2]", "[0,8]"),
       "has shape [-2], expected a list of non-negative integers"},
      {"fractional size", one_tensor(R"("F32")", "[2.0]", "[0,8]"), "has shape [2.0]"},
      {"one offset", one_tensor(R"("F32")", "[2]", "[8]"), "has data_offsets [8], expected [begin, end]"},
      {"offsets reversed", one_tensor(R"("F32")", "[0]", "[8,0]"),
       "has data_offsets [8,0], expected [begin, end] with 0 <= begin <= end"},
      {"size disagrees", one_tensor(R"("F32")", "[3]", "[0,8]"),
       "(F32 of shape [3]) takes 12 bytes, but its data_offsets [0, 8] span 8"},
      {"size overflows", one_tensor(R"("F64")", "[4611686018427387904,4]", "[0,8]"), "overflows 64 bits"},
      {"offsets outside the buffer", one_tensor(R"("F32")", "[2]", "[4,12]"),
       "has data_offsets [4, 12], beyond the byte buffer's 8 bytes"},
      {"a hole", one_tensor(R"("F32")", "[1]", "[4,8]"),
       "bytes [0, 4) of the byte buffer belong to no tensor (a hole before tensor 'w')"},
      {"an overlap",
       safetensors_bytes(
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
           eight),
       "tensor 'b' at data_offsets [4, 8] overlaps tensor 'a' at [0, 8]"},
      {"bytes past the last tensor", safetensors_bytes("{" + ok_entry + "}", eight + "tail"),
       "the byte buffer holds 12 bytes, but its tensors cover only the first 8"},
      {"metadata not an object", safetensors_bytes(R"({"__metadata__":[1]})"),
       "\"__metadata__\" is [1], expected an object of strings"},
      {"metadata not strings", safetensors_bytes(R"({"__metadata__":{"epoch":3}})"),
       "\"__metadata__\" maps 'epoch' to 3, expected a string"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.why);
    const std::string message = open_error(c.bytes);
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
  }
}

TEST(Safetensors, ParsingChecksTheSameBytesWithoutAFile) {
  const std::string bytes = safetensors_bytes(
      R"({"w":{"dtype":"BF16","shape":[2,1],"data_offsets":[0,4]},"__metadata__":{"k":"v"}})", "abcd");
  const SafetensorsHeader header = parse_safetensors_header(bytes, "in memory");
  ASSERT_EQ(header.entries.size(), 1U);
  EXPECT_EQ(header.entries[0].name, "w");
  EXPECT_EQ(header.entries[0].dtype, SafetensorsDtype::kBF16);
  EXPECT_EQ(header.entries[0].shape, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(header.data_start, bytes.size() - 4);
  EXPECT_EQ(header.entries[0].begin, header.data_start);
  EXPECT_EQ(header.entries[0].end, bytes.size());
  EXPECT_EQ(header.metadata, (std::map<std::string, std::string>{{"k", "v"}}));
  const std::string message =
      error_message<CheckpointError>([&] { parse_safetensors_header(bytes.substr(0, 5), "in memory"); });
  EXPECT_NE(message.find("in memory is 5 bytes long"), std::string::npos) << message;
}

TEST(Safetensors, DtypeNamesAreTheFormatsAndCaseSensitive) {
  for (const char* name : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "I16", "U16", "F16", "BF16", "I32", "U32", "F32",
                           "F64", "I64", "U64"}) {
    const std::optional<SafetensorsDtype> dtype = parse_safetensors_dtype(name);
    ASSERT_TRUE(dtype.has_value()) << name;
    EXPECT_STREQ(to_string(*dtype), name);
  }
  EXPECT_FALSE(parse_safetensors_dtype("f32").has_value());
  EXPECT_EQ(element_size(SafetensorsDtype::kBF16), 2);
  EXPECT_EQ(element_size(SafetensorsDtype::kU64), 8);
}

TEST(Safetensors, WritingRefusesBadTensorsBeforeTouchingTheFile) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"old", at::ones({1})}});
  const std::string before = file_contents(path);
  const struct {
    const char* why;
    NamedTensors tensors;
    const char* expected;
  } cases[] = {
      {"a name twice", {{"w", at::ones({1})}, {"w", at::ones({2})}}, "the tensor name 'w' is given twice"},
      {"the metadata key", {{"__metadata__", at::ones({1})}}, "'__metadata__' is the format's key"},
      {"undefined", {{"w", at::Tensor()}}, "tensor 'w' is undefined"},
      {"complex", {{"w", at::ones({1}, at::kComplexFloat)}}, "has dtype ComplexFloat, which Volt cannot write"},
      {"sparse", {{"w", at::ones({2, 2}).to_sparse()}}, "expected a dense tensor"},
      {"a name not UTF-8", {{"w\xff", at::ones({1})}}, "is not valid UTF-8"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.why);
    const std::string message = error_message<Error>([&] { save_safetensors(path, c.tensors); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << message;
    EXPECT_NE(message.find(path), std::string::npos) << message;
    EXPECT_NE(message.find("HINT:"), std::string::npos) << message;
  }
  EXPECT_EQ(file_contents(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);  // no temporary left
}

TEST(Safetensors, AnAtomicWriteThatFailsLeavesTheOldFile) {
  TempDir dir;
  const std::string path = dir.file("m.safetensors");
  save_safetensors(path, {{"old", at::ones({1})}});
  const std::string before = file_contents(path);
  EXPECT_THROW(write_file_atomically(path,
                                     [](const ByteSink& sink) {
                                       sink("partial", 7);
                                       throw Error("the producer failed");
                                     }),
               Error);
  EXPECT_EQ(file_contents(path), before);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

std::vector<std::string> files_in(const fs::path& directory) {
  std::vector<std::string> names;
  for (const auto& item : fs::directory_iterator(directory)) names.push_back(item.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(Safetensors, AFolderIsShardedAsSavePretrainedShardsIt) {
  TempDir dir;
  // 40 + 40 + 40 + 100 + 8 bytes with a 90-byte limit, as huggingface_hub splits them: c would tip
  // [a, b] over, so it starts the next shard; big exceeds the limit, so it gets a shard of its own
  // at once; d still fits beside c. Shards: [a, b], [big], [c, d].
  const NamedTensors tensors = {{"a", at::ones({10})},
                                {"b", at::full({10}, 2.0)},
                                {"c", at::full({10}, 3.0)},
                                {"big", at::arange(25, at::kFloat)},
                                {"d", at::ones({1}, at::kDouble)}};
  const std::vector<std::string> expected_files = {"model-00001-of-00003.safetensors",
                                                   "model-00002-of-00003.safetensors",
                                                   "model-00003-of-00003.safetensors", "model.safetensors.index.json"};
  EXPECT_EQ(save_safetensors_folder(dir.path().string(), tensors, 90), expected_files);
  EXPECT_EQ(files_in(dir.path()), expected_files);

  const auto index = nlohmann::json::parse(file_contents(dir.file("model.safetensors.index.json")));
  EXPECT_EQ(index["metadata"]["total_size"], 228);
  EXPECT_EQ(index["weight_map"]["a"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["b"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["big"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["c"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["d"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(SafetensorsFile::open(dir.file("model-00002-of-00003.safetensors")).metadata(),
            (SafetensorsMetadata{{"format", "pt"}}));

  const auto located = read_safetensors_folder(dir.path().string());
  ASSERT_EQ(located.size(), 5U);
  EXPECT_EQ(located.at("big").file, dir.file("model-00002-of-00003.safetensors"));
  EXPECT_EQ(located.at("big").info.shape, (std::vector<int64_t>{25}));
  EXPECT_EQ(located.at("d").info.dtype, c10::ScalarType::Double);

  const NamedTensors loaded = load_safetensors(dir.path().string());
  ASSERT_EQ(loaded.size(), tensors.size());
  for (const auto& [name, tensor] : loaded) {
    const auto expected =
        std::find_if(tensors.begin(), tensors.end(), [&, n = name](const auto& item) { return item.first == n; });
    ASSERT_NE(expected, tensors.end()) << name;
    expect_identical(expected->second, tensor, name);
  }
}

TEST(Safetensors, ASaveThatFitsOneFileWritesModelSafetensorsAndRemovesAnOlderSavesShards) {
  TempDir dir;
  save_safetensors_folder(dir.path().string(), {{"a", at::ones({10})}, {"b", at::ones({10})}}, 40);
  put_file(dir, "config.json", "{}");  // not a weights file: kept
  EXPECT_EQ(files_in(dir.path()).size(), 4U);
  const std::vector<std::string> written =
      save_safetensors_folder(dir.path().string(), {{"a", at::zeros({10})}, {"b", at::zeros({10})}});
  EXPECT_EQ(written, (std::vector<std::string>{"model.safetensors"}));
  EXPECT_EQ(files_in(dir.path()), (std::vector<std::string>{"config.json", "model.safetensors"}));
  expect_identical(at::zeros({10}), load_safetensors(dir.path().string()).at(0).second, "a");
}

TEST(Safetensors, AFolderWithBothFilesReadsModelSafetensorsAsTransformersDoes) {
  TempDir dir;
  save_safetensors_folder(dir.path().string(), {{"a", at::ones({10})}, {"b", at::ones({10})}}, 40);
  save_safetensors(dir.file("model.safetensors"), {{"only", at::ones({1})}});
  const auto located = read_safetensors_folder(dir.path().string());
  ASSERT_EQ(located.size(), 1U);
  EXPECT_EQ(located.begin()->first, "only");
}

TEST(Safetensors, ABadFolderIsAnErrorNamingTheFileAtFault) {
  TempDir dir;
  const std::string folder = dir.path().string();
  const auto folder_error = [&] { return error_message<CheckpointError>([&] { read_safetensors_folder(folder); }); };

  put_file(dir, "other.safetensors", safetensors_bytes("{}      "));
  std::string message = folder_error();
  EXPECT_NE(message.find("holds neither model.safetensors nor model.safetensors.index.json"), std::string::npos)
      << message;
  EXPECT_NE(message.find("[other.safetensors]"), std::string::npos) << message;

  const std::string index = put_file(dir, "model.safetensors.index.json", "{\"weight_map\": ");
  message = folder_error();
  EXPECT_NE(message.find(index), std::string::npos) << message;
  EXPECT_NE(message.find("not JSON"), std::string::npos) << message;

  put_file(dir, "model.safetensors.index.json", R"({"metadata": {}})");
  EXPECT_NE(folder_error().find("no \"weight_map\" object"), std::string::npos);

  put_file(dir, "model.safetensors.index.json", R"({"weight_map": {"w": "../escape.safetensors"}})");
  EXPECT_NE(folder_error().find("expected a file name inside its folder"), std::string::npos);

  put_file(dir, "model.safetensors.index.json",
           R"({"weight_map": {"w": "model-00001-of-00002.safetensors", "v": "model-00002-of-00002.safetensors"}})");
  save_safetensors(dir.file("model-00001-of-00002.safetensors"), {{"w", at::ones({1})}});
  message = folder_error();
  EXPECT_NE(message.find("maps 1 tensors to 'model-00002-of-00002.safetensors', which is missing"), std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos) << message;

  save_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"u", at::ones({1})}});
  message = folder_error();
  EXPECT_NE(message.find("maps tensor 'v' to 'model-00002-of-00002.safetensors', which holds no such tensor"),
            std::string::npos)
      << message;

  save_safetensors(dir.file("model-00002-of-00002.safetensors"), {{"v", at::ones({1})}});
  EXPECT_EQ(read_safetensors_folder(folder).size(), 2U);

  message = error_message<CheckpointError>([&] { read_safetensors_folder(dir.file("missing")); });
  EXPECT_NE(message.find("is missing"), std::string::npos) << message;
  message = error_message<CheckpointError>([&] { read_safetensors_folder(index); });
  EXPECT_NE(message.find("is a file"), std::string::npos) << message;
}

TEST(Safetensors, AShardLimitBelowOneByteIsRefused) {
  TempDir dir;
  const std::string message = error_message<Error>([&] {
    save_safetensors_folder(dir.path().string(), {{"w", at::ones({1})}}, 0);
  });
  EXPECT_NE(message.find("max_shard_bytes is 0, expected at least 1"), std::string::npos) << message;
}

}  // namespace
}  // namespace volt
