#include "volt/data/batch.h"

#include <torch/torch.h>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt {

namespace {

template <typename Map>
std::string names_of(const Map& map) {
  std::vector<std::string> names;
  for (const auto& [name, value] : map) names.push_back("'" + name + "'");
  return names.empty() ? "none" : join(names, ", ");
}

/// Stacks one field of every example; `get` picks it out of an example.
torch::Tensor stack_field(const std::vector<Example>& examples, const std::string& field,
                          const std::function<const torch::Tensor*(const Example&)>& get) {
  const torch::Tensor* first = get(examples.front());
  std::vector<torch::Tensor> parts;
  parts.reserve(examples.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    const torch::Tensor* t = get(examples[i]);
    const bool defined = t != nullptr && t->defined();
    VOLT_CHECK(defined == (first != nullptr && first->defined()),
               "default_collate: example 0 {} '{}' but example {} {}. HINT: give every example the same fields.",
               first != nullptr && first->defined() ? "has" : "lacks", field, i, defined ? "has it" : "does not");
    if (!defined) return {};
    VOLT_CHECK(t->sizes() == first->sizes(),
               "default_collate cannot stack '{}': example 0 has shape {} but example {} has {}. HINT: put tensors "
               "whose size varies in Example::lists (the batch gets one per example), or set "
               "DataLoaderOptions::collate to a function that pads them.",
               field, c10::str(first->sizes()), i, c10::str(t->sizes()));
    parts.push_back(*t);
  }
  return torch::stack(parts);
}

}  // namespace

const torch::Tensor& Batch::at(const std::string& name) const {
  const auto it = tensors.find(name);
  VOLT_CHECK(it != tensors.end(),
             "the batch has no tensor '{}'; its named tensors are {}. HINT: check the name the "
             "dataset or collate function gives it.",
             name, names_of(tensors));
  return it->second;
}

const std::vector<torch::Tensor>& Batch::list(const std::string& name) const {
  const auto it = lists.find(name);
  VOLT_CHECK(it != lists.end(),
             "the batch has no list '{}'; its lists are {}. HINT: check the name the dataset or "
             "collate function gives it.",
             name, names_of(lists));
  return it->second;
}

int64_t Batch::size() const {
  for (const torch::Tensor* t : {&data, &target})
    if (t->defined() && t->dim() > 0) return t->size(0);
  for (const auto& [name, t] : tensors)
    if (t.defined() && t.dim() > 0) return t.size(0);
  for (const auto& [name, items] : lists) return static_cast<int64_t>(items.size());
  return 1;
}

Batch Batch::map(const std::function<torch::Tensor(const torch::Tensor&)>& fn) const {
  Batch out;
  if (data.defined()) out.data = fn(data);
  if (target.defined()) out.target = fn(target);
  for (const auto& [name, t] : tensors) out.tensors[name] = t.defined() ? fn(t) : t;
  for (const auto& [name, items] : lists) {
    std::vector<torch::Tensor>& mapped = out.lists[name];
    mapped.reserve(items.size());
    for (const torch::Tensor& t : items) mapped.push_back(t.defined() ? fn(t) : t);
  }
  return out;
}

Batch Batch::slice(int64_t start, int64_t length) const {
  Batch out;
  const auto cut = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(0, start, length) : t; };
  out.data = cut(data);
  out.target = cut(target);
  for (const auto& [name, t] : tensors) out.tensors[name] = cut(t);
  for (const auto& [name, items] : lists)
    out.lists[name] = std::vector<torch::Tensor>(items.begin() + start, items.begin() + start + length);
  return out;
}

void Batch::check_sizes(const std::string& who) const {
  const int64_t n = size();
  const auto check = [&](const torch::Tensor& t, const std::string& name) {
    if (!t.defined()) return;
    VOLT_CHECK(t.dim() >= 1 && t.size(0) == n,
               "{} splits every tensor of a batch along dimension 0, but '{}' has shape {} while the batch has {} "
               "examples. HINT: put the batch dimension first in every tensor, or keep per-batch values out of "
               "the batch.",
               who, name, c10::str(t.sizes()), n);
  };
  check(data, "data");
  check(target, "target");
  for (const auto& [name, t] : tensors) check(t, name);
  for (const auto& [name, items] : lists) {
    VOLT_CHECK(static_cast<int64_t>(items.size()) == n,
               "{} splits the batch's lists with its examples, but list '{}' has {} entries while the batch has {} "
               "examples. HINT: give each list one tensor per example.",
               who, name, items.size(), n);
  }
}

Batch default_collate(std::vector<Example> examples) {
  VOLT_CHECK(!examples.empty(), "default_collate got no examples. HINT: a batch needs at least one example.");
  Batch batch;
  batch.data = stack_field(examples, "data", [](const Example& e) { return &e.data; });
  batch.target = stack_field(examples, "target", [](const Example& e) { return &e.target; });
  const Example& first = examples.front();
  for (size_t i = 1; i < examples.size(); ++i) {
    VOLT_CHECK(examples[i].tensors.size() == first.tensors.size() && examples[i].lists.size() == first.lists.size(),
               "default_collate: example 0 has tensors {} and lists {}, but example {} has tensors {} and lists {}. "
               "HINT: give every example the same fields.",
               names_of(first.tensors), names_of(first.lists), i, names_of(examples[i].tensors),
               names_of(examples[i].lists));
  }
  for (const auto& [name, t] : first.tensors) {
    batch.tensors[name] = stack_field(examples, name, [&name = name](const Example& e) {
      const auto it = e.tensors.find(name);
      return it == e.tensors.end() ? nullptr : &it->second;
    });
  }
  for (const auto& [name, t] : first.lists) {
    std::vector<torch::Tensor>& items = batch.lists[name];
    for (size_t i = 0; i < examples.size(); ++i) {
      const auto it = examples[i].lists.find(name);
      VOLT_CHECK(it != examples[i].lists.end(),
                 "default_collate: example 0 has list '{}' but example {} does not. HINT: give every example the "
                 "same fields.",
                 name, i);
      items.push_back(std::move(it->second));
    }
  }
  return batch;
}

}  // namespace volt
