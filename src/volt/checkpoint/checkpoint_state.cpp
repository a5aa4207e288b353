#include "volt/checkpoint/checkpoint_state.h"

#include <ATen/CPUGeneratorImpl.h>
#include <torch/cuda.h>

#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>
#include <unordered_map>

#include "volt/base/state_dict.h"
#include "volt/callbacks/callback.h"
#include "volt/checkpoint/checkpoint_io.h"
#include "volt/checkpoint/dcp_checkpoint.h"
#include "volt/checkpoint/dcp_writer.h"
#include "volt/checkpoint/hpc_checkpoints.h"
#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/optim/optimizer_state.h"
#include "volt/precision/precision_plugin.h"

namespace volt {

namespace {

/// What the callbacks' checkpoint hooks see: the module, its optimizers and where the run stands.
CallbackContext hook_context(const TrainingParts& parts, const FitProgress& progress) {
  CallbackContext context;
  context.epoch = progress.epoch;
  context.global_step = progress.global_step;
  context.module = parts.module;
  if (parts.optimization != nullptr) context.optimizers = &parts.optimization->optimizers;
  return context;
}

/// A key path as Python spells it, e.g. ["loops"]["fit_loop"]["epoch"].
std::string key_path(const std::string& parent, const std::string& key) {
  return fmt::format("{}[\"{}\"]", parent, key);
}

StateDict as_dict(const c10::IValue& value, const std::string& where, const std::string& path) {
  if (!value.isGenericDict()) {
    throw CheckpointError(
        fmt::format("checkpoint '{}' has no dictionary at {} (found {}). HINT: the file was "
                    "not written by Volt or Lightning; pass another ckpt_path.",
                    path, where.empty() ? "the top level" : where, value.tagKind()));
  }
  return value.toGenericDict();
}

/// `dict[key]`, where `dict` sits at `where` (a key path; "" for the top level). A missing entry
/// is named by its whole key path, with the keys that are there.
c10::IValue entry(const StateDict& dict, const std::string& key, const std::string& path,
                  const std::string& where = "") {
  if (!dict.contains(key)) {
    std::vector<std::string> keys;
    for (const auto& e : dict) keys.push_back(e.key().isString() ? e.key().toStringRef() : "?");
    throw CheckpointError(
        fmt::format("checkpoint '{}' lacks the entry {}; {} has: [{}]. HINT: resume from a checkpoint that "
                    "Volt's or Lightning's Trainer wrote; to load weights only, use volt::load_weights (the "
                    "example's --weights) or test(ckpt_path).",
                    path, key_path(where, key), where.empty() ? "its top level" : where, join(keys, ", ")));
  }
  return dict.at(key);
}

/// An integer entry (see entry).
int64_t int_entry(const StateDict& dict, const std::string& key, const std::string& path, const std::string& where) {
  const c10::IValue value = entry(dict, key, path, where);
  if (!value.isInt()) {
    throw CheckpointError(
        fmt::format("checkpoint '{}' holds a {} at {}; expected an integer. HINT: the file was "
                    "not written by Volt or Lightning; pass another ckpt_path.",
                    path, value.tagKind(), key_path(where, key)));
  }
  return value.toInt();
}

/// Lightning's progress tracker {"total": {...}, "current": {...}} as a dict of counters.
StateDict lightning_progress(int64_t total, int64_t current, const std::vector<const char*>& fields) {
  StateDict out = make_state_dict();
  for (const auto& [scope, count] : {std::pair{"total", total}, std::pair{"current", current}}) {
    StateDict counters = make_state_dict();
    for (const char* field : fields) counters.insert(field, count);
    out.insert(scope, counters);
  }
  return out;
}

/// Lightning 1.9's fit-loop progress for `progress` (one optimizer, automatic optimization), so
/// that Lightning's Trainer.fit(ckpt_path=...) continues where Volt stopped: after a finished
/// epoch (epoch_done) at the next one, inside an epoch at its next batch. Lightning reads these
/// keys and ignores Volt's; counters Lightning can rebuild itself (its scheduler and validation
/// progress) are left out, as its own loader allows.
void add_lightning_fit_progress(StateDict& fit_loop, const FitProgress& progress) {
  const std::vector<const char*> started = {"ready", "started", "processed", "completed"};
  // An epoch whose end-of-epoch work is done counts as processed, not completed: Lightning saves
  // its own end-of-epoch checkpoints at that point, and starts the next epoch from them.
  StateDict epoch = lightning_progress(0, 0, started);
  for (const char* scope : {"total", "current"}) {
    StateDict counters = epoch.at(scope).toGenericDict();
    counters.insert_or_assign("ready", progress.epoch + 1);
    counters.insert_or_assign("started", progress.epoch + 1);
    counters.insert_or_assign("processed", progress.epoch + (progress.epoch_done ? 1 : 0));
    counters.insert_or_assign("completed", progress.epoch);
  }
  fit_loop.insert("epoch_progress", epoch);
  StateDict batches = lightning_progress(progress.total_batches, progress.batches_done, started);
  batches.insert("is_last_batch", progress.epoch_done);
  fit_loop.insert("epoch_loop.batch_progress", batches);
  StateDict epoch_loop = make_state_dict();
  epoch_loop.insert("_batches_that_stepped", progress.global_step);
  fit_loop.insert("epoch_loop.state_dict", epoch_loop);
  StateDict optimizer = make_state_dict();
  optimizer.insert("step", lightning_progress(progress.global_step, progress.global_step, {"ready", "completed"}));
  optimizer.insert("zero_grad",
                   lightning_progress(progress.global_step, progress.global_step, {"ready", "started", "completed"}));
  StateDict optim_progress = make_state_dict();
  optim_progress.insert("optimizer", optimizer);
  optim_progress.insert("optimizer_position", int64_t{1});
  fit_loop.insert("epoch_loop.batch_loop.optimizer_loop.optim_progress", optim_progress);
  // Lightning 2.x's migration moves the optimizer progress only beside this (empty) state.
  fit_loop.insert("epoch_loop.batch_loop.optimizer_loop.state_dict", make_state_dict());
}

/// Where a Lightning checkpoint's fit loop stands. Saved at an epoch's end (its epoch processed
/// but not completed, or its last batch done), it resumes at the next epoch; saved inside an
/// epoch, at the batch after the last one it counted.
FitProgress lightning_fit_progress(const StateDict& top, const std::string& path) {
  const std::string loops_at = key_path("", "loops");
  const std::string fit_at = key_path(loops_at, "fit_loop");
  const StateDict fit_loop =
      as_dict(entry(as_dict(entry(top, "loops", path), loops_at, path), "fit_loop", path, loops_at), fit_at, path);
  const std::string epoch_at = key_path(fit_at, "epoch_progress");
  const std::string epoch_current_at = key_path(epoch_at, "current");
  const StateDict epoch_current = as_dict(
      entry(as_dict(entry(fit_loop, "epoch_progress", path, fit_at), epoch_at, path), "current", path, epoch_at),
      epoch_current_at, path);
  const std::string batch_at = key_path(fit_at, "epoch_loop.batch_progress");
  const StateDict batch = as_dict(entry(fit_loop, "epoch_loop.batch_progress", path, fit_at), batch_at, path);
  const StateDict batch_current = as_dict(entry(batch, "current", path, batch_at), key_path(batch_at, "current"), path);
  const StateDict batch_total = as_dict(entry(batch, "total", path, batch_at), key_path(batch_at, "total"), path);

  FitProgress progress;
  progress.epoch = int_entry(epoch_current, "completed", path, epoch_current_at);
  const int64_t processed = int_entry(epoch_current, "processed", path, epoch_current_at);
  const c10::IValue last_batch = batch.contains("is_last_batch") ? batch.at("is_last_batch") : c10::IValue(false);
  progress.epoch_done = processed > progress.epoch || (last_batch.isBool() && last_batch.toBool());
  progress.batches_done = int_entry(batch_current, "completed", path, key_path(batch_at, "current"));
  progress.total_batches = int_entry(batch_total, "completed", path, key_path(batch_at, "total"));
  progress.global_step = int_entry(top, "global_step", path, "");
  return progress;
}

/// The module's hyperparameters, plus the program's configuration under "config".
nlohmann::json hyper_parameters(const TrainingParts& parts) {
  nlohmann::json hparams = parts.module->hparams();
  if (parts.config == nullptr || parts.config->is_null()) return hparams;
  VOLT_CHECK(hparams.is_object() && !hparams.contains("config"),
             "the module's hyperparameters are {}; the checkpoint keeps the run's configuration under their key "
             "\"config\". HINT: save the hyperparameters as an object without a \"config\" key.",
             hparams.is_object() ? "an object with a \"config\" key" : "not an object");
  hparams["config"] = *parts.config;
  return hparams;
}

/// The default generator of CUDA device `index` (device-generic, so CPU builds compile it).
at::Generator cuda_generator(int64_t index) {
  return at::globalContext().defaultGenerator(c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(index)));
}

/// What only a resume needs besides the optimizers: callbacks, the loss scaler, the RNG states.
void insert_resume_state(StateDict& checkpoint, const TrainingParts& parts) {
  StateDict callbacks = make_state_dict();
  for (const auto& callback : *parts.callbacks) callbacks.insert(callback->state_key(), callback->state_dict());
  checkpoint.insert("callbacks", callbacks);

  if (parts.metric_states != nullptr) checkpoint.insert(kMetricsCheckpointKey, *parts.metric_states);

  if (parts.precision != nullptr) {
    const StateDict precision = parts.precision->state_dict();
    if (!precision.empty()) checkpoint.insert(kScalerCheckpointKey, precision);
  }

  StateDict rng = make_state_dict();
  {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    rng.insert("torch", generator.get_state());
  }
  // Lightning's "torch.cuda": each visible GPU's generator, so that dropout on a GPU resumes exactly.
  if (const int64_t gpus = static_cast<int64_t>(torch::cuda::device_count()); gpus > 0) {
    c10::impl::GenericList states(c10::AnyType::get());
    for (int64_t i = 0; i < gpus; ++i) {
      auto generator = cuda_generator(i);
      std::lock_guard<std::mutex> lock(generator.mutex());
      states.push_back(generator.get_state());
    }
    rng.insert("torch.cuda", states);
  }
  checkpoint.insert("rng_states", rng);
}

}  // namespace

