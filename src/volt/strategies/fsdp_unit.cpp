#include "volt/strategies/fsdp_unit.h"

#include <ostream>

#include "volt/core/error.h"

namespace volt {

FsdpUnitImpl::FsdpUnitImpl(torch::nn::AnyModule module) : any_(std::move(module)) {
  VOLT_CHECK(!any_.is_empty(),
             "volt::FsdpUnit was given an empty module. HINT: wrap a module, e.g. "
             "volt::FsdpUnit(torch::nn::Linear(8, 4)).");
  inner_ = any_.ptr();
  adopt();
}

FsdpUnitImpl::FsdpUnitImpl(torch::nn::Sequential sequential) : sequential_(std::move(sequential)) {
  VOLT_CHECK(!sequential_.is_empty(),
             "volt::FsdpUnit was given an empty Sequential holder. HINT: wrap a "
             "module, e.g. volt::FsdpUnit(torch::nn::Sequential(...)).");
  inner_ = sequential_.ptr();
  adopt();
}

void FsdpUnitImpl::adopt() {
  // The wrapped module's own parts become the unit's under the same names: its parameters are
  // the same tensors, so the strategy's set_data on them is the module's, and a state dict reads
  // "block.weight" as it would without the unit.
  for (const auto& item : inner_->named_parameters(/*recurse=*/false)) {
    register_parameter(item.key(), item.value(), item.value().requires_grad());
  }
  for (const auto& item : inner_->named_buffers(/*recurse=*/false)) register_buffer(item.key(), item.value());
  for (const auto& item : inner_->named_children()) register_module(item.key(), item.value());
  torch::nn::Module::train(inner_->is_training());
}

torch::Tensor FsdpUnitImpl::forward(const torch::Tensor& x) { return call(x); }

int64_t FsdpUnitImpl::numel() const {
  int64_t total = 0;
  for (const torch::Tensor& p : parameters(/*recurse=*/true)) total += p.numel();
  return total;
}

void FsdpUnitImpl::train(bool on) {
  torch::nn::Module::train(on);
  inner_->train(on);
}

std::shared_ptr<torch::nn::Module> FsdpUnitImpl::clone(const c10::optional<torch::Device>& device) const {
  if (sequential_) {
    return std::make_shared<FsdpUnitImpl>(
        torch::nn::Sequential(std::dynamic_pointer_cast<torch::nn::SequentialImpl>(sequential_->clone(device))));
  }
  return std::make_shared<FsdpUnitImpl>(any_.clone(device));
}

std::vector<std::shared_ptr<FsdpUnitImpl>> find_fsdp_units(torch::nn::Module& module, int64_t min_params) {
  std::vector<std::shared_ptr<FsdpUnitImpl>> units;
  for (const auto& m : module.modules(/*include_self=*/false)) {
    if (auto unit = std::dynamic_pointer_cast<FsdpUnitImpl>(m); unit && unit->numel() >= min_params) {
      units.push_back(std::move(unit));
    }
  }
  return units;
}

void FsdpUnitImpl::pretty_print(std::ostream& stream) const {
  stream << "volt::FsdpUnit(";
  inner_->pretty_print(stream);
  stream << ")";
}

}  // namespace volt
