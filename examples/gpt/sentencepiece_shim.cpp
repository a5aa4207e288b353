// The one translation unit that calls libsentencepiece, built as a module that token_corpus.cpp
// loads with dlopen(RTLD_LOCAL | RTLD_DEEPBIND).
//
// Why: Debian's libsentencepiece.so.0 carries its own copy of protobuf-lite and exports its
// symbols. Linked into a program that also loads libprotobuf.so (LibTorch, ONNX, Volt's
// TensorBoard writer), one library's protobuf calls bind to the other's and the program crashes
// before main. Loaded locally and deep-bound, the tokenizer keeps its protobuf to itself.
//
// The interface is C linkage (looked up by name with dlsym); the strings and vectors passed are
// the program's own (one libstdc++ is loaded).
#include <sentencepiece_processor.h>

#include <string>
#include <vector>

extern "C" {

/// A processor for the model file `path`, or null with `error` set.
void* volt_spm_load(const char* path, std::string* error) {
  auto* processor = new sentencepiece::SentencePieceProcessor();
  const auto status = processor->Load(path);
  if (status.ok()) return processor;
  *error = status.ToString();
  delete processor;
  return nullptr;
}

/// Frees a processor of volt_spm_load.
void volt_spm_free(void* processor) { delete static_cast<sentencepiece::SentencePieceProcessor*>(processor); }

/// The processor's pieces.
int volt_spm_piece_size(const void* processor) {
  return static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->GetPieceSize();
}

/// Encodes `text` into `ids`; false with `error` set when SentencePiece cannot.
bool volt_spm_encode(const void* processor, const std::string* text, std::vector<int>* ids, std::string* error) {
  const auto status = static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->Encode(*text, ids);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

/// Decodes `ids` into `text`; false with `error` set when SentencePiece cannot.
bool volt_spm_decode(const void* processor, const std::vector<int>* ids, std::string* text, std::string* error) {
  const auto status = static_cast<const sentencepiece::SentencePieceProcessor*>(processor)->Decode(*ids, text);
  if (!status.ok()) *error = status.ToString();
  return status.ok();
}

}  // extern "C"
