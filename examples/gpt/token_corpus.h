// A tokenized corpus as scripts/prepare-text-corpus.py writes it: SentencePiece token shards
// (train-*.npy, val-*.npy), the tokenizer (tokenizer.model) and what they hold (meta.json).
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace gpt {

/// What meta.json says of a corpus folder.
struct CorpusMeta {
  /// The tokenizer's pieces: token ids are below it.
  int64_t vocab_size = 0;
  /// The token between two documents (SentencePiece's end-of-sequence id).
  int64_t separator_id = 0;
  /// Tokens and UTF-8 bytes of the validation split: val/bpb = val/loss * val_tokens /
  /// (val_bytes * ln 2), the bits a model needs per byte of text, comparable across tokenizers.
  int64_t val_tokens = 0;
  int64_t val_bytes = 0;  ///< see val_tokens
};

/// Reads `folder`/meta.json; throws volt::Error when it is missing or lacks a field, with a HINT
/// to run scripts/prepare-text-corpus.py.
CorpusMeta read_corpus_meta(const std::string& folder);

/// Encodes and decodes text with the SentencePiece model `folder`/tokenizer.model, through
/// libsentencepiece's SentencePieceProcessor in a module of its own (sentencepiece_shim.cpp says
/// why): libgpt_sentencepiece.so beside the program, or where the build put it.
class Tokenizer {
 public:
  /// Loads the model; throws volt::Error when it cannot.
  explicit Tokenizer(const std::string& folder);
  ~Tokenizer();
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  /// The token ids of `text`, int64 [N].
  torch::Tensor encode(const std::string& text) const;
  /// The text of token ids [N]; ids the tokenizer does not have (a model's vocabulary rounded up
  /// past the tokenizer's) are left out.
  std::string decode(const torch::Tensor& tokens) const;
  /// The tokenizer's pieces.
  int64_t vocab_size() const;

 private:
  struct Library;
  std::shared_ptr<const Library> library_;  // the loaded module's functions
  void* processor_ = nullptr;
};

}  // namespace gpt
