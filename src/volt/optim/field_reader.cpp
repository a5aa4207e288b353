#include "volt/optim/field_reader.h"

#include <ATen/core/jit_type.h>
#include <fmt/format.h>

#include <cmath>
#include <utility>

#include "volt/core/strings.h"

namespace volt::internal {

FieldReader::FieldReader(c10::impl::GenericDict dict, std::string where, Problems& problems)
    : dict_(std::move(dict)), where_(std::move(where)), problems_(&problems) {}

std::string FieldReader::name(const char* key) const { return fmt::format("{}['{}']", where_, key); }

void FieldReader::problem(const std::string& message) { problems_->push_back(message); }

void FieldReader::wrong_type(const char* key, const c10::IValue& value, const char* expected) {
  problem(fmt::format("{} is a {}; expected {}", name(key), value.tagKind(), expected));
}

bool FieldReader::has(const char* key) const {
  const auto it = dict_.find(c10::IValue(std::string(key)));
  return it != dict_.end() && !it->value().isNone();
}

std::optional<c10::IValue> FieldReader::get(const char* key) {
  const auto it = dict_.find(c10::IValue(std::string(key)));
  if (it == dict_.end()) {
    problem(fmt::format("{} is missing", name(key)));
    return std::nullopt;
  }
  return it->value();
}

std::optional<c10::IValue> FieldReader::value(const char* key) { return get(key); }

std::optional<double> FieldReader::number(const char* key) {
  const auto value = get(key);
  if (!value) return std::nullopt;
  if (value->isDouble()) return value->toDouble();
  if (value->isInt()) return static_cast<double>(value->toInt());
  wrong_type(key, *value, "a number");
  return std::nullopt;
}

std::optional<int64_t> FieldReader::integer(const char* key) {
  const auto value = get(key);
  if (!value) return std::nullopt;
  if (value->isInt()) return value->toInt();
  wrong_type(key, *value, "an int");
  return std::nullopt;
}

std::optional<bool> FieldReader::flag(const char* key) {
  const auto value = get(key);
  if (!value) return std::nullopt;
  if (value->isBool()) return value->toBool();
  wrong_type(key, *value, "a bool");
  return std::nullopt;
}

std::optional<std::string> FieldReader::string(const char* key) {
  const auto value = get(key);
  if (!value) return std::nullopt;
  if (value->isString()) return value->toStringRef();
  wrong_type(key, *value, "a string");
  return std::nullopt;
}

std::optional<c10::impl::GenericDict> FieldReader::dict(const char* key) {
  const auto value = get(key);
  if (!value) return std::nullopt;
  if (value->isGenericDict()) return value->toGenericDict();
  wrong_type(key, *value, "a dict");
  return std::nullopt;
}

std::optional<std::vector<c10::IValue>> FieldReader::list(const char* key) {
  const auto value = get(key);
  if (!value) return std::nullopt;
  // PyTorch's Python side writes betas as a tuple; Volt writes lists.
  if (value->isList()) {
    const auto items = value->toListRef();
    return std::vector<c10::IValue>(items.begin(), items.end());
  }
  if (value->isTuple()) {
    const auto& items = value->toTupleRef().elements();
    return std::vector<c10::IValue>(items.begin(), items.end());
  }
  wrong_type(key, *value, "a list");
  return std::nullopt;
}

std::optional<std::vector<double>> FieldReader::numbers(const char* key) {
  const auto items = list(key);
  if (!items) return std::nullopt;
  std::vector<double> result;
  for (const c10::IValue& item : *items) {
    if (item.isDouble()) {
      result.push_back(item.toDouble());
    } else if (item.isInt()) {
      result.push_back(static_cast<double>(item.toInt()));
    } else {
      problem(fmt::format("{} holds a {}; expected a list of numbers", name(key), item.tagKind()));
      return std::nullopt;
    }
  }
  return result;
}

std::optional<std::vector<int64_t>> FieldReader::integers(const char* key) {
  const auto items = list(key);
  if (!items) return std::nullopt;
  std::vector<int64_t> result;
  for (const c10::IValue& item : *items) {
    if (!item.isInt()) {
      problem(fmt::format("{} holds a {}; expected a list of ints", name(key), item.tagKind()));
      return std::nullopt;
    }
    result.push_back(item.toInt());
  }
  return result;
}

std::optional<int64_t> FieldReader::step(const char* key) {
  const auto value = get(key);
  if (!value) return std::nullopt;
  double step = -1;
  if (value->isInt()) {
    step = static_cast<double>(value->toInt());
  } else if (value->isDouble()) {
    step = value->toDouble();
  } else if (value->isTensor() && value->toTensor().numel() == 1) {
    step = value->toTensor().item<double>();
  } else {
    wrong_type(key, *value, "an int or a one-element tensor");
    return std::nullopt;
  }
  if (step < 0 || step != std::floor(step)) {
    problem(fmt::format("{} is {}; expected a whole number >= 0", name(key), step));
    return std::nullopt;
  }
  return static_cast<int64_t>(step);
}

at::Tensor FieldReader::tensor(const char* key) {
  const auto value = get(key);
  if (!value) return {};
  if (value->isTensor()) return value->toTensor();
  wrong_type(key, *value, "a tensor");
  return {};
}

at::Tensor FieldReader::tensor_like(const char* key, const at::Tensor& like) {
  const auto value = get(key);
  if (!value) return {};
  if (!value->isTensor()) {
    wrong_type(key, *value, "a tensor");
    return {};
  }
  const at::Tensor& tensor = value->toTensor();
  if (!tensor.defined() || tensor.sizes() != like.sizes()) {
    problem(fmt::format("{} has shape {}; the parameter it belongs to has shape {}", name(key),
                        tensor.defined() ? shape_string(tensor.sizes()) : "(undefined)", shape_string(like.sizes())));
    return {};
  }
  // Like PyTorch's load_state_dict: floating state follows the parameter's dtype and everything
  // follows its device. Always a copy, so that the loaded optimizer never shares memory with
  // the checkpoint (or with the optimizer the checkpoint was taken from).
  const at::ScalarType dtype =
      tensor.is_floating_point() && like.is_floating_point() ? like.scalar_type() : tensor.scalar_type();
  return tensor.to(like.device(), dtype, /*non_blocking=*/false, /*copy=*/true);
}

c10::impl::GenericDict new_int_dict() { return c10::impl::GenericDict(c10::IntType::get(), c10::AnyType::get()); }

std::string shape_string(at::IntArrayRef sizes) {
  std::vector<std::string> dims;
  for (const int64_t size : sizes) dims.push_back(std::to_string(size));
  return "[" + join(dims, ", ") + "]";
}

}  // namespace volt::internal
