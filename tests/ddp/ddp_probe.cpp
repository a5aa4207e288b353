// A small Volt program for the multi-process tests (tests/ddp/test_ddp.py): trains a linear
// model on synthetic data and writes, per rank, the final parameters and the example indices it
// saw. Flags inject failures (throw, SIGKILL, never joining) at a given rank and step.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "volt/cli/trainer_flags.h"
#include "volt/core/error.h"
#include "volt/distributed/gradient_synchronizer.h"
#include "volt/distributed/process_group.h"
#include "volt/optim/optimizer_state.h"
#include "volt/strategies/fsdp_strategy.h"  // training_memory
#include "volt/strategies/shard_layout.h"
#include "volt/volt.h"

namespace {

int64_t rank_from_env() {
  for (const char* name : {"GLOBAL_RANK", "RANK", "SLURM_PROCID"}) {
    if (const char* v = std::getenv(name)) return std::stoll(v);
  }
  // One process per node (ddp2, pipeline x ddp) started by hand: the node is the rank.
  if (const char* v = std::getenv("NODE_RANK")) return std::stoll(v);
  return 0;
}

struct ProbeOptions {
  std::string out;
  bool pipe = false;               // the layers as a volt::Pipe (strategy='pipeline' splits them)
  bool micro_batch_loss = false;   // with --pipe: the loss per micro-batch through Pipe::train_step
  bool skip_params = false;        // large models: no parameter values in rank<N>.json
  std::string consolidate;         // a sharded checkpoint to write in one file (<path>.whole.ckpt), then exit
  std::string inspect;             // a checkpoint whose contents to describe in <path>.json, then exit
  bool save_weights_only = false;  // also a weights-only ModelCheckpoint saving every epoch to weights_ckpt
  bool save_last = false;          // a ModelCheckpoint(save_last) keeping <root>/checkpoints/last.ckpt
  std::string fail_mode = "none";  // none | throw | internal | kill | nojoin | hang | data
  int64_t fail_rank = -1;
  int64_t fail_step = 0;
  int64_t batch_size = 8;
  int64_t examples = 64;
  double lr = 0.1;
  bool with_unused = false;
  bool custom_hooks = false;
  int64_t stop_rank = -1;           // a callback on this rank alone asks to stop ...
  int64_t stop_step = 0;            // ... after this many optimizer steps
  int64_t step_sleep_ms = 0;        // sleep in every training step (a long job that costs no CPU)
  int64_t sleep_rank = -1;          // only this rank sleeps (a straggler); -1: every rank
  bool predict_only = false;        // no fit: predict() over the data, rank <N>'s outputs to predict<N>.json
  bool named = false;               // examples one at a time with named tensors and a list (Dataset::get)
  int64_t num_workers = 0;          // the loaders' worker threads
  bool streaming = false;           // the data as a stream of uneven shards (IterableDataset)
  int64_t shards = 5;               // ... this many, shard k holding about k + 1 parts of the data
  bool datamodule = false;          // fit through a DataModule whose prepare_data writes a marker file
  bool collectives = false;         // the module's all_gather/all_reduce and view of the run, to "view"
  bool batchnorm = false;           // a volt::SyncBatchNorm after the hidden layer (--sync-batchnorm syncs it)
  bool metric = false;              // log MeanSquaredError metrics (train/mse, val/mse) and hand-made sums
  int64_t checkpoint_every_ms = 0;  // a ModelCheckpoint(train_time_interval) whose clock runs 1 + rank times as fast
  int64_t unfreeze_hidden_at = -1;  // BackboneFinetuning of the hidden layer, unfrozen at this epoch
  int64_t unfreeze_rank = -1;       // ... on this rank alone (the others train it throughout)
  std::string optimizer = "sgd";    // sgd | adam (lr / 10, so both move the model about as far)
  double step_lr_gamma = 0;         // > 0: a StepLR stepping every optimizer step with this gamma
  int64_t width = 4;                // the hidden layer's width (wider: more state to shard)
  int64_t depth = 1;                // hidden layers: 1 + (depth - 1) of width x width, after the first
  std::string fsdp_units;           // "" | hidden | all | nested: the layers in volt::FsdpUnit (all:
                                    // --with-unused-parameter's layer too)
};

/// The probe's examples as a stream: `shards` consecutive shards of uneven sizes (shard k holds
/// about k + 1 parts), so processes' shares differ and their streams run dry at different steps.
/// fail_mode "data" makes the failing rank's reader throw once it has trained fail_step steps.
class ProbeStream : public volt::IterableDataset {
 public:
  ProbeStream(torch::Tensor x, torch::Tensor target, const ProbeOptions& options, const std::atomic<int64_t>* steps)
      : x_(std::move(x)), target_(std::move(target)), options_(options), steps_(steps) {
    const int64_t n = x_.size(0);
    const int64_t parts = options.shards * (options.shards + 1) / 2;
    for (int64_t k = 0, start = 0; k < options.shards; ++k) {
      const int64_t end = n * (k + 1) * (k + 2) / 2 / parts;
      bounds_.emplace_back(start, end);
      start = end;
    }
  }
  int64_t num_shards() const override { return options_.shards; }
  std::unique_ptr<volt::ExampleReader> open(int64_t shard) const override {
    return std::make_unique<Reader>(*this, bounds_[shard].first, bounds_[shard].second);
  }
  std::string describe(int64_t shard) const override { return fmt::format("probe shard {}", shard); }

