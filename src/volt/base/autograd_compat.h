// Where autograd's graph API differs between LibTorch 1.13 and 2.x (dp's and the pipeline's graph nodes).
#pragma once

#include <torch/csrc/autograd/edge.h>

#include <memory>
#include <type_traits>
#include <utility>

namespace volt::compat {

/// A new autograd graph node of type `NodeT`, held as this LibTorch's graph holds its nodes:
/// std::shared_ptr in 1.x, c10::intrusive_ptr in recent 2.x.
template <typename NodeT, typename... Args>
auto make_autograd_node(Args&&... args) {
  using NodePtr = decltype(torch::autograd::Edge::function);
  if constexpr (std::is_same_v<NodePtr, std::shared_ptr<torch::autograd::Node>>) {
    return std::make_shared<NodeT>(std::forward<Args>(args)...);
  } else {
    return c10::make_intrusive<NodeT>(std::forward<Args>(args)...);
  }
}

}  // namespace volt::compat