namespace {

// The module's state_dict without `sharded` (names whose values lie in the shard files).
StateDict module_state_dict_without(const torch::nn::Module& module, const std::vector<std::string>& sharded) {
  const std::set<std::string> skip(sharded.begin(), sharded.end());
  StateDict out = make_state_dict();
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    if (!skip.count(item.key())) out.insert(item.key(), item.value().detach());
  for (const auto& item : module.named_buffers(/*recurse=*/true)) out.insert(item.key(), item.value().detach());
  return out;
}

}  // namespace

StateDict module_state_dict(const torch::nn::Module& module) { return module_state_dict_without(module, {}); }

namespace {

/// Each optimizer's parameters' names in the module, in the optimizer's order (across groups);
/// nullopt when one is not among the module's parameters (an optimizer over tensors of its own).
std::optional<c10::impl::GenericList> optimizer_parameter_names(const TrainingParts& parts) {
  const LightningModule& module = *parts.module;
  std::unordered_map<const c10::TensorImpl*, std::string> names;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
  c10::impl::GenericList all(c10::ListType::ofStrings());
  for (const auto& optimizer : parts.optimization->optimizers) {
    c10::List<std::string> list;
    for (const auto& group : optimizer->param_groups()) {
      for (const auto& param : group.params()) {
        const auto found = names.find(param.unsafeGetTensorImpl());
        std::optional<std::string> piece;
        if (found == names.end() && parts.parameter_name) piece = parts.parameter_name(param);
        if (found == names.end() && !piece) return std::nullopt;
        list.push_back(found != names.end() ? found->second : *piece);
      }
    }
    all.push_back(list);
  }
  return all;
}

}  // namespace

