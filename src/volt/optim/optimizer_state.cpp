#include "volt/optim/optimizer_state.h"

#include <c10/util/Type.h>
#include <fmt/format.h>
#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>
#include <torch/serialize/archive.h>

#include <cstring>
#include <memory>
#include <sstream>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include "volt/base/state_dict.h"
#include "volt/core/error.h"
#include "volt/optim/field_reader.h"
#include "volt/optim/optimizer_compat.h"

namespace volt {
namespace {

using internal::FieldReader;
using GenericDict = c10::impl::GenericDict;
using OptimizerStates =
    std::vector<std::pair<compat::OptimizerStateKey, std::unique_ptr<torch::optim::OptimizerParamState>>>;

constexpr const char* kLoadHint =
    "HINT: build the optimizer as the run that wrote the checkpoint did (same optimizer, same "
    "model, the same parameter groups in the same order), or resume without the optimizer state.";

/// The key LibTorch's optimizers use for a parameter in `Optimizer::state()`.
compat::OptimizerStateKey state_key(const torch::Tensor& param) { return compat::optimizer_state_key(param); }

[[noreturn]] void throw_problems(const Problems& problems) {
  throw CheckpointError(fmt::format("{}\n{}", describe_problems("the optimizer state", problems), kLoadHint));
}

void put(GenericDict& dict, const char* key, c10::IValue value) {
  dict.insert_or_assign(std::string(key), std::move(value));
}

void put_if_defined(GenericDict& dict, const char* key, const torch::Tensor& tensor) {
  if (tensor.defined()) put(dict, key, tensor);
}

/// `step` as torch 1.13's Python Adam, AdamW and Adagrad store it: a float32 scalar tensor.
/// float32 holds every whole number up to 2^24 exactly; past that an int is written instead so
/// that no step is lost (the loader accepts both).
c10::IValue step_as_tensor(int64_t step) {
  constexpr int64_t kFloat32ExactLimit = int64_t{1} << 24;
  if (step > kFloat32ExactLimit) return step;
  return torch::scalar_tensor(static_cast<double>(step), torch::kFloat32);
}

c10::List<double> pair_list(const std::tuple<double, double>& pair) {
  return c10::List<double>({std::get<0>(pair), std::get<1>(pair)});
}

std::optional<std::tuple<double, double>> read_pair(FieldReader& reader, const char* key) {
  const auto values = reader.numbers(key);
  if (!values) return std::nullopt;
  if (values->size() != 2) {
    reader.problem(fmt::format("{} has {} values; expected 2", reader.name(key), values->size()));
    return std::nullopt;
  }
  return std::make_tuple((*values)[0], (*values)[1]);
}

// One codec per optimizer Volt knows: how its options and per-parameter state map to PyTorch's
// key names. Readers assign only the fields they found; FieldReader records the rest.

struct SgdCodec {
  using Optimizer = torch::optim::SGD;
  using Options = torch::optim::SGDOptions;
  using State = torch::optim::SGDParamState;
  static constexpr const char* kName = "SGD";
  // SGD without momentum keeps no state, so a parameter may lack it.
  static constexpr bool kEveryParamHasState = false;

  static void write_options(const Options& options, GenericDict& dict) {
    put(dict, "lr", options.lr());
    put(dict, "momentum", options.momentum());
    put(dict, "dampening", options.dampening());
    put(dict, "weight_decay", options.weight_decay());
    put(dict, "nesterov", options.nesterov());
  }
  static void read_options(FieldReader& reader, Options& options) {
    if (const auto v = reader.number("lr")) options.lr(*v);
    if (const auto v = reader.number("momentum")) options.momentum(*v);
    if (const auto v = reader.number("dampening")) options.dampening(*v);
    if (const auto v = reader.number("weight_decay")) options.weight_decay(*v);
    if (const auto v = reader.flag("nesterov")) options.nesterov(*v);
  }
  static void write_state(const State& state, GenericDict& dict) {
    put_if_defined(dict, "momentum_buffer", state.momentum_buffer());
  }
  static std::unique_ptr<State> read_state(FieldReader& reader, const torch::Tensor& param, const Options& options) {
    // PyTorch writes {"momentum_buffer": None} for SGD without momentum; LibTorch's SGD expects
    // no state at all then.
    if (!reader.has("momentum_buffer")) return nullptr;
    auto state = std::make_unique<State>();
    state->momentum_buffer(reader.tensor_like("momentum_buffer", param));
    return state;
  }
};

/// Adam and AdamW share their state and options' fields.
template <typename OptionsT, typename StateT>
struct AdamFamilyCodec {
  using Options = OptionsT;
  using State = StateT;
  static constexpr bool kEveryParamHasState = false;

