// fsdp's engine (PyTorch FSDP's flat parameters, ZeRO's partitions): the trained parameters laid
// out in flat buffers split evenly over the processes, and the collectives that move them
// (all-gather of parameters, reduce-scatter of gradients, the optimizers' state gathered or cut).
// It decides nothing: FsdpStrategy's policy says which parameters form a group (its units) and when
// a group is gathered, reduced or freed, as DDP's policy drives c10d's Reducer.
#pragma once

#include <ATen/core/ivalue.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "volt/checkpoint/sharded_checkpoint.h"
#include "volt/strategies/fsdp_unit.h"
#include "volt/strategies/shard_layout.h"

namespace torch::nn {
class Module;
}  // namespace torch::nn
namespace torch::optim {
class Optimizer;
}  // namespace torch::optim

namespace volt {

class ProcessGroup;

/// The flat-parameter engine that FsdpStrategy drives: groups of parameters, each moved into one
/// flat buffer (every parameter a view of its place) cut into a chunk per process, with each
/// optimizer holding only this process's pieces of its parameters.
///
/// Group 0 holds the trained parameters outside every unit: whole on every process, gradients
/// reduce-scattered into the pieces after backward (reduce_root_gradients) and the updated chunks
/// all-gathered after the step (gather_root). Each unit with a trained parameter gets a group of its
/// own (groups 1..group_count()-1, in the order lay_out gives): between gathers its parameters are
/// empty tensors and this process keeps only its chunk (gather_unit / release_unit /
/// reduce_unit). Every method that communicates is a collective: every process calls it in the
/// same order.
class FlatParamEngine {
 public:
  /// An engine whose collectives run over `group` (borrowed: it outlives the engine). Nothing is
  /// laid out until lay_out.
  explicit FlatParamEngine(ProcessGroup& group);

  // ---- layout -------------------------------------------------------------------------------
  /// Lays out the parameters of `module` that the `optimizers` hold and that require grad, and
  /// replaces each optimizer's parameters by this process's pieces of them. Each parameter goes to
  /// the last of `units` that holds it (innermost, when units are given outermost first), the rest
  /// to group 0; a unit gets a group with its first trained parameter, so groups follow the
  /// optimizers' order. Every group is whole afterwards, until release_unit. Throws volt::Error
  /// for an optimizer whose state is not element by element, a tensor that is not a parameter of
  /// `module`, a parameter in two optimizers, trained parameters of mixed dtypes or devices, or none.
  void lay_out(const torch::nn::Module& module, const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers,
               const std::vector<std::shared_ptr<FsdpUnitImpl>>& units);
  /// Lays out the parameters that train now, keeping the optimizers' state: every process gathers
  /// the whole state, the units are made whole and the optimizers get the whole parameters back,
  /// lay_out runs again over the units `find_units` returns then (called with every unit whole, so a
  /// policy that chooses units by their size sees it), and the state is cut anew, as if the run had
  /// resumed from a full checkpoint. A collective.
  void relayout(const torch::nn::Module& module,
                const std::function<std::vector<std::shared_ptr<FsdpUnitImpl>>()>& find_units);
  /// Whether the layout covers every parameter the optimizers hold (no param group added since).
  bool covers_optimizers() const;
  /// The names of the module's parameters that required grad at the last lay_out.
  const std::vector<std::string>& trainable() const { return trainable_; }
  /// The optimizers laid out.
  const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers() const { return optimizers_; }
  /// Group 0 plus one per unit laid out.
  size_t group_count() const { return groups_.size(); }
  /// The unit of group `g` (null for group 0).
  const std::shared_ptr<FsdpUnitImpl>& unit(size_t g) const { return groups_.at(g).unit; }
  /// The module's parameters in group `g`, in layout order (each a view of the group's buffer while
  /// gathered).
  std::vector<torch::Tensor> parameters(size_t g) const;
  /// Whether some trained parameters live in units (in pieces between gathers).
  bool shards_parameters() const { return groups_.size() > 1; }

  // ---- a training step -----------------------------------------------------------------------
  /// Before a backward: group 0's gradients become views of one flat buffer, so backward
  /// accumulates into it in place (kept while accumulating, until reduce_root_gradients).
  void begin_backward();
  /// Reduce-scatters the average of group 0's whole gradients into this process's pieces and frees
  /// the whole ones (the module's .grad are undefined after).
  void reduce_root_gradients();
  /// All-gathers the chunks of group 0 (updated in place by the optimizers' step) into the module's
  /// parameters, so every process holds the whole again.
  void gather_root();
  /// Makes unit group `g`'s parameters whole (an all-gather of the chunks); nothing when they are.
  void gather_unit(size_t g);
  /// Frees unit group `g`'s whole parameters, first keeping this process's chunk of them when they
  /// were handed out (what a checkpoint loaded while they were whole is kept); nothing when freed.
  void release_unit(size_t g);
  /// Reduce-scatters unit group `g`'s gradients (a missing one counts as zeros) into its pieces'
  /// gradients, adding to what they hold, and frees the whole gradients. Does not free the unit.
  void reduce_unit(size_t g);
  /// Makes every unit whole and marks it handed out (a checkpoint reads it, a load writes it, the
  /// module is the user's), until release_unit.
  void gather_units();
  /// release_unit of every unit.
  void release_units();

