#include "volt/core/strings.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>

namespace volt {

std::string trim(std::string_view text) {
  std::size_t begin = 0;
  std::size_t end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return std::string(text.substr(begin, end - begin));
}

std::string to_lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::optional<long long> parse_int(std::string_view text) {
  const std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long value = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || end != s.c_str() + s.size()) return std::nullopt;
  return value;
}

std::optional<double> parse_double(std::string_view text) {
  const std::string s = trim(text);
  if (s.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double value = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(value)) return std::nullopt;
  return value;
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (true) {
    const auto pos = text.find(sep, start);
    if (pos == std::string_view::npos) {
      out.emplace_back(text.substr(start));
      return out;
    }
    out.emplace_back(text.substr(start, pos - start));
    start = pos + 1;
  }
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) out += sep;
    out += items[i];
  }
  return out;
}

std::optional<ShardFileName> parse_shard_file_name(std::string_view name) {
  constexpr std::string_view kShard = ".shard";
  constexpr std::size_t kSaveIdDigits = 16;
  const std::size_t shard = name.rfind(kShard);
  if (shard == std::string_view::npos || shard < kSaveIdDigits + 2 || name[shard - kSaveIdDigits - 1] != '.') {
    return std::nullopt;
  }
  const std::string_view id = name.substr(shard - kSaveIdDigits, kSaveIdDigits);
  const std::string_view rank = name.substr(shard + kShard.size());
  const bool hex =
      std::all_of(id.begin(), id.end(), [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
  const bool digits = !rank.empty() && rank.size() <= 9 &&
                      std::all_of(rank.begin(), rank.end(), [](char c) { return c >= '0' && c <= '9'; });
  if (!hex || !digits) return std::nullopt;
  return ShardFileName{.checkpoint = std::string(name.substr(0, shard - kSaveIdDigits - 1)),
                       .save_id = std::string(id),
                       .rank = std::stoll(std::string(rank))};
}

}  // namespace volt
