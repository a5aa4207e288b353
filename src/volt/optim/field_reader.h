// Reads typed fields out of checkpoint dictionaries (c10::IValue), for optimizer and scheduler
// state. Internal to volt::optim.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/ivalue.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "volt/core/problems.h"

namespace volt::internal {

/// Reads the fields of one dictionary of a checkpoint.
///
/// Missing or mistyped fields are recorded in `problems` (naming `where`, e.g.
/// "param_groups[0]") instead of thrown, because a user fixing a checkpoint wants to see every
/// mismatch at once. Accepts what PyTorch's Python side writes as well as what Volt writes: ints
/// where doubles are expected, tuples where lists are expected, and `step` as an int, a double or
/// a one-element tensor.
class FieldReader {
 public:
  /// Reads from `dict`; `where` names it in messages. `problems` must outlive the reader.
  FieldReader(c10::impl::GenericDict dict, std::string where, Problems& problems);

  /// Whether `key` is present (and not None).
  bool has(const char* key) const;
  /// The value at `key`, whatever its type.
  std::optional<c10::IValue> value(const char* key);
  /// The number at `key` (int or double).
  std::optional<double> number(const char* key);
  /// The whole number at `key`.
  std::optional<int64_t> integer(const char* key);
  /// The bool at `key`.
  std::optional<bool> flag(const char* key);
  /// The string at `key`.
  std::optional<std::string> string(const char* key);
  /// The list or tuple of numbers at `key`.
  std::optional<std::vector<double>> numbers(const char* key);
  /// The list or tuple of whole numbers at `key`.
  std::optional<std::vector<int64_t>> integers(const char* key);
  /// The dict at `key`.
  std::optional<c10::impl::GenericDict> dict(const char* key);
  /// The list or tuple at `key`.
  std::optional<std::vector<c10::IValue>> list(const char* key);
  /// An optimizer's step counter: an int, a whole double, or a one-element tensor (PyTorch >= 1.12).
  std::optional<int64_t> step(const char* key);
  /// The tensor at `key`; undefined when missing or not a tensor.
  at::Tensor tensor(const char* key);
  /// A copy of the tensor at `key` on `like`'s device (and dtype, when both are floating point),
  /// checked to have `like`'s shape; undefined when missing or wrong.
  at::Tensor tensor_like(const char* key, const at::Tensor& like);
  /// Records a problem with this dict that the caller found.
  void problem(const std::string& message);
  /// The name of this dict with `key` appended, e.g. "state[0]['exp_avg']".
  std::string name(const char* key) const;

 private:
  std::optional<c10::IValue> get(const char* key);
  void wrong_type(const char* key, const c10::IValue& value, const char* expected);

  c10::impl::GenericDict dict_;
  std::string where_;
  Problems* problems_;
};

/// A dict with int keys and values of any type (PyTorch's optimizer "state").
c10::impl::GenericDict new_int_dict();
/// A shape as PyTorch prints it, e.g. "[2, 3]".
std::string shape_string(at::IntArrayRef sizes);

}  // namespace volt::internal
