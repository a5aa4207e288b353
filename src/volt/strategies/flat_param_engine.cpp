#include "volt/strategies/flat_param_engine.h"

#include <fmt/ranges.h>
#include <torch/torch.h>

#include <map>
#include <set>

#include "volt/core/error.h"
#include "volt/distributed/process_group.h"
#include "volt/optim/optimizer_state.h"

namespace volt {

namespace {

using GenericDict = c10::impl::GenericDict;

// Optimizers whose state is one value per parameter element (plus a step count), so a piece of
// a parameter has exactly the piece of its state; LBFGS and unknown optimizers are not.
bool shardable_kind(const std::string& kind) {
  return kind == "SGD" || kind == "Adam" || kind == "AdamW" || kind == "RMSprop" || kind == "Adagrad";
}

}  // namespace

FlatParamEngine::FlatParamEngine(ProcessGroup& group) : process_group_(group) {}

void FlatParamEngine::lay_out(const torch::nn::Module& module,
                              const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers,
                              const std::vector<std::shared_ptr<FsdpUnitImpl>>& units) {
  const int64_t rank = process_group_.rank();
  std::map<const c10::TensorImpl*, std::string> names;
  trainable_.clear();
  for (const auto& item : module.named_parameters(true)) {
    names.emplace(item.value().unsafeGetTensorImpl(), item.key());
    if (item.value().requires_grad()) trainable_.push_back(item.key());
  }
  // Each parameter goes to the innermost unit that holds it (later in depth-first order), the rest
  // to group 0. A unit gets a group with its first trained parameter (one whose parameters are all
  // frozen has nothing to shard), so groups follow the optimizers' order.
  groups_.clear();
  groups_.emplace_back();
  std::map<const c10::TensorImpl*, size_t> owner;  // parameter -> index into units
  for (size_t u = 0; u < units.size(); ++u) {
    for (const torch::Tensor& p : units[u]->parameters(/*recurse=*/true)) owner[p.unsafeGetTensorImpl()] = u;
  }
  std::map<size_t, size_t> group_of_unit;
  entries_.clear();
  ids_.assign(optimizers.size(), {});
  optimizers_ = optimizers;
  std::set<const c10::TensorImpl*> seen;
  for (size_t k = 0; k < optimizers.size(); ++k) {
    const std::string kind = optimizer_kind(*optimizers[k]);
    VOLT_CHECK(shardable_kind(kind),
               "strategy='fsdp' shards optimizer state element by element, which optimizer {} ({}) does not keep. "
               "HINT: use SGD, Adam, AdamW, RMSprop or Adagrad, or strategy='ddp'.",
               k, kind);
    for (const auto& group : optimizers[k]->param_groups()) {
      for (const torch::Tensor& p : group.params()) {
        if (!p.requires_grad()) {
          ids_[k].emplace_back();
          continue;
        }
        const auto name = names.find(p.unsafeGetTensorImpl());
        VOLT_CHECK(name != names.end(),
                   "optimizer {} holds a tensor of shape {} that is not a parameter of {}; strategy='fsdp' shards "
                   "only the module's parameters. HINT: register the tensor with register_parameter.",
                   k, c10::str(p.sizes()), module.name());
        VOLT_CHECK(seen.insert(p.unsafeGetTensorImpl()).second,
                   "parameter '{}' is in two optimizers' groups; strategy='fsdp' gives each trained parameter to "
                   "one optimizer. HINT: put it in one group only.",
                   name->second);
        const torch::Tensor& first = entries_.empty() ? p : entries_.front().param;
        VOLT_CHECK(p.dtype() == first.dtype() && p.device() == first.device() && p.is_contiguous(),
                   "parameter '{}' is {} on {}{}, but '{}' is {} on {}; strategy='fsdp' keeps the trained "
                   "parameters in one flat buffer. HINT: give every trained parameter the same dtype and device.",
                   name->second, c10::toString(p.scalar_type()), p.device().str(),
                   p.is_contiguous() ? "" : " (not contiguous)", entries_.empty() ? name->second : entries_[0].name,
                   c10::toString(first.scalar_type()), first.device().str());
        size_t g = 0;
        if (const auto found = owner.find(p.unsafeGetTensorImpl()); found != owner.end()) {
          const auto [it, added] = group_of_unit.emplace(found->second, groups_.size());
          if (added) groups_.push_back(Group{.unit = units[found->second]});
          g = it->second;
        }
        ids_[k].push_back(entries_.size());
        entries_.push_back(Entry{.name = name->second,
                                 .param = p,
                                 .piece = {},
                                 .range = {},
                                 .group = g,
                                 .slot = groups_[g].entries.size(),
                                 .shape = p.sizes().vec()});
        groups_[g].entries.push_back(entries_.size() - 1);
      }
    }
  }
  VOLT_CHECK(!entries_.empty(),
             "{}'s optimizers hold no parameter that requires grad; strategy='fsdp' has nothing to shard. HINT: "
             "unfreeze the layers to train, or use strategy='ddp'.",
             module.name());
  const torch::TensorOptions options = entries_.front().param.options();
  for (size_t g = 0; g < groups_.size(); ++g) {
    Group& group = groups_[g];
    std::vector<int64_t> numels;
    for (const size_t i : group.entries) numels.push_back(entries_[i].param.numel());
    group.layout.emplace(std::move(numels), process_group_.world_size(), rank);
    // The group's parameters move into one flat buffer (FSDP's flat parameter), each becoming a
    // view of its place: an all-gather writes straight into them.
    torch::NoGradGuard no_grad;
    group.full = torch::zeros({group.layout->padded()}, options);
    for (size_t slot = 0; slot < group.entries.size(); ++slot) {
      Entry& e = entries_[group.entries[slot]];
      torch::Tensor place = group.layout->view(group.full, slot, e.param.sizes());
      place.copy_(e.param.detach());
      e.param.set_data(place);
      e.range = group.layout->piece(slot);
      group.views.push_back(place);
    }
    const int64_t chunk = group.layout->chunk();
    if (g == 0) {
      // A view of the parameters' own storage: the optimizer's update of the piece is the
      // parameter's update, and whatever loads into the parameter (a checkpoint) is the piece's.
      group.shard = group.full.narrow(0, rank * chunk, chunk);
    } else {
      group.shard = group.full.narrow(0, rank * chunk, chunk).clone();
    }
    for (const size_t i : group.entries) {
      Entry& e = entries_[i];
      e.piece = group.shard.narrow(0, e.range.chunk_offset, e.range.numel());
    }
    group.gathered = true;  // whole until the first training forward, so a checkpoint loads into it
    group.handed_out = true;
  }
  piece_names_.clear();
  for (size_t k = 0; k < optimizers.size(); ++k) {
    size_t id = 0;
    for (auto& group : optimizers[k]->param_groups()) {
      for (torch::Tensor& p : group.params()) {
        if (const auto index = ids_[k][id++]) {
          p = entries_[*index].piece;
          piece_names_[p.unsafeGetTensorImpl()] = entries_[*index].name;
        }
      }
    }
  }
}

bool FlatParamEngine::covers_optimizers() const {
  for (size_t k = 0; k < optimizers_.size(); ++k) {
    size_t held = 0;
    for (const auto& group : optimizers_[k]->param_groups()) held += group.params().size();
    if (held != ids_[k].size()) return false;
  }
  return true;
}

void FlatParamEngine::relayout(const torch::nn::Module& module,
                               const std::function<std::vector<std::shared_ptr<FsdpUnitImpl>>()>& find_units) {
  // A callback froze or unfroze parameters, or added a param group (BackboneFinetuning): the
  // flat layout covers the old set. Every process gathers the whole optimizer state, the
  // optimizers get the whole parameters back, the new set is laid out, and the state is cut
  // again: as if the run had resumed from a full checkpoint into the new layout.
  VOLT_INTERNAL_ASSERT(!grads_flat_.defined(), "fsdp re-laid out its parameters between a backward and its step");
  const std::vector<c10::IValue> whole = whole_optimizer_states(/*everyone=*/true);
  gather_units();
  for (size_t k = 0; k < optimizers_.size(); ++k) {
    size_t id = 0;
    for (auto& group : optimizers_[k]->param_groups()) {
      for (torch::Tensor& p : group.params()) {
        // The whole parameters view their groups' buffers, complete since the last all-gather;
        // lay_out copies them into the new ones.
        if (id < ids_[k].size() && ids_[k][id]) p = entries_[*ids_[k][id]].param;
        ++id;
      }
    }
  }
  const std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers = optimizers_;
  lay_out(module, optimizers, find_units());
  for (size_t k = 0; k < optimizers_.size(); ++k) load_whole_optimizer_state(k, whole[k]);
}

std::vector<torch::Tensor> FlatParamEngine::parameters(size_t g) const {
  std::vector<torch::Tensor> out;
  for (const size_t i : groups_.at(g).entries) out.push_back(entries_[i].param);
  return out;
}

void FlatParamEngine::begin_backward() {
  const Group& root = groups_.front();
  if (grads_flat_.defined() || root.entries.empty()) return;  // accumulating: the views hold the earlier sums
  // Backward accumulates each gradient in place into its view of one flat buffer (a parameter
  // left out of the loss keeps its zeros, as in PyTorch's FSDP), so reduce_root_gradients has
  // nothing to copy and no second buffer of the model's size is ever alive.
  torch::NoGradGuard no_grad;
  grads_flat_ = torch::zeros({root.layout->padded()}, root.full.options());
  for (size_t slot = 0; slot < root.entries.size(); ++slot) {
    Entry& e = entries_[root.entries[slot]];
    torch::Tensor place = root.layout->view(grads_flat_, slot, e.param.sizes());
    if (e.param.grad().defined()) place.copy_(e.param.grad());
    e.param.mutable_grad() = place;
  }
}

void FlatParamEngine::reduce_root_gradients() {
  const Group& root = groups_.front();
  torch::Tensor flat = std::move(grads_flat_);
  grads_flat_ = torch::Tensor();
  if (root.entries.empty()) return;
  if (!flat.defined()) flat = torch::zeros({root.layout->padded()}, root.full.options());
  {
    torch::NoGradGuard no_grad;
    for (size_t slot = 0; slot < root.entries.size(); ++slot) {
      Entry& e = entries_[root.entries[slot]];
      // A gradient that is not the view begin_backward installed (a hook set it to none and
      // backward made a new one) holds everything since: it replaces the slot.
      torch::Tensor place = root.layout->view(flat, slot, e.param.sizes());
      const torch::Tensor& grad = e.param.grad();
      if (grad.defined() && grad.data_ptr() != place.data_ptr()) place.copy_(grad);
      // Only the flat buffer holds the whole gradients now, and it goes into the collective as
      // scratch: what sharding gradients saves.
      e.param.mutable_grad() = torch::Tensor();
    }
  }
  add_to_pieces(process_group_.reduce_scatter(std::move(flat), Reduce::kMean), root);
}

void FlatParamEngine::gather_root() {
  if (groups_.front().entries.empty()) return;
  torch::NoGradGuard no_grad;
  // The pieces are this process's chunk of the flat parameters, updated in place by the step:
  // every process's chunk lands in its place of everyone's buffer, which the parameters view.
  // (A unit's pieces are its chunk alone; its next forward gathers them.)
  Group& root = groups_.front();
  process_group_.all_gather_into(root.shard, root.full);
}

void FlatParamEngine::add_to_pieces(const torch::Tensor& mine, const Group& group) {
  for (const size_t i : group.entries) {
    Entry& e = entries_[i];
    const torch::Tensor g = mine.narrow(0, e.range.chunk_offset, e.range.numel());
    if (e.piece.grad().defined()) {
      e.piece.mutable_grad().add_(g);
    } else {
      e.piece.mutable_grad() = g.clone();  // its own memory: zero_grad detaches grads in place
    }
  }
}

void FlatParamEngine::gather_unit(size_t g) {
  Group& group = groups_[g];
  if (group.gathered) return;
  torch::NoGradGuard no_grad;
  // The same storage object gets memory again: the views autograd saved in the forward (a
  // weight's transpose) see the gathered values.
  c10::StorageImpl* storage = group.full.storage().unsafeGetStorageImpl();
  const size_t bytes = static_cast<size_t>(group.full.numel()) * group.full.element_size();
  storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
  storage->set_nbytes(bytes);
  process_group_.all_gather_into(group.shard, group.full);
  for (size_t slot = 0; slot < group.entries.size(); ++slot)
    entries_[group.entries[slot]].param.set_data(group.views[slot]);
  group.gathered = true;
}

void FlatParamEngine::release_unit(size_t g) {
  Group& group = groups_[g];
  if (!group.gathered) return;
  torch::NoGradGuard no_grad;
  if (group.handed_out) {
    const int64_t chunk = group.layout->chunk();
    group.shard.copy_(group.full.narrow(0, process_group_.rank() * chunk, chunk));
    group.handed_out = false;
  }
  for (const size_t i : group.entries) {
    // An empty tensor, not freed memory, is what code reading the parameter between gathers sees.
    entries_[i].param.set_data(torch::empty({0}, group.full.options()));
  }
  c10::StorageImpl* storage = group.full.storage().unsafeGetStorageImpl();
  storage->set_data_ptr_noswap(at::DataPtr(nullptr, group.full.device()));
  storage->set_nbytes(0);
  group.gathered = false;
}

void FlatParamEngine::reduce_unit(size_t g) {
  Group& group = groups_[g];
  torch::Tensor flat;
  {
    torch::NoGradGuard no_grad;
    std::vector<torch::Tensor> grads;
    for (const size_t i : group.entries) grads.push_back(entries_[i].param.grad());
    flat = group.layout->flatten(grads, group.full.options());  // a missing gradient counts as zeros
    for (const size_t i : group.entries) entries_[i].param.mutable_grad() = torch::Tensor();
  }
  // The pieces sum the averages of every backward, which is the average of the sums.
  add_to_pieces(process_group_.reduce_scatter(std::move(flat), Reduce::kMean), group);
}

void FlatParamEngine::gather_units() {
  for (size_t g = 1; g < groups_.size(); ++g) {
    gather_unit(g);
    groups_[g].handed_out = true;
  }
}

void FlatParamEngine::release_units() {
  for (size_t g = 1; g < groups_.size(); ++g) release_unit(g);
}

std::vector<c10::IValue> FlatParamEngine::whole_optimizer_states(bool everyone) {
  const bool root = everyone || process_group_.rank() == 0;
  std::vector<c10::IValue> out;
  for (size_t k = 0; k < optimizers_.size(); ++k) {
    const GenericDict top = optimizer_state_dict(*optimizers_[k]).toGenericDict();
    const GenericDict state = top.at("state").toGenericDict();
    // The elementwise entries of the sharded parameters, by name: id -> tensor.
    std::map<std::string, std::map<int64_t, torch::Tensor>> pieces;
    std::string signature;
    for (const auto& entry : state) {
      const int64_t id = entry.key().toInt();
      // Beyond the layout: a group added since, whose parameters have no state yet.
      if (static_cast<size_t>(id) >= ids_[k].size() || !ids_[k][id]) continue;
      for (const auto& field : entry.value().toGenericDict()) {
        const std::string key = field.key().toStringRef();
        if (!is_elementwise_state(key) || !field.value().isTensor()) continue;
        pieces[key][id] = field.value().toTensor();
        signature += fmt::format("{}:{};", id, key);
      }
    }
    // Every process must hold state for the same parameters, or the all-gathers below would
    // pair one process's exp_avg with another's momentum.
    const std::vector<std::string> signatures = process_group_.all_gather_bytes(signature);
    for (size_t r = 0; r < signatures.size(); ++r) {
      VOLT_CHECK(signatures[r] == signatures.front(),
                 "optimizer {} holds state for other parameters on rank {} than on rank 0, so its sharded state "
                 "cannot be gathered for a checkpoint. HINT: every process must step the same optimizers with the "
                 "same parameters; check code that depends on the rank.",
                 k, r);
    }
    GenericDict full_state = state.copy();
    for (const auto& [key, by_id] : pieces) {
      // One all-gather per group that holds this state: each group has its own chunks.
      for (size_t g = 0; g < groups_.size(); ++g) {
        const Group& group = groups_[g];
        torch::Tensor chunk;
        for (const auto& [id, tensor] : by_id) {
          const Entry& e = entries_[*ids_[k][id]];
          if (e.group != g) continue;
          if (!chunk.defined()) chunk = torch::zeros({group.layout->chunk()}, tensor.options());
          if (e.range.numel() > 0) chunk.narrow(0, e.range.chunk_offset, e.range.numel()).copy_(tensor.reshape({-1}));
        }
        if (!chunk.defined()) continue;  // the same on every process: their signatures match
        const torch::Tensor flat = process_group_.all_gather_flat(chunk);
        if (!root) continue;
        for (const auto& [id, tensor] : by_id) {
          const Entry& e = entries_[*ids_[k][id]];
          if (e.group != g) continue;
          GenericDict param_state = full_state.at(id).toGenericDict().copy();
          param_state.insert_or_assign(key, group.layout->view(flat, e.slot, e.shape).clone());
          full_state.insert_or_assign(id, param_state);
        }
      }
    }
    if (!root) {
      out.emplace_back();
      continue;
    }
    GenericDict whole = top.copy();
    whole.insert_or_assign("state", full_state);
    out.emplace_back(whole);
  }
  return out;
}

size_t FlatParamEngine::optimizer_index(const torch::optim::Optimizer& optimizer) const {
  size_t k = 0;
  while (k < optimizers_.size() && optimizers_[k].get() != &optimizer) ++k;
  VOLT_INTERNAL_ASSERT(k < optimizers_.size(), "an optimizer fsdp did not lay out");
  return k;
}

std::vector<c10::IValue> FlatParamEngine::local_optimizer_states(
    const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) const {
  std::vector<c10::IValue> out;
  for (const auto& optimizer : optimizers) {
    const size_t k = optimizer_index(*optimizer);
    const c10::IValue state = optimizer_state_dict(*optimizer);
    ShardMarker marker{.rank = process_group_.rank(), .world_size = process_group_.world_size()};
    std::set<std::string> elementwise;
    for (const auto& entry : state.toGenericDict().at("state").toGenericDict())
      for (const auto& field : entry.value().toGenericDict())
        if (is_elementwise_state(field.key().toStringRef())) elementwise.insert(field.key().toStringRef());
    marker.elementwise.assign(elementwise.begin(), elementwise.end());
    for (const auto& index : ids_[k]) {
      marker.shapes.push_back(index ? std::optional(entries_[*index].shape) : std::nullopt);
      marker.pieces.push_back(index ? std::pair(entries_[*index].range.begin, entries_[*index].range.end)
                                    : std::pair<int64_t, int64_t>(0, 0));
    }
    out.push_back(mark_shard(state, marker));
  }
  return out;
}

std::optional<std::string> FlatParamEngine::name_of_piece(const torch::Tensor& piece) const {
  const auto found = piece_names_.find(piece.unsafeGetTensorImpl());
  if (found == piece_names_.end()) return std::nullopt;
  return found->second;
}

ParameterPieces FlatParamEngine::local_parameter_pieces() {
  ParameterPieces out;
  torch::NoGradGuard no_grad;
  for (size_t g = 1; g < groups_.size(); ++g) {
    Group& group = groups_[g];
    if (group.gathered && group.handed_out) {
      // Made whole for more than a forward (setup, a load): what was written into it is the newest.
      const int64_t chunk = group.layout->chunk();
      group.shard.copy_(group.full.narrow(0, process_group_.rank() * chunk, chunk));
    }
    for (const size_t i : group.entries) {
      const Entry& e = entries_[i];
      out.emplace(
          e.name,
          ParameterPiece{
              .values = e.piece.detach().clone(), .shape = e.shape, .begin = e.range.begin, .end = e.range.end});
    }
  }
  return out;
}

void FlatParamEngine::load_parameter_pieces(const ParameterPieces& pieces, const std::string& path) {
  // They must be this process's pieces of exactly the parameters laid out in units here.
  std::vector<std::string> problems;
  size_t expected = 0;
  for (size_t g = 1; g < groups_.size(); ++g) {
    for (const size_t i : groups_[g].entries) {
      const Entry& e = entries_[i];
      ++expected;
      const auto found = pieces.find(e.name);
      if (found == pieces.end()) {
        problems.push_back(fmt::format("'{}': no piece", e.name));
      } else if (found->second.shape != e.shape || found->second.begin != e.range.begin ||
                 found->second.end != e.range.end || found->second.values.scalar_type() != e.piece.scalar_type()) {
        problems.push_back(fmt::format(
            "'{}': elements [{}, {}) of {} {}, here [{}, {}) of {} {}", e.name, found->second.begin, found->second.end,
            c10::str(c10::IntArrayRef(found->second.shape)), c10::toString(found->second.values.scalar_type()),
            e.range.begin, e.range.end, c10::str(c10::IntArrayRef(e.shape)), c10::toString(e.piece.scalar_type())));
      }
    }
  }
  if (pieces.size() != expected || !problems.empty()) {
    std::vector<std::string> names;
    for (const auto& [name, piece] : pieces) names.push_back(name);
    throw CheckpointError(fmt::format(
        "checkpoint '{}' holds this process's pieces of the parameters [{}], which do not fit the units laid out "
        "here (rank {} of {}):\n  {}\nHINT: resume a sharded checkpoint with the module, units "
        "(sharding_strategy='full_shard', fsdp_min_unit_params) and processes that wrote it, or write it in one "
        "file first (volt::consolidate_sharded_checkpoint).",
        path, fmt::join(names, ", "), process_group_.rank(), process_group_.world_size(),
        problems.empty() ? std::string("other parameters than here") : fmt::format("{}", fmt::join(problems, "\n  "))));
  }
  torch::NoGradGuard no_grad;
  for (size_t g = 1; g < groups_.size(); ++g) {
    Group& group = groups_[g];
    for (const size_t i : group.entries) {
      Entry& e = entries_[i];
      e.piece.copy_(pieces.at(e.name).values.reshape({-1}));
    }
    // Whole since setup: every process gathers the loaded chunks, so the whole agrees with them.
    if (group.gathered) process_group_.all_gather_into(group.shard, group.full);
  }
}

void FlatParamEngine::load_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state) {
  const size_t k = optimizer_index(optimizer);
  const int64_t rank = process_group_.rank();
  const int64_t world_size = process_group_.world_size();
  if (auto [marker, own] = split_shard_marker(state); marker) {
    // A sharded checkpoint's piece: it must be this process's, of parameters laid out as here.
    const auto describe = [](const std::optional<std::vector<int64_t>>& shape) {
      return shape ? c10::str(c10::IntArrayRef(*shape)) : std::string("-");
    };
    std::vector<std::string> shapes, expected;
    for (const auto& shape : marker->shapes) shapes.push_back(describe(shape));
    std::vector<std::pair<int64_t, int64_t>> pieces;
    for (const auto& index : ids_[k]) {
      expected.push_back(describe(index ? std::optional(entries_[*index].shape) : std::nullopt));
      pieces.push_back(index ? std::pair(entries_[*index].range.begin, entries_[*index].range.end)
                             : std::pair<int64_t, int64_t>(0, 0));
    }
    if (!marker->pieces.empty() && marker->pieces != pieces && shapes == expected && marker->rank == rank &&
        marker->world_size == world_size) {
      throw CheckpointError(fmt::format(
          "optimizer {}'s sharded state was cut at other places than this run cuts it: the parameters were "
          "grouped differently (sharding_strategy full_shard lays out each volt::FsdpUnit on its own, "
          "shard_grad_op all parameters together, and fsdp_min_unit_params changes which units there are). "
          "HINT: resume with the sharding_strategy and fsdp_min_unit_params that wrote it, or consolidate it into "
          "one file (volt::consolidate_sharded_checkpoint) first.",
          k));
    }
    if (marker->rank != rank || marker->world_size != world_size || shapes != expected) {
      throw CheckpointError(fmt::format(
          "optimizer {}'s sharded state is rank {}'s of {} processes for parameters shaped [{}], but this is rank {} "
          "of {} with parameters shaped [{}]. HINT: resume a sharded checkpoint with the processes and module that "
          "wrote it, or consolidate it into one file (volt::consolidate_sharded_checkpoint) first.",
          k, marker->rank, marker->world_size, fmt::join(shapes, ", "), rank, world_size, fmt::join(expected, ", ")));
    }
    load_optimizer_state_dict(optimizer, own);
    return;
  }
  load_whole_optimizer_state(k, state);
}

void FlatParamEngine::load_whole_optimizer_state(size_t k, const c10::IValue& state) {
  std::vector<std::optional<ShardPiece>> pieces;
  std::vector<int64_t> numels;
  for (const auto& index : ids_[k]) {
    pieces.push_back(index ? std::optional<ShardPiece>(entries_[*index].range) : std::nullopt);
    numels.push_back(index ? c10::multiply_integers(entries_[*index].shape) : 0);
  }
  load_optimizer_state_dict(*optimizers_[k], shard_optimizer_state(state, pieces, numels));
}

}  // namespace volt
