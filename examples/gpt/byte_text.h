// Byte-level tokenization: each byte of a text is one token (vocabulary 256). Enough to train
// on any file without a tokenizer; a real corpus with SentencePiece comes later (issue #31).
#pragma once

#include <torch/types.h>

#include <memory>
#include <string>

#include "volt/data/dataset.h"

namespace gpt {

/// The vocabulary of byte-level tokens.
inline constexpr int64_t kByteVocabSize = 256;

/// The bytes of `text` as int64 token ids [text.size()].
torch::Tensor encode_bytes(const std::string& text);
/// The bytes of the file at `path` as int64 token ids; throws volt::Error when it cannot be read.
torch::Tensor read_byte_tokens(const std::string& path);
/// The text token ids [N] (each < 256) spell, printable: valid UTF-8 and newlines and tabs as
/// they are, any other byte (a broken sequence, a control character) as "\xNN". A model early in
/// training writes such bytes, and a terminal or a test reading the output as UTF-8 should not
/// choke on them.
std::string decode_bytes(const torch::Tensor& tokens);

/// Training examples from a token stream [N]: windows of block_size + 1 tokens starting every
/// block_size tokens (each shares its first token with the previous window's last; a trailing
/// partial window dropped), as data = the first block_size tokens and target = the last
/// block_size, so target[t] is the token after data[t]. Every token but the first is a target
/// once per epoch. Views of `tokens`: batches are gathered when the loader asks for them.
std::shared_ptr<volt::Dataset> token_windows(const torch::Tensor& tokens, int64_t block_size);

}  // namespace gpt