 private:
  class Reader : public volt::ExampleReader {
   public:
    Reader(const ProbeStream& stream, int64_t next, int64_t end) : stream_(stream), next_(next), end_(end) {}
    std::optional<volt::Example> next() override {
      if (next_ >= end_) return std::nullopt;
      const ProbeOptions& o = stream_.options_;
      if (o.fail_mode == "data" && rank_from_env() == o.fail_rank && *stream_.steps_ >= o.fail_step)
        throw std::runtime_error("injected data failure at example " + std::to_string(next_));
      volt::Example e;
      e.data = stream_.x_[next_];
      e.target = stream_.target_[next_];
      ++next_;
      return e;
    }

   private:
    const ProbeStream& stream_;
    int64_t next_;
    int64_t end_;
  };
  torch::Tensor x_;
  torch::Tensor target_;
  const ProbeOptions& options_;
  const std::atomic<int64_t>* steps_;
  std::vector<std::pair<int64_t, int64_t>> bounds_;
};

/// The same examples as the probe's TensorDataset, one at a time and by name: "x", "y" and
/// "index" tensors and a "tokens" list whose length varies. fail_mode "data" makes get() throw
/// on the failing rank once that rank has trained fail_step steps.
class NamedDataset : public volt::Dataset {
 public:
  NamedDataset(torch::Tensor x, torch::Tensor target, const ProbeOptions& options, const std::atomic<int64_t>* steps)
      : x_(std::move(x)), target_(std::move(target)), options_(options), steps_(steps) {}
  int64_t size() const override { return x_.size(0); }
  volt::Example get(int64_t index) const override {
    if (options_.fail_mode == "data" && rank_from_env() == options_.fail_rank && *steps_ >= options_.fail_step)
      throw std::runtime_error("injected data failure at example " + std::to_string(index));
    volt::Example e;
    e.tensors["x"] = x_[index];
    e.tensors["y"] = target_[index].narrow(0, 0, 1);
    e.tensors["index"] = target_[index][1];
    e.lists["tokens"] = torch::arange(index % 3 + 1);
    return e;
  }

 private:
  torch::Tensor x_;
  torch::Tensor target_;
  const ProbeOptions& options_;
  const std::atomic<int64_t>* steps_;  // the module's step count (worker threads read it)
};

/// A callback that stops training on one rank only, as one deciding on unsynchronized metrics would.
class StopOnOneRank : public volt::Callback {
 public:
  StopOnOneRank(int64_t rank, int64_t step) : rank_(rank), step_(step) {}
  std::string state_key() const override { return "StopOnOneRank"; }
  volt::Decision on_train_batch_end(const volt::CallbackContext& context, volt::CallbackServices&) override {
    if (rank_from_env() == rank_ && context.global_step >= step_) return volt::Decision::stop_training("probe");
    return {};
  }

 private:
  int64_t rank_;
  int64_t step_;
};

/// Records at which steps the ModelCheckpoint before it in the run saved (its last_model_path
/// changes; checkpoint callbacks run last, so a save shows at the next hook), and writes them to
/// time_ckpt<rank>.json when fit ends.
class SaveRecorder : public volt::Callback {
 public:
  SaveRecorder(std::shared_ptr<const volt::ModelCheckpoint> checkpoint, std::string path)
      : checkpoint_(std::move(checkpoint)), path_(std::move(path)) {}
  std::string state_key() const override { return "SaveRecorder"; }
  volt::Decision on_train_batch_end(const volt::CallbackContext&, volt::CallbackServices&) override {
    note();
    return {};
  }
  void on_fit_end(const volt::CallbackContext&, volt::CallbackServices&) override {
    note();
    std::ofstream(path_) << nlohmann::json(saves_).dump();
  }

 private:
  void note() {
    const std::string& last = checkpoint_->last_model_path();
    if (!last.empty() && (saves_.empty() || saves_.back() != last)) saves_.push_back(last);
  }
  std::shared_ptr<const volt::ModelCheckpoint> checkpoint_;
  std::string path_;
  std::vector<std::string> saves_;
};

/// A synchronizer that delegates to c10d's Reducer and counts the backward passes it armed.
class CountingSynchronizer : public volt::GradientSynchronizer {
 public:
  explicit CountingSynchronizer(std::shared_ptr<volt::GradientSynchronizer> inner) : inner_(std::move(inner)) {}
  void prepare_for_backward(const torch::Tensor& loss) override {
    ++armed;
    inner_->prepare_for_backward(loss);
  }
  int64_t armed = 0;