  static void write_options(const Options& options, GenericDict& dict) {
    put(dict, "lr", options.lr());
    put(dict, "betas", pair_list(options.betas()));
    put(dict, "eps", options.eps());
    put(dict, "weight_decay", options.weight_decay());
    put(dict, "amsgrad", options.amsgrad());
  }
  static void read_options(FieldReader& reader, Options& options) {
    if (const auto v = reader.number("lr")) options.lr(*v);
    if (const auto v = read_pair(reader, "betas")) options.betas(*v);
    if (const auto v = reader.number("eps")) options.eps(*v);
    if (const auto v = reader.number("weight_decay")) options.weight_decay(*v);
    if (const auto v = reader.flag("amsgrad")) options.amsgrad(*v);
  }
  static void write_state(const State& state, GenericDict& dict) {
    put(dict, "step", step_as_tensor(state.step()));
    put(dict, "exp_avg", state.exp_avg());
    put(dict, "exp_avg_sq", state.exp_avg_sq());
    put_if_defined(dict, "max_exp_avg_sq", state.max_exp_avg_sq());
  }
  static std::unique_ptr<State> read_state(FieldReader& reader, const torch::Tensor& param, const Options& options) {
    auto state = std::make_unique<State>();
    if (const auto step = reader.step("step")) state->step(*step);
    state->exp_avg(reader.tensor_like("exp_avg", param));
    state->exp_avg_sq(reader.tensor_like("exp_avg_sq", param));
    // LibTorch's amsgrad step reads max_exp_avg_sq from existing state without creating it.
    if (options.amsgrad() || reader.has("max_exp_avg_sq")) {
      state->max_exp_avg_sq(reader.tensor_like("max_exp_avg_sq", param));
    }
    return state;
  }
};

struct AdamCodec : AdamFamilyCodec<torch::optim::AdamOptions, torch::optim::AdamParamState> {
  using Optimizer = torch::optim::Adam;
  static constexpr const char* kName = "Adam";
};

struct AdamWCodec : AdamFamilyCodec<torch::optim::AdamWOptions, torch::optim::AdamWParamState> {
  using Optimizer = torch::optim::AdamW;
  static constexpr const char* kName = "AdamW";
};

struct RmspropCodec {
  using Optimizer = torch::optim::RMSprop;
  using Options = torch::optim::RMSpropOptions;
  using State = torch::optim::RMSpropParamState;
  static constexpr const char* kName = "RMSprop";
  static constexpr bool kEveryParamHasState = false;

  static void write_options(const Options& options, GenericDict& dict) {
    put(dict, "lr", options.lr());
    put(dict, "momentum", options.momentum());
    put(dict, "alpha", options.alpha());
    put(dict, "eps", options.eps());
    put(dict, "centered", options.centered());
    put(dict, "weight_decay", options.weight_decay());
  }
  static void read_options(FieldReader& reader, Options& options) {
    if (const auto v = reader.number("lr")) options.lr(*v);
    if (const auto v = reader.number("momentum")) options.momentum(*v);
    if (const auto v = reader.number("alpha")) options.alpha(*v);
    if (const auto v = reader.number("eps")) options.eps(*v);
    if (const auto v = reader.flag("centered")) options.centered(*v);
    if (const auto v = reader.number("weight_decay")) options.weight_decay(*v);
  }
  static void write_state(const State& state, GenericDict& dict) {
    // torch 1.13's Python RMSprop keeps `step` as a plain int.
    put(dict, "step", state.step());
    put(dict, "square_avg", state.square_avg());
    put_if_defined(dict, "momentum_buffer", state.momentum_buffer());
    put_if_defined(dict, "grad_avg", state.grad_avg());
  }
  static std::unique_ptr<State> read_state(FieldReader& reader, const torch::Tensor& param, const Options& options) {
    auto state = std::make_unique<State>();
    if (const auto step = reader.step("step")) state->step(*step);
    state->square_avg(reader.tensor_like("square_avg", param));
    // LibTorch's step uses these buffers from existing state whenever momentum / centered is on.
    if (options.momentum() > 0 || reader.has("momentum_buffer")) {
      state->momentum_buffer(reader.tensor_like("momentum_buffer", param));
    }
    if (options.centered() || reader.has("grad_avg")) {
      state->grad_avg(reader.tensor_like("grad_avg", param));
    }
    return state;
  }
};

struct AdagradCodec {
  using Optimizer = torch::optim::Adagrad;
  using Options = torch::optim::AdagradOptions;
  using State = torch::optim::AdagradParamState;
  static constexpr const char* kName = "Adagrad";
  // LibTorch's Adagrad creates every parameter's state in its constructor and its step assumes
  // it exists, so a checkpoint must carry all of them.
  static constexpr bool kEveryParamHasState = true;