StateDict make_checkpoint(const TrainingParts& parts, const FitProgress& progress, CheckpointContents contents) {
  VOLT_INTERNAL_ASSERT(parts.module != nullptr && parts.optimization != nullptr && parts.callbacks != nullptr);
  StateDict checkpoint = make_state_dict();
  checkpoint.insert("epoch", progress.epoch);
  checkpoint.insert("global_step", progress.global_step);
  checkpoint.insert("volt_version", std::string(kVoltVersion));
  checkpoint.insert("volt_checkpoint_version", kCheckpointVersion);
  checkpoint.insert("pytorch-lightning_version", std::string(kLightningLayoutVersion));
  if (parts.sharded_parameters != nullptr && !parts.sharded_parameters->empty()) {
    checkpoint.insert("state_dict", module_state_dict_without(*parts.module, *parts.sharded_parameters));
    c10::impl::GenericList names(c10::StringType::get());
    for (const std::string& name : *parts.sharded_parameters) names.push_back(name);
    checkpoint.insert(kShardedParametersKey, names);
  } else {
    checkpoint.insert("state_dict", module_state_dict(*parts.module));
  }
  // Lightning's save_weights_only leaves out what only a resume needs.
  const bool full = contents == CheckpointContents::kFull;
  if (full) {
    c10::impl::GenericList optimizers(c10::AnyType::get());
    if (parts.optimizer_states != nullptr) {
      VOLT_INTERNAL_ASSERT(parts.optimizer_states->size() == parts.optimization->optimizers.size(),
                           "{} gathered optimizer states for {} optimizers", parts.optimizer_states->size(),
                           parts.optimization->optimizers.size());
      for (const c10::IValue& state : *parts.optimizer_states) optimizers.push_back(state);
    } else {
      for (const auto& optimizer : parts.optimization->optimizers)
        optimizers.push_back(optimizer_state_dict(*optimizer));
    }
    checkpoint.insert("optimizer_states", optimizers);
    // What keys the optimizers' states by parameter name in a distributed checkpoint (to-dcp).
    if (auto names = optimizer_parameter_names(parts))
      checkpoint.insert(kOptimizerParameterNamesKey, std::move(*names));
    c10::impl::GenericList schedulers(c10::AnyType::get());
    for (const auto& config : parts.optimization->schedulers) {
      StateDict state = c10::impl::toGenericDict(config.scheduler->state_dict());
      state.insert("volt_interval", std::string(to_string(config.interval)));
      state.insert("volt_frequency", config.frequency);
      schedulers.push_back(state);
    }
    checkpoint.insert("lr_schedulers", schedulers);
  }

  StateDict fit_loop = make_state_dict();
  fit_loop.insert("epoch", progress.epoch);
  fit_loop.insert("batches_done", progress.batches_done);
  fit_loop.insert("epoch_done", progress.epoch_done);
  fit_loop.insert("global_step", progress.global_step);
  fit_loop.insert("total_batches", progress.total_batches);
  fit_loop.insert("validation_pending", progress.validation_pending);
  if (!progress.train_stream_layout.empty()) fit_loop.insert("train_stream_layout", progress.train_stream_layout);
  add_lightning_fit_progress(fit_loop, progress);
  StateDict loops = make_state_dict();
  loops.insert("fit_loop", fit_loop);
  // Lightning's validate/test/predict(ckpt_path=...) read their loop's entry; theirs start fresh.
  for (const char* loop : {"validate_loop", "test_loop", "predict_loop"}) loops.insert(loop, make_state_dict());
  checkpoint.insert("loops", loops);
  if (full) insert_resume_state(checkpoint, parts);
  checkpoint.insert("hyper_parameters", json_to_ivalue(hyper_parameters(parts)));
  // Lightning's load_from_checkpoint passes the hyperparameters as keyword arguments.
  checkpoint.insert("hparams_name", std::string("kwargs"));
  const CallbackContext context = hook_context(parts, progress);
  for (const auto& callback : *parts.callbacks) callback->on_save_checkpoint(context, checkpoint);
  parts.module->on_save_checkpoint(checkpoint);
  return checkpoint;
}