 private:
  std::shared_ptr<volt::GradientSynchronizer> inner_;
};

class Probe : public volt::LightningModule {
 public:
  explicit Probe(ProbeOptions options) : volt::LightningModule("Probe"), options_(std::move(options)) {
    torch::manual_seed(0);
    if (options_.pipe) {
      // The same layers, drawn in the same order, held by a Pipe: its parameters' names sort as
      // hidden's and out's do (pipe...0.bias, 0.weight, 2.bias, 2.weight).
      torch::nn::Linear hidden(8, options_.width);
      torch::nn::Linear out(options_.width, 1);
      pipe_ = register_module("pipe", volt::Pipe(torch::nn::Sequential(hidden, torch::nn::ReLU(), out)));
    } else if (options_.fsdp_units == "nested") {
      // A unit around a Sequential that holds another unit: full_shard makes two units.
      torch::nn::Linear hidden(8, options_.width);
      torch::nn::Linear out(options_.width, 1);
      body_ = register_module("body",
                              volt::FsdpUnit(torch::nn::Sequential(volt::FsdpUnit(hidden), torch::nn::ReLU(), out)));
    } else if (!options_.fsdp_units.empty()) {
      VOLT_CHECK(options_.fsdp_units == "hidden" || options_.fsdp_units == "all", "--fsdp-units {}",
                 options_.fsdp_units);
      // The same layers drawn in the same order, so the parameters equal the plain model's.
      torch::nn::Linear hidden(8, options_.width);
      torch::nn::Linear out(options_.width, 1);
      hidden_unit_ = register_module("hidden", volt::FsdpUnit(hidden));
      if (options_.fsdp_units == "all") {
        out_unit_ = register_module("out", volt::FsdpUnit(out));
      } else {
        out_ = register_module("out", out);
      }
    } else {
      hidden_ = register_module("hidden", torch::nn::Linear(8, options_.width));
      out_ = register_module("out", torch::nn::Linear(options_.width, 1));
    }
    // A layer that never takes part in the loss: ddp must be told (find_unused_parameters).
    // Deeper models (the memory tests): more width x width layers after the first, each a unit
    // under --fsdp-units all (drawn after out, so depth 1 draws what it always drew).
    for (int64_t i = 1; i < options_.depth; ++i) {
      torch::nn::Linear layer(options_.width, options_.width);
      const std::string name = "deep" + std::to_string(i);
      if (options_.fsdp_units == "all") {
        deep_units_.push_back(register_module(name, volt::FsdpUnit(layer)));
      } else {
        deep_.push_back(register_module(name, layer));
      }
    }
    if (options_.with_unused && options_.fsdp_units == "all") {
      unused_unit_ = register_module("unused", volt::FsdpUnit(torch::nn::Linear(options_.width, 1)));
    } else if (options_.with_unused) {
      unused_ = register_module("unused", torch::nn::Linear(options_.width, 1));
    }
    if (options_.batchnorm) {
      norm_ = register_module("norm", volt::SyncBatchNorm(torch::nn::BatchNormOptions(options_.width)));
    }
    const torch::Tensor x = torch::randn({options_.examples, 8});
    const torch::Tensor y = x.sum(1, true) * 0.5 + 0.1 * torch::randn({options_.examples, 1});
    // The second target column carries each example's index, so the test can check the shards.
    const torch::Tensor index = torch::arange(options_.examples, torch::kFloat).unsqueeze(1);
    if (options_.streaming) stream_ = std::make_shared<ProbeStream>(x, torch::cat({y, index}, 1), options_, &step_);
    if (options_.named) {
      data_ = std::make_shared<NamedDataset>(x, torch::cat({y, index}, 1), options_, &step_);
    } else {
      data_ = std::make_shared<volt::TensorDataset>(x, torch::cat({y, index}, 1));
    }
  }

  /// The model's output for inputs `x`.
  torch::Tensor forward(const torch::Tensor& x) {
    if (pipe_) return pipe_(x);
    if (body_) return body_(x);
    torch::Tensor h = hidden_unit_ ? hidden_unit_(x) : hidden_(x);
    if (options_.batchnorm) h = norm_(h);
    for (auto& layer : deep_) h = layer(torch::relu(h));
    for (auto& unit : deep_units_) h = unit(torch::relu(h));
    if (!out_unit_) return out_(torch::relu(h));
    // What full_shard leaves whole: hidden's parameters once its forward is done, and out's once
    // its backward is done (when the gradient reaches hidden's output).
    unit_numels_["hidden_after_its_forward"] = hidden_unit_->parameters()[0].numel();
    if (h.requires_grad()) {
      h.register_hook([this](const torch::Tensor&) {
        unit_numels_["out_after_its_backward"] = out_unit_->parameters()[0].numel();
      });
    }
    return out_unit_(torch::relu(h));
  }

