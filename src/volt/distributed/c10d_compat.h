// Where c10d's API differs between LibTorch 1.13 and 2.x: making a process group and a Reducer.
// Private to volt::distributed.
#pragma once

#include <memory>
#include <stdexcept>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "volt/base/torch_version.h"

namespace volt::compat {

/// LibTorch 2.6 removed ProcessGroup::Options: a ProcessGroup is made from (store, rank, size)
/// and its backends carry their own options.
#define VOLT_TORCH_PROCESS_GROUP_WITHOUT_OPTIONS VOLT_TORCH_AT_LEAST(2, 6)

/// A c10d process group over `store`: Gloo for CPU tensors and, with `nccl` (a ProcessGroupNCCL
/// made over PrefixStore("cuda/", store); CUDA builds of LibTorch 2.x), NCCL for CUDA tensors, so that the metric
/// reductions on CPU scalars and the gradient buckets on the GPU each go to their own backend (torch.distributed's
/// "cpu:gloo,cuda:nccl"). Each backend rendezvouses under its own key prefix, as
/// torch.distributed does. LibTorch 1.x: ProcessGroupGloo is itself a ProcessGroup, and NCCL is
/// not offered (std::invalid_argument).
template <typename NcclPtr = std::nullptr_t>
c10::intrusive_ptr<c10d::ProcessGroup> make_process_group(
    const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
    const c10::intrusive_ptr<c10d::ProcessGroupGloo::Options>& gloo_options, NcclPtr nccl = nullptr) {
  constexpr bool with_nccl = !std::is_same_v<NcclPtr, std::nullptr_t>;
#if VOLT_TORCH_2
  auto gloo_store = c10::make_intrusive<c10d::PrefixStore>("cpu/", store);
  auto gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(gloo_store, rank, size, gloo_options);
#if VOLT_TORCH_PROCESS_GROUP_WITHOUT_OPTIONS
  auto group = c10::make_intrusive<c10d::ProcessGroup>(store, rank, size);
#else
  auto group = c10::make_intrusive<c10d::ProcessGroup>(
      store, rank, size,
      c10::make_intrusive<c10d::ProcessGroup::Options>(with_nccl ? "nccl" : "gloo", gloo_options->timeout));
#endif
  group->setBackend(c10::DeviceType::CPU, c10d::ProcessGroup::BackendType::GLOO, gloo);
  group->setDefaultBackend(c10d::ProcessGroup::BackendType::GLOO);
  if constexpr (with_nccl) {
    group->setBackend(c10::DeviceType::CUDA, c10d::ProcessGroup::BackendType::NCCL, nccl);
    group->setDefaultBackend(c10d::ProcessGroup::BackendType::NCCL);
  }
  return group;
#else
  if constexpr (with_nccl) {
    throw std::invalid_argument("Volt's NCCL process group needs LibTorch 2.x");
  }
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, size, gloo_options);
#endif
}

/// c10d's Reducer (PyTorch DDP's gradient engine) over `params` with a fixed bucket layout, made
/// with whichever constructor this LibTorch has: 1.13 takes the per-bucket size limits after the
/// buckets; 2.x dropped them and added flags after first_bucket_bytes_cap, all of which Volt
/// leaves at PyTorch DDP's defaults (no Python reducer, unused parameters reduced, no
/// per-bucket caps since Volt never rebuilds buckets). `ReducerT` is c10d::Reducer or a subclass
/// that inherits its constructors; its header (reducer.hpp) is included by the caller only.
template <typename ReducerT>
std::shared_ptr<ReducerT> make_reducer(std::vector<at::Tensor> params, std::vector<std::vector<size_t>> buckets,
                                       std::vector<size_t> limits, c10::intrusive_ptr<c10d::ProcessGroup> group,
                                       std::vector<bool> sparse, int64_t cap, bool find_unused,
                                       std::unordered_map<size_t, std::string> names, int64_t first_cap) {
  using Tensors = std::vector<at::Tensor>;
  using Buckets = std::vector<std::vector<size_t>>;
  using Group = c10::intrusive_ptr<c10d::ProcessGroup>;
  using Names = std::unordered_map<size_t, std::string>;
  constexpr bool as_view = false;
  if constexpr (std::is_constructible_v<ReducerT, Tensors, Buckets, std::vector<size_t>, Group, std::vector<bool>,
                                        int64_t, bool, bool, Names, int64_t>) {
    return std::make_shared<ReducerT>(std::move(params), std::move(buckets), std::move(limits), std::move(group),
                                      std::move(sparse), cap, find_unused, as_view, std::move(names), first_cap);
  } else if constexpr (std::is_constructible_v<ReducerT, Tensors, Buckets, Group, std::vector<bool>, int64_t, bool,
                                               bool, Names, int64_t, bool, bool, std::vector<int64_t>>) {
    return std::make_shared<ReducerT>(std::move(params), std::move(buckets), std::move(group), std::move(sparse), cap,
                                      find_unused, as_view, std::move(names), first_cap,
                                      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false,
                                      /*bucket_bytes_cap_list=*/std::vector<int64_t>{});
  } else if constexpr (std::is_constructible_v<ReducerT, Tensors, Buckets, std::vector<size_t>, Group,
                                               std::vector<bool>, int64_t, bool, bool, Names, int64_t, bool, bool>) {
    return std::make_shared<ReducerT>(std::move(params), std::move(buckets), std::move(limits), std::move(group),
                                      std::move(sparse), cap, find_unused, as_view, std::move(names), first_cap,
                                      /*skip_all_reduce_unused_params=*/false, /*use_python_reducer=*/false);
  } else {
    static_assert(sizeof(ReducerT) == 0, "c10d::Reducer has a constructor Volt does not know: extend make_reducer");
    return nullptr;
  }
}

}  // namespace volt::compat