void load_module_weights(const c10::IValue& checkpoint, LightningModule& module, const std::string& path,
                         bool skip_sharded) {
  const StateDict top = as_dict(checkpoint, "", path);
  std::set<std::string> sharded;
  if (top.contains(kShardedParametersKey) && top.at(kShardedParametersKey).isList()) {
    for (const c10::IValue& name : top.at(kShardedParametersKey).toListRef())
      if (name.isString()) sharded.insert(name.toStringRef());
  }
  if (!sharded.empty() && !skip_sharded) {
    throw CheckpointError(fmt::format(
        "checkpoint '{}' holds {} of its parameters ('{}', ...) in its shard files, a piece per process "
        "(strategy='fsdp' with sharding_strategy='full_shard' and state_dict_type='sharded'), not in the file "
        "itself. HINT: resume it with Trainer::fit under that strategy on as many processes, or write it in one "
        "file first (volt::consolidate_sharded_checkpoint) to load it anywhere.",
        path, sharded.size(), *sharded.begin()));
  }
  // A plain state dict (torch.save(model.state_dict())) holds the tensors at its top level.
  const bool plain = !top.contains("state_dict") && !top.empty() &&
                     std::all_of(top.begin(), top.end(), [](const auto& e) { return e.value().isTensor(); });
  const StateDict weights = plain ? top : as_dict(entry(top, "state_dict", path), key_path("", "state_dict"), path);
  std::vector<std::string> problems;
  std::vector<std::pair<torch::Tensor, torch::Tensor>> copies;
  const auto expect = [&](const std::string& name, const torch::Tensor& target) {
    if (sharded.count(name)) return;  // the caller loads it from the shards
    if (!weights.contains(name)) {
      problems.push_back(fmt::format("missing: '{}' (shape {})", name, c10::str(target.sizes())));
      return;
    }
    const c10::IValue value = weights.at(name);
    if (!value.isTensor()) {
      problems.push_back(fmt::format("'{}' is a {}, not a tensor", name, value.tagKind()));
      return;
    }
    const torch::Tensor source = value.toTensor();
    if (source.sizes() != target.sizes()) {
      problems.push_back(fmt::format("shape mismatch: '{}' is {} in the checkpoint but {} in the module", name,
                                     c10::str(source.sizes()), c10::str(target.sizes())));
      return;
    }
    copies.emplace_back(target, source);
  };
  std::set<std::string> known;
  for (const auto& item : module.named_parameters(true)) {
    expect(item.key(), item.value());
    known.insert(item.key());
  }
  for (const auto& item : module.named_buffers(true)) {
    expect(item.key(), item.value());
    known.insert(item.key());
  }
  for (const auto& e : weights) {
    const std::string name = e.key().toStringRef();
    if (!known.count(name)) problems.push_back(fmt::format("unexpected: '{}'", name));
  }
  if (!problems.empty()) {
    // A snapshot or HPC checkpoint was found, not asked for: the folder holds another model's run.
    const bool found = resume_checkpoint_number(path).has_value();
    throw CheckpointError(fmt::format(
        "checkpoint '{}' does not fit module {}:\n  {}\nHINT: {}", path, module.name(), join(problems, "\n  "),
        found ? fmt::format("a run of another model left it in {} without finishing, and a fit there resumes from "
                            "its newest snapshot or HPC checkpoint by itself: give this run a folder of its own "
                            "(default_root_dir, or hpc_checkpoint_dir), or remove that run's snapshot_*.ckpt, "
                            "hpc_ckpt_*.ckpt and volt-progress.",
                            std::filesystem::path(path).parent_path().string())
              : std::string("load it into the module it was saved from (same layers and sizes), or start without "
                            "ckpt_path.")));
  }
  torch::NoGradGuard no_grad;
  for (auto& [target, source] : copies) target.copy_(source);
}