  /// Inputs, targets and example indices, from the plain or the named layout.
  struct Parts {
    torch::Tensor x, y, index;
  };
  Parts parts(const volt::Batch& batch) const {
    if (!options_.named) return {batch.data, batch.target.narrow(1, 0, 1), batch.target.select(1, 1)};
    VOLT_CHECK(static_cast<int64_t>(batch.list("tokens").size()) == batch.size(),
               "the batch has {} token lists for {} examples", batch.list("tokens").size(), batch.size());
    return {batch.at("x"), batch.at("y"), batch.at("index")};
  }

  torch::Tensor training_step(const volt::Batch& batch, int64_t batch_idx) override {
    const int64_t rank = rank_from_env();
    if (rank == options_.fail_rank && step_ == options_.fail_step) {
      if (options_.fail_mode == "throw")
        throw std::runtime_error("injected failure at step " + std::to_string(step_.load()));
      if (options_.fail_mode == "internal") volt::internal::throw_internal(__FILE__, __LINE__, "injected", "failure");
      if (options_.fail_mode == "kill") raise(SIGKILL);
      if (options_.fail_mode == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
    }
    {
      // Under dp and ddp2 every device's replica runs this on its own thread.
      const std::lock_guard<std::mutex> lock(mutex_);
      ++step_;
      // A stream's dry process steps along on a replay batch; what it trained on shows in
      // on_train_batch_end, which replays skip.
      if (!options_.streaming) record(batch);
    }
    if (options_.step_sleep_ms > 0 && (options_.sleep_rank < 0 || options_.sleep_rank == global_rank())) {
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.step_sleep_ms));
    }
    const Parts p = parts(batch);
    if (pipe_ && options_.micro_batch_loss) {
      // The loss per micro-batch (1F1B can run it): each one's mean weighted by its share of rows.
      const auto rows = static_cast<double>(p.x.size(0));
      const torch::Tensor loss = pipe_->train_step(p.x, [&](const torch::Tensor& out, int64_t begin, int64_t end) {
        return torch::mse_loss(out, p.y.slice(0, begin, end)) * (static_cast<double>(end - begin) / rows);
      });
      log("train/loss", loss, {.prog_bar = true});
      return loss;
    }
    const torch::Tensor prediction = forward(p.x);
    const torch::Tensor loss = torch::mse_loss(prediction, p.y);
    log("train/loss", loss, {.prog_bar = true});
    if (options_.metric) log_mse("train", train_mse_, prediction, p.y);
    // A collective inside the step: a dry process must still take part in it.
    if (options_.streaming) log("train/loss_all", loss, {.on_step = true, .sync_dist = true});
    return loss;
  }

  void on_train_batch_end(const torch::Tensor&, const volt::Batch& batch, int64_t) override {
    if (options_.streaming) record(batch);
    // What the process holds between steps (after the step, before the next zero_grad).
    if (optimizer_) memory_ = volt::training_memory(*this, {optimizer_});
    // After the step's all-reduce: the others go on to the step's later collectives (a straggler
    // check) and wait there.
    if (options_.fail_mode == "hang-batch-end" && rank_from_env() == options_.fail_rank &&
        step_ == options_.fail_step) {
      std::this_thread::sleep_for(std::chrono::hours(1));
    }
  }

  // What the module sees of the run, and its collectives: rank r gathers r + 1 rows [r, 10r].
  void on_train_start() override {
    if (!options_.collectives) return;
    view_["world_size"] = world_size();
    view_["global_rank"] = global_rank();
    view_["local_rank"] = local_rank();
    view_["node_rank"] = node_rank();
    view_["is_global_zero"] = is_global_zero();
    view_["device"] = device().str();
    const auto r = static_cast<double>(global_rank());
    const torch::Tensor rows = torch::tensor({r, 10 * r}).repeat({global_rank() + 1, 1});
    std::vector<std::vector<std::vector<double>>> gathered;
    for (const torch::Tensor& each : all_gather(rows)) {
      std::vector<std::vector<double>> out;
      for (int64_t i = 0; i < each.size(0); ++i) out.push_back({each[i][0].item<double>(), each[i][1].item<double>()});
      gathered.push_back(out);
    }
    view_["gathered"] = gathered;
    view_["sum"] = all_reduce(torch::tensor({r + 1})).item<double>();
    view_["max"] = all_reduce(torch::tensor({r + 1}), volt::Reduce::kMax).item<double>();
  }
  void on_train_epoch_start() override {
    if (options_.collectives) view_["epochs_seen"].push_back({current_epoch(), global_step()});
  }

