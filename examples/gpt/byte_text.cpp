#include "gpt/byte_text.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

#include "volt/core/error.h"

namespace gpt {

torch::Tensor encode_bytes(const std::string& text) {
  std::vector<int64_t> ids(text.begin(), text.end());
  for (int64_t& id : ids) id &= 0xff;  // char may be signed
  return torch::tensor(ids, torch::kLong);
}

torch::Tensor read_byte_tokens(const std::string& path) {
  // A folder opens as a stream on Linux and fails only at the first read, with errno's words.
  VOLT_CHECK(!std::filesystem::is_directory(path),
             "--text={} is a folder; expected a plain text file. HINT: concatenate its files (cat {}/*.txt > "
             "all.txt), or tokenize them into a corpus: scripts/prepare-text-corpus.py OUT --source {} --glob "
             "'*.txt', then --data OUT.",
             path, path, path);
  std::ifstream in(path, std::ios::binary);
  VOLT_CHECK(in.good(), "cannot read the text file {}. HINT: --text takes a path to a plain text file.", path);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return encode_bytes(text);
}

namespace {

// The length of the well-formed UTF-8 sequence starting at bytes[i] (Unicode's table 3-7: no
// overlong forms, surrogates or code points past U+10FFFF), or 0 when there is none.
size_t utf8_length(const std::vector<unsigned char>& bytes, size_t i) {
  const unsigned char lead = bytes[i];
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char low = 0x80, high = 0xbf;  // the range of the second byte
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    if (lead == 0xe0) low = 0xa0;
    if (lead == 0xed) high = 0x9f;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    if (lead == 0xf0) low = 0x90;
    if (lead == 0xf4) high = 0x8f;
  }
  if (length == 0 || i + length > bytes.size() || bytes[i + 1] < low || bytes[i + 1] > high) return 0;
  for (size_t k = 2; k < length; ++k) {
    if (bytes[i + k] < 0x80 || bytes[i + k] > 0xbf) return 0;
  }
  return length;
}

}  // namespace

std::string decode_bytes(const torch::Tensor& tokens) {
  const torch::Tensor ids = tokens.to(torch::kCPU, torch::kLong).contiguous().reshape({-1});
  std::vector<unsigned char> bytes;
  bytes.reserve(static_cast<size_t>(ids.numel()));
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) bytes.push_back(static_cast<unsigned char>(id[i] & 0xff));
  std::string text;
  for (size_t i = 0; i < bytes.size();) {
    const size_t length = utf8_length(bytes, i);
    const bool control = length == 1 && bytes[i] < 0x20 && bytes[i] != '\n' && bytes[i] != '\t';
    if (length == 0 || control || bytes[i] == 0x7f) {
      text += fmt::format("\\x{:02x}", bytes[i]);
      ++i;
      continue;
    }
    text.append(bytes.begin() + static_cast<std::ptrdiff_t>(i),
                bytes.begin() + static_cast<std::ptrdiff_t>(i + length));
    i += length;
  }
  return text;
}

std::shared_ptr<volt::Dataset> token_windows(const torch::Tensor& tokens, int64_t block_size) {
  VOLT_CHECK(tokens.dim() == 1 && tokens.size(0) >= block_size + 1,
             "{} tokens make no window of block_size + 1 = {} tokens. HINT: use a longer text or a smaller "
             "--block-size.",
             tokens.numel(), block_size + 1);
  const torch::Tensor windows = tokens.unfold(0, block_size + 1, block_size);  // [n, block_size + 1], a view
  return std::make_shared<volt::TensorDataset>(windows.narrow(1, 0, block_size), windows.narrow(1, 1, block_size));
}

}  // namespace gpt
