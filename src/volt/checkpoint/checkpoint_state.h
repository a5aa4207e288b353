// What a checkpoint holds and how it is built from, and restored into, a training run.
//
// Layout (Lightning 1.9's keys, plain values and tensors only, so Python's torch.load reads it and
// PyTorch Lightning loads and resumes it):
//   epoch, global_step, volt_version, volt_checkpoint_version,
//   pytorch-lightning_version ("1.9.5": the layout written, so Lightning 2.x migrates it), hparams_name
//   state_dict          {parameter or buffer name: tensor}
//   optimizer_states    [PyTorch optimizer.state_dict() per optimizer]
//   lr_schedulers       [PyTorch scheduler.state_dict() per scheduler]
//   loops               {"fit_loop": Volt's {epoch, batches_done, epoch_done, global_step,
//                                    total_batches, validation_pending} and Lightning's progress
//                                    (epoch_progress, epoch_loop.batch_progress, ...),
//                        "validate_loop", "test_loop", "predict_loop": {}}
//   callbacks           {callback.state_key(): callback.state_dict()}
//   rng_states          {"torch": the CPU generator's state}
//   hyper_parameters    the module's save_hyperparameters() value, plus "config": the
//                       program's resolved configuration when TrainerOptions::config is set
//   native_amp_scaling_state  the loss scaler's state (16-mixed only; optional on restore)
//   volt_metrics        {registered name: Metric::gathered_state_dict()} for the module's
//                       register_metric()s (only when it has some; optional on restore)
//
// restore_checkpoint also resumes a checkpoint PyTorch Lightning wrote (no volt_checkpoint_version):
// its loop progress gives the epoch and batch, and a missing rng_states leaves the generator alone.
// And one converted from PyTorch's distributed checkpoints (kConvertedFromKey, dcp_checkpoint.h):
// state_dict and optimizer_states only; it resumes at epoch 0 with its global_step, and the
// callbacks, schedulers and generator are left as they are.
#pragma once

#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "volt/base/state_dict.h"
#include "volt/module/lightning_module.h"