void load_weights(LightningModule& module, const std::string& path) {
  load_module_weights(load_checkpoint_file(path), module, path);
}

namespace {
/// Runs `restore`; a volt::Error it throws (a part refusing its state) becomes a CheckpointError
/// that names the file, as every other restore error does.
template <typename Restore>
void naming_checkpoint(const std::string& path, Restore&& restore) {
  try {
    restore();
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(fmt::format("checkpoint '{}': {}", path, e.what()));
  }
}
}  // namespace

FitProgress restore_checkpoint(const c10::IValue& checkpoint, const TrainingParts& parts, const std::string& path) {
  const StateDict top = as_dict(checkpoint, "", path);
  // Lightning's own checkpoints carry no Volt version: their loop progress says where to go on.
  const bool lightning = !top.contains("volt_checkpoint_version") && top.contains("pytorch-lightning_version");
  // Another framework's checkpoint converted on reading (PyTorch's distributed checkpoints,
  // dcp_checkpoint.h) holds weights and optimizer states only: callbacks, schedulers and the RNG
  // start as they are, and the fit starts at epoch 0 with the optimizer's step count.
  const bool converted = top.contains(kConvertedFromKey);
  if (converted && !top.contains("optimizer_states")) {
    throw CheckpointError(
        fmt::format("checkpoint '{}' ({}) holds the model's weights but no optimizer state to resume from. HINT: "
                    "save it with dcp.save({{\"model\": ..., \"optim\": get_optimizer_state_dict(model, optimizer)}}), "
                    "or fine-tune from its weights: return volt::DcpWeights from initial_weights() and leave ckpt_path "
                    "empty; validate/test accept it as ckpt_path.",
                    path, top.at(kConvertedFromKey).toStringRef()));
  }
  if (!lightning && !converted) {
    const c10::IValue version = entry(top, "volt_checkpoint_version", path);
    if (!version.isInt() || version.toInt() > kCheckpointVersion) {
      throw CheckpointError(
          fmt::format("checkpoint '{}' has format version {}; this Volt reads versions up to {}. "
                      "HINT: resume with the Volt that wrote it, or upgrade Volt.",
                      path, version.isInt() ? std::to_string(version.toInt()) : "?", kCheckpointVersion));
    }
  }
  if (top.contains(kShardIndexKey) && !top.contains("optimizer_states")) {
    throw CheckpointError(
        fmt::format("checkpoint '{}' is sharded: its optimizer states lie in a shard file per process beside it, "
                    "which only a fit under strategy='fsdp' with as many processes reads. HINT: resume it with "
                    "Trainer::fit, or write it in one file first (volt::consolidate_sharded_checkpoint).",
                    path));
  }
  // Lightning's save_weights_only layout: weights and loop progress, nothing a resume needs.
  if (top.contains("state_dict") && !top.contains("optimizer_states")) {
    throw CheckpointError(
        fmt::format("checkpoint '{}' holds only the module's weights (ModelCheckpoint(save_weights_only=true) "
                    "writes such files): no optimizer states, learning-rate schedulers, callbacks or RNG state "
                    "to resume training from. HINT: to train on from these weights, call "
                    "volt::load_weights(module, \"{}\") before fit() and leave ckpt_path empty (a new run from "
                    "epoch 0); validate/test/predict accept it as ckpt_path; to resume exactly, use a checkpoint "
                    "written with save_weights_only=false.",
                    path, path));
  }
  load_module_weights(checkpoint, *parts.module, path, parts.loads_sharded_parameters);

  const std::string callbacks_at = key_path("", "callbacks");
  const StateDict callbacks =
      converted ? make_state_dict() : as_dict(entry(top, "callbacks", path), callbacks_at, path);
  for (const auto& callback : *parts.callbacks) {
    // Older Volt checkpoints name some callbacks' state by an older key.
    for (const std::string& key : {callback->state_key(), callback->legacy_state_key()}) {
      if (key.empty() || !callbacks.contains(key)) continue;
      callback->load_state_dict(as_dict(callbacks.at(key), key_path(callbacks_at, key), path));
      break;
    }
  }
  // A callback that added param groups (BaseFinetuning) adds them again before the optimizers'
  // states load: those hold the groups the run had when it was saved.
  for (const auto& callback : *parts.callbacks) {
    naming_checkpoint(path, [&] { callback->restore_optimizer_layout(*parts.module, parts.optimization->optimizers); });
  }

  const auto& optimizers = parts.optimization->optimizers;
  const c10::IValue optimizer_states = entry(top, "optimizer_states", path);
  if (!optimizer_states.isList() || optimizer_states.toListRef().size() != optimizers.size()) {
    throw CheckpointError(
        fmt::format("checkpoint '{}' holds {} optimizer states but configure_optimizers returned {}. "
                    "HINT: resume with the same optimizer setup.",
                    path, optimizer_states.isList() ? optimizer_states.toListRef().size() : 0, optimizers.size()));
  }
  for (size_t i = 0; i < optimizers.size(); ++i) {
    if (parts.load_optimizer_state) {
      parts.load_optimizer_state(*optimizers[i], optimizer_states.toListRef()[i]);
    } else {
      load_optimizer_state_dict(*optimizers[i], optimizer_states.toListRef()[i]);
    }
  }

  const auto& schedulers = parts.optimization->schedulers;
  const c10::IValue scheduler_states =
      converted ? c10::IValue(c10::impl::GenericList(c10::AnyType::get())) : entry(top, "lr_schedulers", path);
  if (!converted && (!scheduler_states.isList() || scheduler_states.toListRef().size() != schedulers.size())) {
    throw CheckpointError(
        fmt::format("checkpoint '{}' holds {} scheduler states but configure_optimizers returned {}. "
                    "HINT: resume with the same scheduler setup.",
                    path, scheduler_states.isList() ? scheduler_states.toListRef().size() : 0, schedulers.size()));
  }
  for (size_t i = 0; i < scheduler_states.toListRef().size(); ++i) {
    const StateDict state =
        as_dict(scheduler_states.toListRef()[i], fmt::format("{}[{}]", key_path("", "lr_schedulers"), i), path);
    // A checkpoint read back from bytes holds Any-keyed dicts, which toTypedDict refuses:
    // copy the entries into the string-keyed dict the scheduler takes.
    c10::impl::GenericDict typed = make_state_dict();
    for (const auto& e : state) {
      if (!e.key().isString()) {
        throw CheckpointError(
            fmt::format("checkpoint '{}' has a scheduler state with a non-string key ({}). HINT: "
                        "the file was not written by Volt or Lightning; pass another ckpt_path.",
                        path, e.key().tagKind()));
      }
      const std::string& key = e.key().toStringRef();
      if (key != "volt_interval" && key != "volt_frequency") typed.insert(key, e.value());
    }
    schedulers[i].scheduler->load_state_dict(c10::impl::toTypedDict<std::string, c10::IValue>(typed));
  }

  // A checkpoint without scaler state (another precision, or older) leaves the fresh scaler.
  if (parts.precision != nullptr && top.contains(kScalerCheckpointKey)) {
    naming_checkpoint(path, [&] {
      parts.precision->load_state_dict(as_dict(top.at(kScalerCheckpointKey), key_path("", kScalerCheckpointKey), path));
    });
  }

  // Lightning saves no generator state (outside its fault-tolerant mode): the generator goes on
  // from where this process's seeding left it.
  const StateDict rng = (lightning || converted) && !top.contains("rng_states")
                            ? make_state_dict()
                            : as_dict(entry(top, "rng_states", path), key_path("", "rng_states"), path);
  if ((!lightning && !converted) || rng.contains("torch")) {
    auto generator = at::detail::getDefaultCPUGenerator();
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(entry(rng, "torch", path, key_path("", "rng_states")).toTensor());
  }
  if (rng.contains("torch.cuda") && rng.at("torch.cuda").isList()) {
    // A resume on fewer GPUs restores the ones it has, as Lightning does.
    const auto states = rng.at("torch.cuda").toListRef();
    const auto gpus = std::min<size_t>(states.size(), torch::cuda::device_count());
    for (size_t i = 0; i < gpus; ++i) {
      auto generator = cuda_generator(static_cast<int64_t>(i));
      std::lock_guard<std::mutex> lock(generator.mutex());
      generator.set_state(states[i].toTensor());
    }
  }

  FitProgress progress;
  if (converted) {
    progress.global_step = int_entry(top, "global_step", path, "");
  } else if (lightning) {
    progress = lightning_fit_progress(top, path);
  } else {
    const std::string loops_at = key_path("", "loops");
    const std::string fit_at = key_path(loops_at, "fit_loop");
    const StateDict loops = as_dict(entry(top, "loops", path), loops_at, path);
    const StateDict fit_loop = as_dict(entry(loops, "fit_loop", path, loops_at), fit_at, path);
    progress.epoch = int_entry(fit_loop, "epoch", path, fit_at);
    progress.batches_done = int_entry(fit_loop, "batches_done", path, fit_at);
    progress.epoch_done = entry(fit_loop, "epoch_done", path, fit_at).toBool();
    progress.global_step = int_entry(fit_loop, "global_step", path, fit_at);
    progress.total_batches = int_entry(fit_loop, "total_batches", path, fit_at);
    // Optional: checkpoints written before this key existed resume as if nothing were pending.
    progress.validation_pending = fit_loop.contains("validation_pending") && fit_loop.at("validation_pending").toBool();
    if (fit_loop.contains("train_stream_layout")) {
      progress.train_stream_layout = fit_loop.at("train_stream_layout").toStringRef();
    }
  }
  parts.module->on_load_checkpoint(top);
  const CallbackContext context = hook_context(parts, progress);
  for (const auto& callback : *parts.callbacks) callback->on_load_checkpoint(context, top);
  return progress;
}

