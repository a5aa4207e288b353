// The type of checkpoint sections.
#pragma once

#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

namespace volt {

/// A checkpoint section: string keys to plain values (dicts, lists, strings, numbers, booleans,
/// None) and tensors, the layout Python's torch.load reads as a dict.
using StateDict = c10::impl::GenericDict;

/// An empty StateDict with string keys. (c10::Dict<std::string, IValue> has no default
/// constructor, so every section starts here.)
inline StateDict make_state_dict() { return StateDict(c10::StringType::get(), c10::AnyType::get()); }

}  // namespace volt