namespace volt {

class Callback;
class PrecisionPlugin;

/// The version of the layout above; a reader refuses newer files.
inline constexpr int64_t kCheckpointVersion = 1;
/// The checkpoint key of the module's registered metrics' states.
inline constexpr const char* kMetricsCheckpointKey = "volt_metrics";
/// Volt's version, written into checkpoints.
inline constexpr const char* kVoltVersion = "0.1.0";
/// The PyTorch Lightning version whose layout Volt writes (its `pytorch-lightning_version`).
inline constexpr const char* kLightningLayoutVersion = "1.9.5";

/// Where the fit loop stands; saved so that resume continues at the same batch.
struct FitProgress {
  /// The current epoch (0-based).
  int64_t epoch = 0;
  /// Batches of `epoch` already trained.
  int64_t batches_done = 0;
  /// True when `epoch`'s end-of-epoch work (validation, schedulers, callbacks) is done.
  bool epoch_done = false;
  /// Optimizer steps so far.
  int64_t global_step = 0;
  /// Batches trained over all epochs.
  int64_t total_batches = 0;
  /// True when the validation due after batch `batches_done` has not run yet (a checkpoint taken
  /// at the end of that batch), so a resume runs it before training on.
  bool validation_pending = false;
  /// How a streaming training loader dealt its shards (DataLoader::stream_layout); empty for
  /// map-style data. A resume inside an epoch needs the same, or it would reach another position.
  std::string train_stream_layout;
};

/// The parts of a run that a checkpoint saves and restores (borrowed, not owned).
struct TrainingParts {
  /// The module.
  LightningModule* module = nullptr;
  /// Its optimizers and schedulers.
  const OptimizerConfig* optimization = nullptr;
  /// The callbacks with state.
  const std::vector<std::shared_ptr<Callback>>* callbacks = nullptr;
  /// The precision plugin, whose state (16-mixed's loss scaler) is saved; nullptr: none.
  PrecisionPlugin* precision = nullptr;
  /// The program's resolved configuration, saved in hyper_parameters["config"]; null or nullptr: none.
  const nlohmann::json* config = nullptr;
  /// The registered metrics' gathered states, saved under kMetricsCheckpointKey; nullptr: none.
  /// Gathering them is a collective, so the fit loop does it where every process is, not here.
  const StateDict* metric_states = nullptr;
  /// The optimizers' states as one process holds them, one per optimizer, when the strategy shards
  /// them (fsdp gathers them where every process is, like metric_states); nullptr: each
  /// optimizer's own optimizer_state_dict.
  const std::vector<c10::IValue>* optimizer_states = nullptr;
  /// Names a tensor an optimizer holds that is not one of the module's parameters (fsdp's pieces:
  /// StateSharding::parameter_name); unset: only the module's own tensors have names.
  std::function<std::optional<std::string>(const torch::Tensor&)> parameter_name;
  /// Loads a checkpoint's optimizer state into an optimizer when the strategy shards them (fsdp
  /// cuts it to this process's pieces); unset: load_optimizer_state_dict.
  std::function<void(torch::optim::Optimizer&, const c10::IValue&)> load_optimizer_state;
  /// Saving a sharded checkpoint: the parameters each process writes its piece of into its shard
  /// (fsdp full_shard's units), left out of "state_dict" and listed under kShardedParametersKey;
  /// nullptr: none.
  const std::vector<std::string>* sharded_parameters = nullptr;
  /// Restoring: the caller loads the parameters a checkpoint lists under kShardedParametersKey
  /// from its shards (fsdp), so they are not expected in "state_dict"; false: such a checkpoint is
  /// refused with a HINT.
  bool loads_sharded_parameters = false;
};

/// What a checkpoint holds.
enum class CheckpointContents {
  /// Everything above: a fit resumes from it exactly.
  kFull,
  /// Lightning's save_weights_only layout: epoch, global_step, the versions, state_dict, loops
  /// and hyper_parameters, and what the module's on_save_checkpoint adds; no optimizer_states,
  /// lr_schedulers, callbacks, rng_states or loss scaler. It loads weights (load_weights,
  /// validate/test/predict with ckpt_path) but cannot resume a fit.
  kWeightsOnly,
};

/// Builds the checkpoint dictionary of a run at `progress` (the full one includes the RNG state).
StateDict make_checkpoint(const TrainingParts& parts, const FitProgress& progress,
                          CheckpointContents contents = CheckpointContents::kFull);

/// Restores the module, the callbacks (whose restore_optimizer_layout then re-adds the param groups
/// they had added), the optimizers, schedulers and the RNG from `checkpoint` (Volt's, PyTorch
/// Lightning's, or a converted one: see the layout above) and returns where to continue. Throws volt::CheckpointError
/// naming `path` and the missing or mismatched entry when anything does not fit, and before touching the module when
/// the checkpoint holds only weights (CheckpointContents::kWeightsOnly).
FitProgress restore_checkpoint(const c10::IValue& checkpoint, const TrainingParts& parts, const std::string& path);

/// Loads only the module's weights (validate/test/predict from a checkpoint, fine-tuning) from a
/// Volt or Lightning checkpoint (its "state_dict") or a plain state dict (Python's
/// `torch.save(model.state_dict())`: names to tensors). Throws volt::CheckpointError listing
/// missing, unexpected and mis-shaped entries, and for a sharded checkpoint whose parameters lie
/// partly in its shard files (kShardedParametersKey) unless `skip_sharded` (the caller loads those).
void load_module_weights(const c10::IValue& checkpoint, LightningModule& module, const std::string& path,
                         bool skip_sharded = false);

/// Reads the file `path` and loads its weights into `module` (see load_module_weights): Lightning's
/// `load_from_checkpoint` for a module the program already built.
void load_weights(LightningModule& module, const std::string& path);

/// The module's parameters and buffers by name (its `state_dict`).
StateDict module_state_dict(const torch::nn::Module& module);

/// A JSON value as plain checkpoint values (objects become string-keyed dicts).
c10::IValue json_to_ivalue(const nlohmann::json& value);
/// Plain checkpoint values as JSON (tensors become nested lists).
nlohmann::json ivalue_to_json(const c10::IValue& value);

}  // namespace volt