  void record(const volt::Batch& batch) {
    const auto seen = parts(batch).index.to(torch::kLong);
    for (int64_t i = 0; i < seen.size(0); ++i) seen_.push_back(seen[i].item<int64_t>());
  }

  void validation_step(const volt::Batch& batch, int64_t) override {
    const Parts p = parts(batch);
    const torch::Tensor prediction = forward(p.x);
    log("val/loss", torch::mse_loss(prediction, p.y), {.sync_dist = true});
    if (options_.metric) log_mse("val", val_mse_, prediction, p.y);
  }

  /// Logs `metric` as <stage>/mse, and beside it the squared errors and their count as synced
  /// sums, which the loops also keep free of replayed batches: mse must be sq_sum / count.
  void log_mse(const std::string& stage, volt::MeanSquaredError& metric, const torch::Tensor& prediction,
               const torch::Tensor& target) {
    metric.update(prediction, target);
    log(stage + "/mse", metric);
    const volt::LogOptions sum{.on_step = false, .on_epoch = true, .reduce_fx = volt::Reduce::kSum, .sync_dist = true};
    log(stage + "/sq_sum", (prediction.detach() - target).to(torch::kDouble).pow(2).sum(), sum);
    log(stage + "/count", static_cast<double>(target.numel()), sum);
  }

  // The seed documents' hooks: a process group made by the module, a synchronizer of its own.
  std::shared_ptr<volt::ProcessGroup> init_ddp_connection(const volt::Topology& topology,
                                                          const volt::ProcessGroupOptions& options) override {
    if (!options_.custom_hooks) return nullptr;
    init_called_ = true;
    return std::make_shared<volt::ProcessGroup>(topology, options);
  }
  std::shared_ptr<volt::GradientSynchronizer> configure_ddp(volt::ProcessGroup& group,
                                                            const volt::GradientSyncOptions& options) override {
    if (!options_.custom_hooks) return nullptr;
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;
    for (const auto& p : named_parameters()) {
      params.push_back(p.value());
      names.push_back(p.key());
    }
    counter_ = std::make_shared<CountingSynchronizer>(
        std::make_shared<volt::ReducerSynchronizer>(params, names, group.backend(), options));
    return counter_;
  }

  volt::OptimizerConfig configure_optimizers() override {
    // A fine-tune's optimizer starts with the trainable parameters only; BackboneFinetuning adds
    // the frozen ones as a group of their own at the unfreeze.
    std::vector<torch::Tensor> trainable;
    for (const auto& p : parameters()) {
      if (p.requires_grad()) trainable.push_back(p);
    }
    if (options_.optimizer == "adam") {
      optimizer_ = std::make_shared<torch::optim::Adam>(trainable, torch::optim::AdamOptions(options_.lr / 10));
    } else {
      optimizer_ = std::make_shared<torch::optim::SGD>(trainable, torch::optim::SGDOptions(options_.lr));
    }
    if (options_.step_lr_gamma <= 0) return optimizer_;
    return volt::OptimizerConfig(optimizer_,
                                 {.scheduler = std::make_shared<volt::StepLR>(*optimizer_, 1, options_.step_lr_gamma),
                                  .interval = volt::Interval::kStep});
  }
  volt::DataLoader train_dataloader() override { return loader(options_.batch_size); }
  volt::DataLoader val_dataloader() override { return loader(5); }
  volt::DataLoader predict_dataloader() override { return loader(7); }
  /// Each example's index (the second target column) beside the model's output.
  torch::Tensor predict_step(const volt::Batch& batch, int64_t) override {
    const Parts p = parts(batch);
    return torch::cat({p.index.to(torch::kFloat).unsqueeze(1), forward(p.x)}, 1);
  }

  volt::DataLoader loader(int64_t batch_size) const {
    if (options_.streaming) {
      return volt::DataLoader(
          std::static_pointer_cast<const volt::IterableDataset>(stream_),
          {.batch_size = batch_size, .shuffle = true, .shuffle_buffer = 8, .num_workers = options_.num_workers});
    }
    return volt::DataLoader(data_, {.batch_size = batch_size, .num_workers = options_.num_workers});
  }

