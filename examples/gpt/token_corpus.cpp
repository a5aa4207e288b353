#include "gpt/token_corpus.h"

#include <dlfcn.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "volt/core/error.h"

namespace gpt {

namespace {

constexpr const char* kPrepareHint = "HINT: write the corpus with scripts/prepare-text-corpus.py FOLDER.";

int64_t integer(const nlohmann::json& json, const nlohmann::json::json_pointer& at, const std::string& path) {
  VOLT_CHECK(json.contains(at) && json.at(at).is_number_integer(), "{} has no integer {}. {}", path, at.to_string(),
             kPrepareHint);
  return json.at(at).get<int64_t>();
}

}  // namespace

CorpusMeta read_corpus_meta(const std::string& folder) {
  const std::string path = (std::filesystem::path(folder) / "meta.json").string();
  std::ifstream in(path);
  VOLT_CHECK(in.good(), "cannot read {}: --data takes a folder of token shards with a meta.json. {}", path,
             kPrepareHint);
  nlohmann::json json;
  try {
    json = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw volt::Error(fmt::format("{} is not JSON: {}. {}", path, e.what(), kPrepareHint));
  }
  using Pointer = nlohmann::json::json_pointer;
  CorpusMeta meta{.vocab_size = integer(json, Pointer("/vocab_size"), path),
                  .separator_id = integer(json, Pointer("/separator_id"), path),
                  .val_tokens = integer(json, Pointer("/splits/val/tokens"), path),
                  .val_bytes = integer(json, Pointer("/splits/val/bytes"), path)};
  VOLT_CHECK(meta.vocab_size > 0 && meta.val_tokens >= 0 && meta.val_bytes >= 0,
             "{} says vocab_size={}, val tokens={}, val bytes={}; expected a positive vocabulary and counts >= 0. {}",
             path, meta.vocab_size, meta.val_tokens, meta.val_bytes, kPrepareHint);
  return meta;
}

// The shim's functions (sentencepiece_shim.cpp), from the module loaded once per process.
struct Tokenizer::Library {
  void* (*load)(const char*, std::string*) = nullptr;
  void (*free)(void*) = nullptr;
  int (*piece_size)(const void*) = nullptr;
  bool (*encode)(const void*, const std::string*, std::vector<int>*, std::string*) = nullptr;
  bool (*decode)(const void*, const std::vector<int>*, std::string*, std::string*) = nullptr;

  static std::shared_ptr<const Library> get() {
    static const std::shared_ptr<const Library> library = open();
    return library;
  }

 private:
  static std::shared_ptr<const Library> open() {
    std::vector<std::string> tried;
    std::error_code error;
    const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", error);
    for (const std::string& path :
         {(exe.parent_path() / kShimName).string(), std::string(VOLT_GPT_SENTENCEPIECE_SHIM)}) {
      void* handle = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
      if (handle) return std::make_shared<const Library>(bind(handle, path));
      tried.push_back(fmt::format("{} ({})", path, ::dlerror()));
    }
    throw volt::Error(
        fmt::format("cannot load the SentencePiece module: tried {}. HINT: build the target "
                    "gpt_sentencepiece (it is built with gpt) and keep it beside the gpt program.",
                    fmt::join(tried, ", ")));
  }

  template <typename F>
  static void symbol(void* handle, const char* name, F& function, const std::string& path) {
    function = reinterpret_cast<F>(::dlsym(handle, name));
    VOLT_CHECK(function != nullptr, "{} has no function {}. HINT: rebuild the target gpt_sentencepiece.", path, name);
  }

  static Library bind(void* handle, const std::string& path) {
    Library library;
    symbol(handle, "volt_spm_load", library.load, path);
    symbol(handle, "volt_spm_free", library.free, path);
    symbol(handle, "volt_spm_piece_size", library.piece_size, path);
    symbol(handle, "volt_spm_encode", library.encode, path);
    symbol(handle, "volt_spm_decode", library.decode, path);
    return library;  // the module stays loaded: a process loads it once
  }

  static constexpr const char* kShimName = "libgpt_sentencepiece.so";
};

Tokenizer::Tokenizer(const std::string& folder) : library_(Library::get()) {
  const std::string path = (std::filesystem::path(folder) / "tokenizer.model").string();
  std::string error;
  processor_ = library_->load(path.c_str(), &error);
  VOLT_CHECK(processor_ != nullptr, "cannot load the SentencePiece model {}: {}. {}", path, error, kPrepareHint);
}

Tokenizer::~Tokenizer() { library_->free(processor_); }

torch::Tensor Tokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  std::string error;
  VOLT_CHECK(library_->encode(processor_, &text, &ids, &error), "SentencePiece cannot encode '{}': {}", text, error);
  return torch::tensor(std::vector<int64_t>(ids.begin(), ids.end()), torch::kLong);
}

std::string Tokenizer::decode(const torch::Tensor& tokens) const {
  const torch::Tensor ids = tokens.to(torch::kCPU, torch::kLong).contiguous().reshape({-1});
  std::vector<int> known;
  const int64_t* id = ids.data_ptr<int64_t>();
  for (int64_t i = 0; i < ids.numel(); ++i) {
    if (id[i] >= 0 && id[i] < vocab_size()) known.push_back(static_cast<int>(id[i]));
  }
  std::string text, error;
  VOLT_CHECK(library_->decode(processor_, &known, &text, &error), "SentencePiece cannot decode {} tokens: {}",
             known.size(), error);
  return text;
}

int64_t Tokenizer::vocab_size() const { return library_->piece_size(processor_); }

}  // namespace gpt
