#include "volt/nn/attention.h"

#include <torch/torch.h>

#include <cmath>
#include <limits>
#include <optional>

#include "volt/core/error.h"
#include "volt/nn/attention_compat.h"

namespace volt {
namespace {

// The shapes a user can get wrong; LibTorch's own messages would name a matmul, not the call.
void check_shapes(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, double dropout_p) {
  VOLT_CHECK(q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim(),
             "scaled_dot_product_attention: query, key and value must have the same number of dimensions, at least 2 "
             "([..., seq, head_dim]), but they have {}, {} and {}. HINT: split the heads first: [batch, heads, seq, "
             "head_dim].",
             q.dim(), k.dim(), v.dim());
  VOLT_CHECK(q.size(-1) == k.size(-1),
             "scaled_dot_product_attention: query's head_dim {} differs from key's {} (query {}, key {}). HINT: both "
             "must be [..., seq, head_dim] with the same head_dim.",
             q.size(-1), k.size(-1), c10::str(q.sizes()), c10::str(k.sizes()));
  VOLT_CHECK(k.size(-2) == v.size(-2),
             "scaled_dot_product_attention: key has {} positions but value has {} (key {}, value {}). HINT: key and "
             "value come from the same sequence.",
             k.size(-2), v.size(-2), c10::str(k.sizes()), c10::str(v.sizes()));
  VOLT_CHECK(q.sizes().slice(0, q.dim() - 2) == k.sizes().slice(0, k.dim() - 2) &&
                 k.sizes().slice(0, k.dim() - 2) == v.sizes().slice(0, v.dim() - 2),
             "scaled_dot_product_attention: the leading (batch, head) dimensions differ: query {}, key {}, value {}. "
             "HINT: they must agree in all but the last two dimensions.",
             c10::str(q.sizes()), c10::str(k.sizes()), c10::str(v.sizes()));
  VOLT_CHECK(dropout_p >= 0 && dropout_p < 1,
             "scaled_dot_product_attention: dropout_p={} must be in [0, 1). HINT: "
             "pass 0 in evaluation.",
             dropout_p);
}

// The formula, in the inputs' dtype (PyTorch's math path). The causal mask is added as a matrix
// of 0 and -inf, as the math path adds a boolean mask converted to that form.
torch::Tensor plain_attention(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, bool causal,
                              double dropout_p) {
  torch::Tensor scores = torch::matmul(q, k.transpose(-2, -1)) * (1.0 / std::sqrt(static_cast<double>(q.size(-1))));
  if (causal) {
    const torch::Tensor mask =
        torch::full({q.size(-2), k.size(-2)}, -std::numeric_limits<double>::infinity(), scores.options()).triu(1);
    scores = scores + mask;
  }
  torch::Tensor weights = torch::softmax(scores, -1);
  if (dropout_p > 0) weights = torch::dropout(weights, dropout_p, /*train=*/true);
  return torch::matmul(weights, v);
}

}  // namespace

torch::Tensor scaled_dot_product_attention(const torch::Tensor& query, const torch::Tensor& key,
                                           const torch::Tensor& value, bool causal, double dropout_p) {
  check_shapes(query, key, value, dropout_p);
  if (std::optional<torch::Tensor> fused = compat::fused_attention(query, key, value, dropout_p, causal)) {
    return *fused;
  }
  return plain_attention(query, key, value, causal, dropout_p);
}

}  // namespace volt