  static void write_options(const Options& options, GenericDict& dict) {
    put(dict, "lr", options.lr());
    put(dict, "lr_decay", options.lr_decay());
    put(dict, "eps", options.eps());
    put(dict, "weight_decay", options.weight_decay());
    put(dict, "initial_accumulator_value", options.initial_accumulator_value());
  }
  static void read_options(FieldReader& reader, Options& options) {
    if (const auto v = reader.number("lr")) options.lr(*v);
    if (const auto v = reader.number("lr_decay")) options.lr_decay(*v);
    if (const auto v = reader.number("eps")) options.eps(*v);
    if (const auto v = reader.number("weight_decay")) options.weight_decay(*v);
    if (const auto v = reader.number("initial_accumulator_value")) {
      options.initial_accumulator_value(*v);
    }
  }
  static void write_state(const State& state, GenericDict& dict) {
    put(dict, "step", step_as_tensor(state.step()));
    put(dict, "sum", state.sum());
  }
  static std::unique_ptr<State> read_state(FieldReader& reader, const torch::Tensor& param, const Options& options) {
    auto state = std::make_unique<State>();
    if (const auto step = reader.step("step")) state->step(*step);
    state->sum(reader.tensor_like("sum", param));
    return state;
  }
};

template <typename Codec>
c10::IValue save_known(const torch::optim::Optimizer& optimizer) {
  GenericDict state = internal::new_int_dict();
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    GenericDict group_dict = make_state_dict();
    Codec::write_options(static_cast<const typename Codec::Options&>(group.options()), group_dict);
    c10::List<int64_t> params;
    for (const auto& param : group.params()) {
      const auto it = optimizer.state().find(state_key(param));
      if (it != optimizer.state().end()) {
        const auto* param_state = dynamic_cast<const typename Codec::State*>(it->second.get());
        VOLT_CHECK(param_state != nullptr,
                   "the {} optimizer holds parameter state of an unexpected type; expected {}'s. "
                   "HINT: an optimizer subclass with its own state needs its own save()/load().",
                   Codec::kName, Codec::kName);
        GenericDict state_dict = make_state_dict();
        Codec::write_state(*param_state, state_dict);
        state.insert(index, std::move(state_dict));
      }
      params.push_back(index++);
    }
    put(group_dict, "params", std::move(params));
    groups.push_back(std::move(group_dict));
  }
  GenericDict result = make_state_dict();
  put(result, kOptimizerKindKey, Codec::kName);
  put(result, "state", std::move(state));
  put(result, "param_groups", std::move(groups));
  return result;
}

/// The checkpoint's param groups after checking that their number matches the optimizer's.
std::vector<c10::IValue> read_groups(FieldReader& root, const torch::optim::Optimizer& optimizer, Problems& problems) {
  const auto groups = root.list("param_groups");
  if (!groups) throw_problems(problems);
  if (groups->size() != optimizer.param_groups().size()) {
    problems.push_back(fmt::format("the checkpoint has {} param group(s); the optimizer has {}", groups->size(),
                                   optimizer.param_groups().size()));
    throw_problems(problems);
  }
  for (size_t i = 0; i < groups->size(); ++i) {
    if (!(*groups)[i].isGenericDict()) {
      problems.push_back(fmt::format("param_groups[{}] is a {}; expected a dict", i, (*groups)[i].tagKind()));
    }
  }
  if (!problems.empty()) throw_problems(problems);
  return *groups;
}

/// The checkpoint's parameter ids of one group, checked against the group's size.
std::optional<std::vector<int64_t>> read_param_ids(FieldReader& group, size_t index, size_t expected) {
  auto ids = group.integers("params");
  if (ids && ids->size() != expected) {
    group.problem(
        fmt::format("param_groups[{}] has {} parameter(s) in the checkpoint; the "
                    "optimizer's group has {}",
                    index, ids->size(), expected));
    return std::nullopt;
  }
  return ids;
}

template <typename Codec>
void load_known(torch::optim::Optimizer& optimizer, FieldReader& root, Problems& problems) {
  using Options = typename Codec::Options;
  const std::vector<c10::IValue> groups = read_groups(root, optimizer, problems);
  const auto saved_state = root.dict("state");

  std::vector<std::unique_ptr<Options>> new_options;
  OptimizerStates new_states;
  for (size_t i = 0; i < groups.size(); ++i) {
    const auto& group = optimizer.param_groups()[i];
    FieldReader group_reader(groups[i].toGenericDict(), fmt::format("param_groups[{}]", i), problems);
    // Start from the group's current options so that fields LibTorch has and PyTorch lacks keep
    // their values.
    auto options = std::make_unique<Options>(static_cast<const Options&>(group.options()));
    Codec::read_options(group_reader, *options);
    const auto ids = read_param_ids(group_reader, i, group.params().size());
    if (ids && saved_state) {
      for (size_t j = 0; j < ids->size(); ++j) {
        const int64_t id = (*ids)[j];
        const auto it = saved_state->find(c10::IValue(id));
        if (it == saved_state->end() || it->value().isNone()) {
          if (Codec::kEveryParamHasState) {
            problems.push_back(
                fmt::format("state[{}] is missing; {} keeps state for every "
                            "parameter",
                            id, Codec::kName));
          }
          continue;
        }
        if (!it->value().isGenericDict()) {
          problems.push_back(fmt::format("state[{}] is a {}; expected a dict", id, it->value().tagKind()));
          continue;
        }
        FieldReader state_reader(it->value().toGenericDict(), fmt::format("state[{}]", id), problems);
        auto state = Codec::read_state(state_reader, group.params()[j], *options);
        if (state) new_states.emplace_back(state_key(group.params()[j]), std::move(state));
      }
    }
    new_options.push_back(std::move(options));
  }
  if (!problems.empty()) throw_problems(problems);

  // Everything fits: only now change the optimizer. Like PyTorch, the checkpoint replaces all
  // state, so a parameter without saved state starts fresh.
  for (size_t i = 0; i < new_options.size(); ++i) {
    optimizer.param_groups()[i].set_options(std::move(new_options[i]));
  }
  optimizer.state().clear();
  for (auto& [key, state] : new_states) optimizer.state()[key] = std::move(state);
}

std::string type_name(const torch::optim::Optimizer& optimizer) { return c10::demangle(typeid(optimizer).name()); }

/// The group's lr, or nullopt when its options do not implement get_lr (it throws then).
std::optional<double> try_get_lr(const torch::optim::OptimizerOptions& options) {
  try {
    return options.get_lr();
  } catch (const c10::Error&) {
    return std::nullopt;
  }
}

c10::IValue save_archive(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  std::ostringstream bytes;
  try {
    optimizer.save(archive);
    archive.save_to(bytes);
  } catch (const c10::Error& e) {
    throw Error(
        fmt::format("cannot save the state of optimizer {}: LibTorch said: {}\nHINT: "
                    "implement save(OutputArchive&) and load(InputArchive&) in it, e.g. "
                    "with torch::optim::serialize<ParamState, Options>(archive, *this).",
                    type_name(optimizer), e.what_without_backtrace()));
  }
  const std::string data = bytes.str();
  // LibTorch's default Optimizer::save writes nothing and its load reads nothing, which would
  // resume such an optimizer with fresh state without a word.
  torch::serialize::InputArchive written;
  written.load_from(data.data(), data.size());
  VOLT_CHECK(!written.keys().empty() || optimizer.state().empty(),
             "optimizer {} holds state, but its save(OutputArchive&) wrote nothing (LibTorch's "
             "default does that), so a checkpoint would lose it.\nHINT: implement save() and "
             "load() in it, e.g. with torch::optim::serialize<ParamState, Options>(archive, "
             "*this).",
             type_name(optimizer));
  torch::Tensor tensor = torch::empty({static_cast<int64_t>(data.size())}, torch::kUInt8);
  std::memcpy(tensor.data_ptr<uint8_t>(), data.data(), data.size());

  // LibTorch's own load ignores the saved hyperparameters, so keep the lr (what schedulers
  // change) beside the archive.
  c10::impl::GenericList groups(c10::AnyType::get());
  int64_t index = 0;
  for (const auto& group : optimizer.param_groups()) {
    GenericDict group_dict = make_state_dict();
    if (const auto lr = try_get_lr(group.options())) put(group_dict, "lr", *lr);
    c10::List<int64_t> params;
    for (size_t j = 0; j < group.params().size(); ++j) params.push_back(index++);
    put(group_dict, "params", std::move(params));
    groups.push_back(std::move(group_dict));
  }
  GenericDict result = make_state_dict();
  put(result, kOptimizerKindKey, type_name(optimizer));
  put(result, kLibtorchArchiveKey, tensor);
  put(result, "param_groups", std::move(groups));
  return result;
}

void load_archive(torch::optim::Optimizer& optimizer, FieldReader& root, Problems& problems) {
  const std::vector<c10::IValue> groups = read_groups(root, optimizer, problems);
  std::vector<std::optional<double>> lrs;
  for (size_t i = 0; i < groups.size(); ++i) {
    FieldReader group_reader(groups[i].toGenericDict(), fmt::format("param_groups[{}]", i), problems);
    read_param_ids(group_reader, i, optimizer.param_groups()[i].params().size());
    lrs.push_back(group_reader.has("lr") ? group_reader.number("lr") : std::nullopt);
  }
  torch::Tensor bytes = root.tensor(kLibtorchArchiveKey);
  if (bytes.defined() && (bytes.scalar_type() != torch::kUInt8 || bytes.dim() != 1)) {
    problems.push_back(fmt::format("'{}' is a {} tensor of shape {}; expected a 1-d uint8 tensor", kLibtorchArchiveKey,
                                   c10::toString(bytes.scalar_type()), internal::shape_string(bytes.sizes())));
  }
  if (!problems.empty()) throw_problems(problems);

  bytes = bytes.to(torch::kCPU).contiguous();
  torch::serialize::InputArchive archive;
  try {
    archive.load_from(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(bytes.numel()));
    optimizer.load(archive);
  } catch (const c10::Error& e) {
    throw CheckpointError(
        fmt::format("cannot load the state of optimizer {} from its LibTorch "
                    "archive: LibTorch said: {}\n{}",
                    type_name(optimizer), e.what_without_backtrace(), kLoadHint));
  }
  for (size_t i = 0; i < lrs.size(); ++i) {
    if (lrs[i]) optimizer.param_groups()[i].options().set_lr(*lrs[i]);
  }
}

template <typename Codec>
bool is_a(const torch::optim::Optimizer& optimizer) {
  return dynamic_cast<const typename Codec::Optimizer*>(&optimizer) != nullptr;
}

}  // namespace

