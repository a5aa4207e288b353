#include "volt/base/collectives.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <utility>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {
namespace {

// The most dimensions a gathered tensor may have: the shapes travel in one fixed-size tensor.
constexpr int64_t kMaxGatherDims = 8;

std::string describe(const torch::Tensor& descriptor) {
  const auto* d = descriptor.data_ptr<int64_t>();
  std::vector<std::string> sizes;
  for (int64_t i = 0; i < d[0]; ++i) sizes.push_back(std::to_string(d[2 + i]));
  return fmt::format("[{}] {}", join(sizes, ", "), c10::toString(static_cast<c10::ScalarType>(d[1])));
}

}  // namespace

ReduceWork::ReduceWork(double value) : value_(value) {}

ReduceWork::ReduceWork(std::function<double()> wait) : wait_(std::move(wait)) {}

double ReduceWork::wait() {
  if (wait_) {
    value_ = wait_();
    wait_ = nullptr;
  }
  return value_;
}

double Collectives::all_reduce(double value, Reduce op) {
  torch::Tensor t = torch::tensor({value}, torch::kDouble);
  all_reduce(t, op);
  return t.item<double>();
}

ReduceWork Collectives::all_reduce_async(double value, Reduce op) { return ReduceWork(all_reduce(value, op)); }

void Collectives::barrier() { all_reduce(0.0, Reduce::kSum); }

std::unique_ptr<PeerChannel> Collectives::connect_peer(int64_t peer) { return nullptr; }

std::vector<std::string> Collectives::all_gather_bytes(const std::string& bytes) {
  torch::Tensor mine = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kUInt8);
  if (!bytes.empty()) std::memcpy(mine.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  std::vector<std::string> out;
  for (const torch::Tensor& each : all_gather(mine)) {
    const torch::Tensor bytes_of_rank = each.cpu().contiguous();
    out.emplace_back(reinterpret_cast<const char*>(bytes_of_rank.data_ptr<uint8_t>()),
                     static_cast<size_t>(bytes_of_rank.numel()));
  }
  return out;
}

std::string Collectives::broadcast_string(const std::string& value) {
  if (world_size() == 1) return value;
  return all_gather_bytes(rank() == 0 ? value : std::string()).at(0);
}

Collectives& local_collectives() {
  static LocalCollectives local;
  return local;
}

std::vector<torch::Tensor> all_gather_uneven(
    const torch::Tensor& tensor, const std::function<std::vector<torch::Tensor>(const torch::Tensor&)>& gather_equal) {
  VOLT_CHECK(tensor.dim() <= kMaxGatherDims,
             "all_gather was given a tensor of {} dimensions; at most {} are supported. HINT: reshape it (e.g. "
             "flatten the trailing dimensions) before gathering.",
             tensor.dim(), kMaxGatherDims);
  // [dims, dtype, sizes...]: one fixed-size message per rank, so every rank learns every shape.
  torch::Tensor descriptor = torch::full({2 + kMaxGatherDims}, -1, torch::kLong);
  auto* d = descriptor.data_ptr<int64_t>();
  d[0] = tensor.dim();
  d[1] = static_cast<int64_t>(tensor.scalar_type());
  for (int64_t i = 0; i < tensor.dim(); ++i) d[2 + i] = tensor.size(i);
  std::vector<torch::Tensor> shapes = gather_equal(descriptor.to(tensor.device()));
  for (auto& shape : shapes) shape = shape.cpu();

  bool agree = true;
  int64_t longest = 0;
  for (const auto& shape : shapes) {
    const auto* s = shape.data_ptr<int64_t>();
    agree = agree && s[0] == d[0] && s[1] == d[1] && std::equal(s + 3, s + 2 + kMaxGatherDims, d + 3);
    if (s[0] > 0) longest = std::max(longest, s[2]);
  }
  if (!agree) {
    std::vector<std::string> each;
    for (size_t r = 0; r < shapes.size(); ++r) each.push_back(fmt::format("rank {} {}", r, describe(shapes[r])));
    throw Error(fmt::format(
        "all_gather was given tensors that differ beyond their first dimension: {}. HINT: only the first "
        "dimension (the number of rows) may differ between processes; give every process the same dtype and "
        "the same trailing dimensions.",
        join(each, ", ")));
  }
  if (tensor.dim() == 0) return gather_equal(tensor.contiguous());

  std::vector<int64_t> padded_shape = tensor.sizes().vec();
  padded_shape[0] = longest;
  torch::Tensor padded = torch::zeros(padded_shape, tensor.options());
  // Every rank's tensor is empty (each knows every shape): Gloo's allgather divides by the
  // message size, so an empty one would kill the process with SIGFPE.
  if (padded.numel() == 0) return std::vector<torch::Tensor>(shapes.size(), padded);
  padded.narrow(0, 0, tensor.size(0)).copy_(tensor);
  std::vector<torch::Tensor> gathered = gather_equal(padded);
  for (size_t r = 0; r < gathered.size(); ++r) {
    gathered[r] = gathered[r].narrow(0, 0, shapes[r].data_ptr<int64_t>()[2]);
  }
  return gathered;
}

}  // namespace volt
