// Small string helpers shared by option parsing, the CLI and file names. No LibTorch.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace volt {

/// `text` parsed as a whole base-10 integer (surrounding spaces allowed), or nullopt.
std::optional<long long> parse_int(std::string_view text);
/// `text` parsed as a whole finite floating-point number, or nullopt.
std::optional<double> parse_double(std::string_view text);
/// `text` without leading and trailing whitespace.
std::string trim(std::string_view text);
/// `text` in lower case (ASCII).
std::string to_lower(std::string_view text);
/// `text` split at every `sep`; empty fields are kept.
std::vector<std::string> split(std::string_view text, char sep);
/// `items` joined with `sep` between them.
std::string join(const std::vector<std::string>& items, std::string_view sep);

/// What the name of one process's shard file of a sharded checkpoint says:
/// `<checkpoint>.<save id: 16 lowercase hex digits>.shard<rank>` (checkpoint/sharded_checkpoint.h's
/// shard_path writes it; docs/checkpoint-format.md).
struct ShardFileName {
  /// The checkpoint's file name, e.g. "last.ckpt".
  std::string checkpoint;
  /// The save it belongs to.
  std::string save_id;
  /// The process that wrote it.
  long long rank = 0;
};
/// `name` (a file name, no folder) parsed as a shard file's, or nullopt for any other name.
std::optional<ShardFileName> parse_shard_file_name(std::string_view name);

/// Parses `text` into one of an enum's values by the names `to_string` gives them.
///
/// Used by every option enum's `parse` so that all of them reject bad input alike:
/// "unknown <what> 'x'; expected one of: a, b, c".
template <typename E, std::size_t N>
E parse_enum(std::string_view text, const E (&values)[N], const char* what);

}  // namespace volt

#include "volt/core/strings_inl.h"