std::string optimizer_kind(const torch::optim::Optimizer& optimizer) {
  if (is_a<SgdCodec>(optimizer)) return SgdCodec::kName;
  if (is_a<AdamCodec>(optimizer)) return AdamCodec::kName;
  if (is_a<AdamWCodec>(optimizer)) return AdamWCodec::kName;
  if (is_a<RmspropCodec>(optimizer)) return RmspropCodec::kName;
  if (is_a<AdagradCodec>(optimizer)) return AdagradCodec::kName;
  return type_name(optimizer);
}

c10::IValue optimizer_state_dict(const torch::optim::Optimizer& optimizer) {
  if (is_a<SgdCodec>(optimizer)) return save_known<SgdCodec>(optimizer);
  if (is_a<AdamCodec>(optimizer)) return save_known<AdamCodec>(optimizer);
  if (is_a<AdamWCodec>(optimizer)) return save_known<AdamWCodec>(optimizer);
  if (is_a<RmspropCodec>(optimizer)) return save_known<RmspropCodec>(optimizer);
  if (is_a<AdagradCodec>(optimizer)) return save_known<AdagradCodec>(optimizer);
  return save_archive(optimizer);
}

void load_optimizer_state_dict(torch::optim::Optimizer& optimizer, const c10::IValue& state) {
  if (!state.isGenericDict()) {
    throw CheckpointError(
        fmt::format("the optimizer state is a {}; expected a dict with 'state' and 'param_groups'.\nHINT: "
                    "pass what optimizer_state_dict() returned (e.g. checkpoint['optimizer_states'][0]).",
                    state.tagKind()));
  }
  Problems problems;
  FieldReader root(state.toGenericDict(), "optimizer state", problems);
  const std::string kind = optimizer_kind(optimizer);
  // PyTorch's own state dicts carry no kind; their fields are checked below all the same.
  if (root.has(kOptimizerKindKey)) {
    const auto saved_kind = root.string(kOptimizerKindKey);
    if (saved_kind && *saved_kind != kind) {
      problems.push_back(
          fmt::format("the checkpoint holds the state of a {} optimizer; this "
                      "optimizer is a {}",
                      *saved_kind, kind));
      throw_problems(problems);
    }
  }
  if (is_a<SgdCodec>(optimizer)) return load_known<SgdCodec>(optimizer, root, problems);
  if (is_a<AdamCodec>(optimizer)) return load_known<AdamCodec>(optimizer, root, problems);
  if (is_a<AdamWCodec>(optimizer)) return load_known<AdamWCodec>(optimizer, root, problems);
  if (is_a<RmspropCodec>(optimizer)) return load_known<RmspropCodec>(optimizer, root, problems);
  if (is_a<AdagradCodec>(optimizer)) return load_known<AdagradCodec>(optimizer, root, problems);
  load_archive(optimizer, root, problems);
}

}  // namespace volt