  // ---- checkpoints ---------------------------------------------------------------------------
  /// Each optimizer's whole state (its pieces all-gathered), in the layout one process holds, on
  /// every process when `everyone`, else on global rank 0 (the others get none). A collective.
  std::vector<c10::IValue> whole_optimizer_states(bool everyone);
  /// Each of `optimizers`' pieces, marked with this process and the parameters' shapes and ranges.
  std::vector<c10::IValue> local_optimizer_states(
      const std::vector<std::shared_ptr<torch::optim::Optimizer>>& optimizers) const;
  /// Each unit parameter's piece in this process's chunk (copies, so the next step does not change
  /// what is being saved).
  ParameterPieces local_parameter_pieces();
  /// The module's name of the parameter whose piece (what the optimizer holds) `piece` is;
  /// nullopt for any other tensor.
  std::optional<std::string> name_of_piece(const torch::Tensor& piece) const;
  /// Writes `pieces` (of checkpoint `path`) straight into the units' chunks; units that are whole
  /// now are gathered again from them (a collective). Throws volt::CheckpointError with a HINT when
  /// they are not this process's pieces of the parameters laid out here.
  void load_parameter_pieces(const ParameterPieces& pieces, const std::string& path);
  /// Loads `state` into `optimizer` (one laid out): a whole state cut to this process's pieces, or
  /// a sharded checkpoint's piece as it is, after checking it is this process's of parameters
  /// shaped and cut as here (volt::CheckpointError otherwise).
  void load_optimizer_state(torch::optim::Optimizer& optimizer, const c10::IValue& state);

 private:
  /// One optimized parameter: the module's tensor and this process's piece of it.
  struct Entry {
    std::string name;
    torch::Tensor param;
    torch::Tensor piece;
    /// The piece's place in its group's layout.
    ShardPiece range;
    /// Its group: 0 for the parameters outside every unit, else 1 + the unit's index.
    size_t group = 0;
    /// Its place in the group's layout (the index into Group::entries).
    size_t slot = 0;
    /// The parameter's shape (a unit's parameter is empty between gathers).
    std::vector<int64_t> shape;
  };
  /// Parameters laid out together: the model's outside every unit (group 0, whole on every
  /// process) or one unit's (whole only while gathered).
  struct Group {
    /// The unit; null for group 0.
    std::shared_ptr<FsdpUnitImpl> unit;
    /// Indexes into entries_.
    std::vector<size_t> entries;
    std::optional<ShardLayout> layout;
    /// The padded whole, each parameter a view of its place while gathered. A unit's keeps its
    /// storage object (autograd's saved views of the parameters point into it) but holds memory
    /// only while gathered.
    torch::Tensor full;
    /// A unit's chunk, owned (the pieces view it); group 0's chunk is a view of `full`.
    torch::Tensor shard;
    /// Each entry's view of `full`, shaped like its parameter (units).
    std::vector<torch::Tensor> views;
    /// Whether `full` holds the whole parameters now.
    bool gathered = true;
    /// Whether the whole was handed out for more than a forward or backward (after setup, for a
    /// checkpoint, a load or the end of fit), so that what was written into it must go back to the
    /// chunk when it is freed.
    bool handed_out = true;
  };
  /// The index of `optimizer` in optimizers_ (an internal error when it was not laid out).
  size_t optimizer_index(const torch::optim::Optimizer& optimizer) const;
  /// Loads optimizer `k`'s whole `state` cut to this process's pieces.
  void load_whole_optimizer_state(size_t k, const c10::IValue& state);
  /// Adds `mine` (this process's reduced chunk of `group`'s gradients) to its pieces' gradients.
  void add_to_pieces(const torch::Tensor& mine, const Group& group);

  ProcessGroup& process_group_;
  std::vector<Entry> entries_;
  /// Group 0 (outside every unit), then the units in the order lay_out met them.
  std::vector<Group> groups_;
  /// Between begin_backward and reduce_root_gradients: the whole gradients, each module
  /// parameter's .grad a view of its place; undefined between steps.
  torch::Tensor grads_flat_;
  std::vector<std::shared_ptr<torch::optim::Optimizer>> optimizers_;
  /// For each optimizer, its parameter numbers (across groups) -> index into entries_ (nullopt:
  /// a parameter that does not train, kept whole).
  std::vector<std::vector<std::optional<size_t>>> ids_;
  /// The names of the parameters that required grad at the last lay_out.
  std::vector<std::string> trainable_;
  /// The module's name of each piece handed to the optimizers at the last lay_out (name_of_piece,
  /// asked once per parameter at every checkpoint: a lookup, not a search).
  std::unordered_map<const c10::TensorImpl*, std::string> piece_names_;
};

}  // namespace volt