c10::IValue json_to_ivalue(const nlohmann::json& value) {
  switch (value.type()) {
    case nlohmann::json::value_t::null:
      return c10::IValue();
    case nlohmann::json::value_t::boolean:
      return value.get<bool>();
    case nlohmann::json::value_t::number_integer:
      return value.get<int64_t>();
    case nlohmann::json::value_t::number_unsigned:
      return static_cast<int64_t>(value.get<uint64_t>());
    case nlohmann::json::value_t::number_float:
      return value.get<double>();
    case nlohmann::json::value_t::string:
      return value.get<std::string>();
    case nlohmann::json::value_t::array: {
      c10::impl::GenericList list(c10::AnyType::get());
      for (const auto& item : value) list.push_back(json_to_ivalue(item));
      return list;
    }
    case nlohmann::json::value_t::object: {
      StateDict dict = make_state_dict();
      for (const auto& [key, item] : value.items()) dict.insert(key, json_to_ivalue(item));
      return dict;
    }
    case nlohmann::json::value_t::binary:
    case nlohmann::json::value_t::discarded:
      break;
  }
  throw Error(
      "hyperparameters hold a binary or discarded JSON value; expected plain values. HINT: store numbers, "
      "strings, booleans, lists and objects only.");
}

nlohmann::json ivalue_to_json(const c10::IValue& value) {
  if (value.isNone()) return nullptr;
  if (value.isBool()) return value.toBool();
  if (value.isInt()) return value.toInt();
  if (value.isDouble()) return value.toDouble();
  if (value.isString()) return value.toStringRef();
  if (value.isList()) {
    nlohmann::json out = nlohmann::json::array();
    for (const auto& item : value.toListRef()) out.push_back(ivalue_to_json(item));
    return out;
  }
  if (value.isGenericDict()) {
    nlohmann::json out = nlohmann::json::object();
    for (const auto& e : value.toGenericDict()) {
      const std::string key = e.key().isString() ? e.key().toStringRef() : c10::str(e.key());
      out[key] = ivalue_to_json(e.value());
    }
    return out;
  }
  if (value.isTensor()) {
    const torch::Tensor t = value.toTensor().to(torch::kDouble).contiguous();
    return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
  }
  return c10::str(value);
}

}  // namespace volt
