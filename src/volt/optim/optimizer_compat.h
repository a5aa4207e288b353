// Where LibTorch's optimizer state differs between 1.13 and 2.x: the key of a parameter's state.
// Private to volt::optim (and its tests).
#pragma once

#include <torch/optim/optimizer.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace volt::compat {

/// The key type of Optimizer::state(): the parameter's TensorImpl address as a string in 1.x,
/// the address itself in recent 2.x.
using OptimizerStateKey = typename std::decay_t<decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;

/// The key LibTorch's optimizers file `param`'s state under in Optimizer::state(). (A template
/// only so that the branch for the other LibTorch is discarded, not compiled.)
template <typename Key = OptimizerStateKey>
Key optimizer_state_key(const at::Tensor& param) {
  void* address = param.unsafeGetTensorImpl();
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;  // what 1.x's c10::guts::to_string writes
    out << address;
    return out.str();
  } else {
    return address;
  }
}

}  // namespace volt::compat
