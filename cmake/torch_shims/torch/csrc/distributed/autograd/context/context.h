// Shim for a header Debian's libtorch-dev 1.13 leaves out.
//
// c10d's reducer.hpp includes this header only for two names: the type of the RPC autograd
// context pointer it stores (a std::shared_ptr, whose layout does not depend on the pointee) and
// the gradient callback type it static_asserts against. Volt never uses distributed autograd,
// so declaring those two names is enough to use c10d::Reducer, the engine of PyTorch's DDP.
// CMake adds this directory only when the real header is missing (upstream LibTorch ships it).
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <memory>

namespace torch::distributed::autograd {

class DistAutogradContext {
 public:
  using GradCallback = std::function<bool(at::Tensor&)>;
};

using ContextPtr = std::shared_ptr<DistAutogradContext>;

}  // namespace torch::distributed::autograd
