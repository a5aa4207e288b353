// Scaled dot-product attention, one function for every LibTorch Volt builds against: the fused
// kernel where LibTorch has one (2.x), the plain formula elsewhere (1.13), so a model calls one
// function and gets the fast path wherever it exists.
#pragma once

#include <torch/types.h>

namespace volt {

/// softmax(query keyᵀ / sqrt(head_dim) + mask) value, PyTorch's
/// torch.nn.functional.scaled_dot_product_attention without an explicit mask: what a
/// transformer's attention layer computes once it has split its heads.
///
/// `query` is [..., q_len, head_dim], `key` [..., k_len, head_dim] and `value` [..., k_len,
/// v_dim], usually [batch, heads, seq, head_dim]; the leading dimensions must agree. The result is
/// [..., q_len, v_dim], in the inputs' dtype. With `causal`, position i attends only to positions
/// j <= i (the mask is aligned at the top left, as PyTorch's is_causal: for self-attention, where
/// q_len == k_len). `dropout_p` drops attention weights with that probability (scaling the rest by
/// 1/(1 - p)), drawn from the default generator: pass 0 in evaluation, as PyTorch's callers do.
///
/// On LibTorch 2.x this is at::scaled_dot_product_attention (flash or memory-efficient kernels on
/// CUDA, a fused kernel on CPU); on 1.13 the plain formula in the inputs' dtype, as PyTorch's math
/// path computes it. The two agree to rounding. Throws volt::Error for shapes that do not fit.
///
/// Example (a causal self-attention layer's core):
/// ```
/// torch::Tensor y = volt::scaled_dot_product_attention(q, k, v, /*causal=*/true, is_training() ? 0.1 : 0.0);
/// ```
torch::Tensor scaled_dot_product_attention(const torch::Tensor& query, const torch::Tensor& key,
                                           const torch::Tensor& value, bool causal, double dropout_p = 0.0);

}  // namespace volt
