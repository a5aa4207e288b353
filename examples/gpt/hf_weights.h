// Hugging Face GPT-2 weights in and out of gpt::Gpt: a folder as GPT2LMHeadModel.save_pretrained
// writes it (config.json plus model.safetensors, or shards and model.safetensors.index.json).
//
// The names are GPT2LMHeadModel's: a Gpt parameter `p` is `transformer.p` in the file. Files on the
// hub name tensors with or without the `transformer.` prefix (GPT2Model's files have none), some
// carry `lm_head.weight` (the same values as wte.weight: GPT-2 ties them) and older ones the
// attention-mask buffers `h.<i>.attn.bias` / `h.<i>.attn.masked_bias`. Hugging Face's projections
// are Conv1D, whose weight is a Linear's transposed ([in, out]): c_attn, c_proj and c_fc weights are
// transposed on the way in and out.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gpt/gpt_model.h"
#include "volt/checkpoint/safetensors.h"
#include "volt/checkpoint/weight_source.h"

namespace gpt {

/// Whether the Gpt parameter `name` (e.g. "h.0.attn.c_attn.weight") is a Conv1D weight in Hugging
/// Face's files, stored transposed.
bool is_conv1d_weight(const std::string& name);

/// The GptConfig of the Hugging Face GPT-2 folder `directory`: its config.json (load_hf_config).
/// Throws volt::Error naming the folder with a HINT when it has no config.json.
GptConfig load_hf_folder_config(const std::string& directory);

/// The weights of a Hugging Face GPT-2 folder, checked against a model, read by parameter and by
/// element range: what `gpt --init-from` trains from (GptModule returns it as its initial_weights).
/// Under fsdp's full_shard the Trainer asks each process only for the elements of each block it
/// keeps, and only those rows are copied out of the memory-mapped files; a Conv1D weight's rows
/// are columns of the file, so those are copied column by column.
class HfWeights : public volt::WeightSource {
 public:
  /// Opens the folder `directory` and checks it against `model` before anything is read: throws
  /// volt::Error (volt::CheckpointError for unreadable, truncated or malformed files), naming the
  /// tensor and its file with a HINT, for a tensor the model lacks or a parameter the file lacks, a
  /// wrong shape (the config.json that sized `model` disagrees with the tensors), a dtype that is
  /// not floating point, an `lm_head.weight` that differs from `wte.weight` (both read whole to
  /// compare), or a name given both with and without the `transformer.` prefix. The
  /// attention-mask buffers are accepted and ignored.
  HfWeights(Gpt& model, std::string directory);
  /// The folder.
  std::string describe() const override { return directory_; }
  /// Elements [begin, end) of Gpt parameter `name` (with or without GptModule's "transformer."
  /// prefix) in the model's layout, as fp32 (F16, BF16 and F64 tensors are converted).
  at::Tensor read(const std::string& name, const std::vector<int64_t>& shape, int64_t begin, int64_t end) override;
  /// Bytes of tensor data copied out of the folder's files so far.
  int64_t bytes_read() const { return bytes_read_; }
  /// Bytes of the model's tensors in the folder: what reading every parameter whole copies.
  int64_t bytes_total() const { return bytes_total_; }

 private:
  struct Entry {
    std::string name;  // as the file names it
    volt::SafetensorsLocation location;
  };
  const volt::SafetensorsFile& file(const std::string& path);

  std::string directory_;
  std::map<std::string, Entry> parameters_;  // by Gpt parameter name
  std::map<std::string, volt::SafetensorsFile> files_;
  int64_t bytes_read_ = 0;
  int64_t bytes_total_ = 0;
};

/// Copies the weights of the Hugging Face GPT-2 folder `directory` into `model`, each parameter
/// whole (HfWeights, which checks everything before a parameter changes and says what it throws).
void load_hf_weights(Gpt& model, const std::string& directory);

/// The tensors of `model` as GPT2LMHeadModel names and lays them out (`transformer.` prefix, Conv1D
/// weights transposed, no lm_head.weight: it is tied), as contiguous fp32 CPU copies.
volt::NamedTensors hf_state_dict(Gpt& model);

/// The config.json GPT2LMHeadModel.from_pretrained needs for a model of `config`.
nlohmann::json hf_config_json(const GptConfig& config);

/// Writes `model` into the folder `directory` as GPT2LMHeadModel.save_pretrained does: config.json
/// and model.safetensors (metadata {"format": "pt"}), each file atomically (the weights first), so
/// that transformers loads it without missing or unexpected keys. Creates the folder; weight files
/// of an earlier save there (shards, an index) are removed. Throws volt::CheckpointError when a
/// file cannot be written.
void save_hf_pretrained(Gpt& model, const std::string& directory);

}  // namespace gpt
