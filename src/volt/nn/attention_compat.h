// Where LibTorch's attention differs between versions: 2.0 added the fused
// at::scaled_dot_product_attention (flash / memory-efficient kernels on CUDA, a fused CPU kernel);
// 1.13 has only a private, experimental one. Private to volt::nn (and its tests).
#pragma once

#include <ATen/ATen.h>

#include <optional>

#include "volt/base/torch_version.h"

namespace volt::compat {

/// Whether this LibTorch has a fused scaled-dot-product attention that Volt calls.
inline constexpr bool kFusedAttention = VOLT_TORCH_2;

/// LibTorch's fused attention of `query`, `key`, `value` ([..., seq, head_dim]) with the scale
/// 1/sqrt(head_dim), or none on a LibTorch without one (the caller computes the plain formula).
inline std::optional<at::Tensor> fused_attention(const at::Tensor& query, const at::Tensor& key,
                                                 const at::Tensor& value, double dropout_p, bool causal) {
#if VOLT_TORCH_2
  return at::scaled_dot_product_attention(query, key, value, /*attn_mask=*/{}, dropout_p, causal);
#else
  return std::nullopt;
#endif
}

}  // namespace volt::compat