  void write(const volt::FitResult& result, int64_t rank) const {
    nlohmann::json out;
    out["rank"] = rank;
    out["global_step"] = result.global_step;
    out["seen"] = seen_;
    for (const auto& p : named_parameters()) {
      if (options_.skip_params) break;
      const torch::Tensor flat = p.value().detach().to(torch::kDouble).contiguous().view({-1});
      out["params"][p.key()] = std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
    }
    // The process's peaks so far (kB): its address space (what `ulimit -v` limits) and resident set.
    std::ifstream status("/proc/self/status");
    for (std::string line; std::getline(status, line);) {
      for (const auto& [key, name] : {std::pair{"VmPeak:", "vm_peak_kb"}, std::pair{"VmHWM:", "vm_hwm_kb"}}) {
        if (line.rfind(key, 0) == 0) out[name] = std::stoll(line.substr(std::string(key).size()));
      }
    }
    out["metrics"] = result.metrics;
    out["init_ddp_connection_called"] = init_called_;
    out["configure_ddp_armed"] = counter_ ? counter_->armed : -1;
    out["view"] = view_;
    // What this process's optimizer holds: under fsdp, its shard of the state.
    int64_t state_numel = 0;
    if (optimizer_) {
      for (const auto& entry : volt::optimizer_state_dict(*optimizer_).toGenericDict().at("state").toGenericDict())
        for (const auto& field : entry.value().toGenericDict())
          if (field.value().isTensor() && volt::is_elementwise_state(field.key().toStringRef()))
            state_numel += field.value().toTensor().numel();
    }
    out["optimizer_state_numel"] = state_numel;
    out["unit_numels"] = unit_numels_;
    out["memory"] = {{"parameters", memory_.parameters},
                     {"gradients", memory_.gradients},
                     {"optimizer_state", memory_.optimizer_state}};
    std::ofstream(options_.out + "/rank" + std::to_string(rank) + ".json") << out.dump();
  }

 private:
  ProbeOptions options_;
  torch::nn::Linear hidden_{nullptr};
  torch::nn::Linear out_{nullptr};
  torch::nn::Linear unused_{nullptr};
  volt::Pipe pipe_{nullptr};
  volt::FsdpUnit hidden_unit_{nullptr};
  volt::FsdpUnit out_unit_{nullptr};
  volt::FsdpUnit body_{nullptr};
  volt::FsdpUnit unused_unit_{nullptr};
  std::vector<torch::nn::Linear> deep_;
  std::vector<volt::FsdpUnit> deep_units_;
  volt::TrainingMemory memory_;
  std::map<std::string, int64_t> unit_numels_;
  volt::SyncBatchNorm norm_{nullptr};
  volt::MeanSquaredError train_mse_;
  volt::MeanSquaredError val_mse_;
  std::shared_ptr<volt::Dataset> data_;
  std::shared_ptr<ProbeStream> stream_;
  std::shared_ptr<torch::optim::Optimizer> optimizer_;
  std::atomic<int64_t> step_{0};
  bool init_called_ = false;
  std::shared_ptr<CountingSynchronizer> counter_;
  std::vector<int64_t> seen_;
  std::mutex mutex_;
  nlohmann::json view_ = nlohmann::json::object();
};

/// A DataModule whose prepare_data (slow on purpose) leaves prepared-node<N>-rank<R> in the out
/// folder, and whose setup records whether its node's marker was there already.
class ProbeData : public volt::DataModule {
 public:
  ProbeData(Probe& probe, std::string out, const volt::Topology& topology)
      : probe_(probe), out_(std::move(out)), topology_(topology) {}
  void prepare_data() override {
    std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    std::ofstream(fmt::format("{}/prepared-node{}-rank{}", out_, topology_.node_rank, topology_.global_rank)) << "ok";
  }
  void setup(volt::Stage stage) override {
    bool found = false;
    for (int64_t r = 0; r < topology_.world_size; ++r) {
      found = found || std::ifstream(fmt::format("{}/prepared-node{}-rank{}", out_, topology_.node_rank, r)).good();
    }
    setup_saw_prepared = found;
    setups.push_back(volt::to_string(stage));
  }
  void teardown(volt::Stage stage) override { teardowns.push_back(volt::to_string(stage)); }
  volt::DataLoader train_dataloader() override { return probe_.train_dataloader(); }
  bool setup_saw_prepared = false;
  std::vector<std::string> setups;
  std::vector<std::string> teardowns;

 private:
  Probe& probe_;
  std::string out_;
  const volt::Topology& topology_;
};

}  // namespace

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Volt's multi-process test probe", "ddp_probe");
    volt::TrainerOptions options;
    options.enable_progress_bar = false;
    options.enable_model_summary = false;
    options.enable_checkpointing = false;
    options.logger = false;
    options.num_sanity_val_steps = 0;
    options.limit_val_batches = 0;
    options.num_threads = 1;
    volt::TrainerFlagText text;
    volt::add_trainer_flags(app, options, text);
    ProbeOptions probe;
    app.add_option("--out", probe.out, "directory for rank<N>.json (default: --default-root-dir)");
    app.add_option("--fail-mode", probe.fail_mode, "none, throw, internal, kill, hang, hang-batch-end, nojoin or data");
    app.add_option("--fail-rank", probe.fail_rank, "the rank that fails");
    app.add_option("--fail-step", probe.fail_step, "the step at which it fails");
    app.add_option("--batch-size", probe.batch_size, "per-process batch size");
    app.add_option("--examples", probe.examples, "dataset size");
    app.add_option("--lr", probe.lr, "SGD learning rate");
    app.add_flag("--with-unused-parameter", probe.with_unused, "add a layer the loss never uses");
    app.add_flag("--custom-ddp-hooks", probe.custom_hooks, "override init_ddp_connection and configure_ddp");
    app.add_option("--stop-rank", probe.stop_rank, "a callback on this rank alone stops training");
    app.add_option("--stop-step", probe.stop_step, "... after this many steps");
    app.add_option("--step-sleep-ms", probe.step_sleep_ms, "sleep this long in every training step");
    app.add_option("--sleep-rank", probe.sleep_rank, "only this rank sleeps --step-sleep-ms (a straggler)");
    app.add_flag("--predict-only", probe.predict_only, "no fit: predict and write predict<rank>.json");
    app.add_flag("--named", probe.named, "named batches collated from single examples");
    app.add_option("--num-workers", probe.num_workers, "the loaders' worker threads");
    app.add_flag("--streaming", probe.streaming, "the data as a stream of uneven shards");
    app.add_option("--shards", probe.shards, "the stream's shard count");
    app.add_flag("--datamodule", probe.datamodule, "fit through a DataModule (prepare_data writes a marker)");
    app.add_flag("--collectives", probe.collectives, "record the module's view of the run and its collectives");
    app.add_flag("--batchnorm", probe.batchnorm, "a SyncBatchNorm after the hidden layer");
    app.add_flag("--metric", probe.metric, "log Metrics train/mse and val/mse beside hand-made sums");
    app.add_option("--unfreeze-hidden-at", probe.unfreeze_hidden_at,
                   "BackboneFinetuning of the hidden layer: frozen, then trained from this epoch");
    app.add_option("--unfreeze-rank", probe.unfreeze_rank, "... with the callback on this rank alone");
    app.add_option("--optimizer", probe.optimizer, "sgd or adam");
    app.add_option("--step-lr-gamma", probe.step_lr_gamma, "> 0: StepLR(step_size=1, gamma) per optimizer step");
    app.add_option("--width", probe.width, "the hidden layer's width");
    app.add_option("--depth", probe.depth, "hidden layers (the ones after the first are width x width)");
    app.add_option("--fsdp-units", probe.fsdp_units,
                   "the layers in volt::FsdpUnit: hidden, all (hidden and out) or nested (a unit around both, "
                   "hidden a unit in it)");
    app.add_flag("--pipe", probe.pipe, "hold the layers in a volt::Pipe (for strategy='pipeline')");
    app.add_flag("--micro-batch-loss", probe.micro_batch_loss,
                 "with --pipe: the loss per micro-batch through Pipe::train_step (--pipeline-schedule 1f1b)");
    app.add_flag("--skip-params", probe.skip_params, "leave the parameter values out of rank<N>.json (large models)");
    app.add_option("--consolidate", probe.consolidate,
                   "write this sharded checkpoint in one file, <path>.whole.ckpt, and exit (no training)");
    app.add_option("--inspect", probe.inspect,
                   "describe this checkpoint file in <path>.json (its state_dict's values, the parameters it lists "
                   "as sharded, whether it holds optimizer states or a shard index) and exit");
    app.add_flag("--save-weights-only", probe.save_weights_only,
                 "also a ModelCheckpoint(save_weights_only) saving every epoch to weights_ckpt");
    app.add_flag("--save-last", probe.save_last,
                 "a ModelCheckpoint(save_last): <default-root-dir>/checkpoints/last.ckpt is where the fit stopped");
    app.add_option(
        "--checkpoint-every-ms", probe.checkpoint_every_ms,
        "ModelCheckpoint(train_time_interval) with a clock 1 + rank times as fast; saves to time_ckpt<rank>");
    if (const std::optional<int> code = volt::parse_command_line(app, argc, argv)) return *code;
    volt::apply_trainer_flags(text, options);
    if (!probe.consolidate.empty()) {
      volt::TorchCheckpointIO io;
      volt::save_checkpoint_file(volt::consolidate_sharded_checkpoint(io, probe.consolidate),
                                 probe.consolidate + ".whole.ckpt");
      return 0;
    }
    if (!probe.inspect.empty()) {
      const c10::impl::GenericDict top = volt::load_checkpoint_file(probe.inspect).toGenericDict();
      nlohmann::json out{{"state_dict", nlohmann::json::object()},
                         {"sharded_parameters", nlohmann::json::array()},
                         {"optimizer_states", top.contains("optimizer_states")},
                         {"shard_index", top.contains(volt::kShardIndexKey)}};
      for (const auto& item : top.at("state_dict").toGenericDict()) {
        const torch::Tensor t = item.value().toTensor().to(torch::kDouble).reshape({-1}).contiguous();
        out["state_dict"][item.key().toStringRef()] =
            std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
      }
      if (top.contains(volt::kShardedParametersKey))
        for (const c10::IValue& name : top.at(volt::kShardedParametersKey).toListRef())
          out["sharded_parameters"].push_back(name.toStringRef());
      std::ofstream(probe.inspect + ".json") << out.dump();
      return 0;
    }
    if (probe.out.empty()) probe.out = options.default_root_dir;
    if (probe.out.empty()) throw volt::Error("ddp_probe needs --out or --default-root-dir. HINT: pass --out DIR.");
    if (probe.unfreeze_hidden_at >= 0 && (probe.unfreeze_rank < 0 || probe.unfreeze_rank == rank_from_env())) {
      options.callbacks.push_back(std::make_shared<volt::BackboneFinetuning>(volt::BackboneFinetuningOptions{
          .unfreeze_backbone_at_epoch = probe.unfreeze_hidden_at, .backbone = "hidden"}));
    }
    if (probe.stop_rank >= 0)
      options.callbacks.push_back(std::make_shared<StopOnOneRank>(probe.stop_rank, probe.stop_step));
    if (probe.save_weights_only) {
      options.enable_checkpointing = true;  // the probe turns it off by default
      options.callbacks.push_back(std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions{
          .dirpath = probe.out + "/weights_ckpt", .save_top_k = -1, .save_weights_only = true}));
    }
    if (probe.save_last) {
      options.enable_checkpointing = true;  // the probe turns it off by default
      options.callbacks.push_back(
          std::make_shared<volt::ModelCheckpoint>(volt::ModelCheckpointOptions{.save_last = true}));
    }
    if (probe.checkpoint_every_ms > 0) {
      // Each rank's clock runs at its own speed: only rank 0's may decide, or the ranks would
      // save at different steps.
      const auto start = std::chrono::steady_clock::now();
      const int64_t speed = 1 + rank_from_env();
      auto checkpoint = std::make_shared<volt::ModelCheckpoint>(
          volt::ModelCheckpointOptions{.dirpath = probe.out + "/time_ckpt",
                                       .save_top_k = -1,
                                       .train_time_interval = std::chrono::milliseconds(probe.checkpoint_every_ms)},
          [start, speed] { return start + (std::chrono::steady_clock::now() - start) * speed; });
      options.enable_checkpointing = true;  // the probe turns it off by default
      options.callbacks.push_back(checkpoint);
      options.callbacks.push_back(std::make_shared<SaveRecorder>(
          checkpoint, probe.out + "/time_ckpt" + std::to_string(rank_from_env()) + ".json"));
    }
    if (probe.fail_mode == "nojoin" && rank_from_env() == probe.fail_rank) {
      // Never reaches the rendezvous: sleeps past every join timeout, then leaves quietly.
      std::this_thread::sleep_for(std::chrono::seconds(120));
      return 0;
    }
    volt::Trainer trainer(options);
    Probe model(probe);
    if (probe.predict_only) {
      // A predict-only program: the stage itself must join the process group and gather.
      const std::vector<torch::Tensor> outputs = trainer.predict(model);
      nlohmann::json out;
      out["batches"] = outputs.size();
      const torch::Tensor all = torch::cat(outputs).to(torch::kDouble).contiguous();
      out["index"] = std::vector<double>(all.data_ptr<double>(), all.data_ptr<double>() + all.size(0) * 2);
      std::ofstream(probe.out + "/predict" + std::to_string(trainer.plan().topology.global_rank) + ".json")
          << out.dump();
      trainer.teardown();
      return 0;
    }
    if (probe.datamodule) {
      ProbeData data(model, probe.out, trainer.plan().topology);
      const volt::FitResult result = trainer.fit(model, data);
      nlohmann::json out;
      out["global_step"] = result.global_step;
      out["setup_saw_prepared"] = data.setup_saw_prepared;
      out["setups"] = data.setups;
      out["teardowns"] = data.teardowns;
      std::ofstream(probe.out + "/datamodule" + std::to_string(trainer.plan().topology.global_rank) + ".json")
          << out.dump();
      trainer.teardown();
      return 0;
    }
    const volt::FitResult result = trainer.fit(model);
    // A requeued run ends here; the restarted job writes the final results.
    if (result.requeued()) {
      trainer.teardown();
      return 0;
    }
    model.write(result, trainer.plan().topology.global_rank);
    if (trainer.plan().limit_val_batches.is_fraction() ? trainer.plan().limit_val_batches.fraction() > 0
                                                       : trainer.plan().limit_val_batches.count() > 0) {
      const volt::EvalResult eval = trainer.validate(model);
      std::ofstream(probe.out + "/validate" + std::to_string(trainer.plan().topology.global_rank) + ".json")
          << nlohmann::json(eval.metrics).dump();
    }
    trainer.teardown();
    return 0;
  });
}
