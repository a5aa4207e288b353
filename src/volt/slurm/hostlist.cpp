#include "volt/slurm/hostlist.h"

#include <cctype>

#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt::slurm {

namespace {

[[noreturn]] void malformed(std::string_view expression, std::size_t position, const std::string& what) {
  throw Error(
      fmt::format("malformed SLURM hostlist '{}' at position {}: {}. HINT: expected names like "
                  "'node[01-04,7]', 'a,b' or 'rack1-[2,5]' (SLURM_JOB_NODELIST as SLURM sets it).",
                  expression, position, what));
}

bool all_digits(std::string_view text) {
  if (text.empty()) return false;
  for (char c : text)
    if (!std::isdigit(static_cast<unsigned char>(c))) return false;
  return true;
}

/// Expands the inside of one bracket group ("01-04,7") into zero-padded numbers.
std::vector<std::string> expand_ranges(std::string_view expression, std::string_view inner, std::size_t offset) {
  std::vector<std::string> out;
  std::size_t start = 0;
  while (start <= inner.size()) {
    std::size_t end = inner.find(',', start);
    if (end == std::string_view::npos) end = inner.size();
    const std::string_view range = inner.substr(start, end - start);
    const std::size_t dash = range.find('-');
    const std::string_view low = range.substr(0, dash);
    const std::string_view high = dash == std::string_view::npos ? low : range.substr(dash + 1);
    if (!all_digits(low) || !all_digits(high)) {
      malformed(expression, offset + start, fmt::format("range '{}' must be N or N-M with digits only", range));
    }
    if (low.size() > 9 || high.size() > 9) malformed(expression, offset + start, "a range bound has too many digits");
    const long lo = std::stol(std::string(low));
    const long hi = std::stol(std::string(high));
    if (hi < lo) malformed(expression, offset + start, fmt::format("range '{}' runs backwards", range));
    if (static_cast<std::size_t>(hi - lo) >= kMaxHosts) {
      malformed(expression, offset + start, fmt::format("range '{}' has more than {} hosts", range, kMaxHosts));
    }
    for (long v = lo; v <= hi; ++v) {
      std::string digits = std::to_string(v);
      if (digits.size() < low.size()) digits.insert(0, low.size() - digits.size(), '0');
      out.push_back(std::move(digits));
      if (out.size() > kMaxHosts) malformed(expression, offset, fmt::format("more than {} hosts", kMaxHosts));
    }
    start = end + 1;
  }
  return out;
}

/// Expands one top-level item ("rack[1-2]-n[1-3]") and appends its hosts to `out`, in the order
/// `scontrol show hostnames` prints them: the last bracket group varies fastest, then the first,
/// the second, and so on (x[1-2]y[3-4]z[5-6] gives x1y3z5 x1y3z6 x2y3z5 x2y3z6 x1y4z5 ...); with
/// one or two groups that is the plain leftmost-slowest product.
void expand_item(std::string_view expression, std::string_view item, std::size_t offset,
                 std::vector<std::string>& out) {
  std::vector<std::string> literals;             // the text before, between and after the groups
  std::vector<std::vector<std::string>> groups;  // each bracket group's numbers
  std::size_t i = 0;
  std::size_t combinations = 1;
  while (true) {
    const std::size_t open = item.find('[', i);
    const std::string_view literal = item.substr(i, open == std::string_view::npos ? std::string_view::npos : open - i);
    if (literal.find(']') != std::string_view::npos)
      malformed(expression, offset + i + literal.find(']'), "']' without '['");
    literals.emplace_back(literal);
    if (open == std::string_view::npos) break;
    const std::size_t close = item.find(']', open);
    if (close == std::string_view::npos) malformed(expression, offset + open, "'[' is never closed");
    const std::string_view inner = item.substr(open + 1, close - open - 1);
    if (inner.find('[') != std::string_view::npos) malformed(expression, offset + open, "brackets cannot nest");
    groups.push_back(expand_ranges(expression, inner, offset + open + 1));
    combinations *= groups.back().size();
    if (combinations > kMaxHosts) malformed(expression, offset + open, fmt::format("more than {} hosts", kMaxHosts));
    i = close + 1;
  }
  if (out.size() + combinations > kMaxHosts)
    malformed(expression, offset, fmt::format("more than {} hosts", kMaxHosts));
  // Which group advances first: the last, then the first, the second, ... (SLURM's order).
  std::vector<std::size_t> fastest_first;
  if (!groups.empty()) fastest_first.push_back(groups.size() - 1);
  for (std::size_t g = 0; g + 1 < groups.size(); ++g) fastest_first.push_back(g);
  std::vector<std::size_t> index(groups.size(), 0);
  for (std::size_t n = 0; n < combinations; ++n) {
    std::string host = literals[0];
    for (std::size_t g = 0; g < groups.size(); ++g) host += groups[g][index[g]] + literals[g + 1];
    out.push_back(std::move(host));
    for (const std::size_t g : fastest_first) {
      if (++index[g] < groups[g].size()) break;
      index[g] = 0;
    }
  }
}

}  // namespace

std::vector<std::string> expand_hostlist(std::string_view expression) {
  std::vector<std::string> hosts;
  int depth = 0;
  std::size_t start = 0;
  for (std::size_t i = 0; i <= expression.size(); ++i) {
    const char c = i < expression.size() ? expression[i] : ',';
    if (c == '[') {
      if (++depth > 1) malformed(expression, i, "brackets cannot nest");
    } else if (c == ']') {
      if (--depth < 0) malformed(expression, i, "']' without '['");
    } else if (std::isspace(static_cast<unsigned char>(c))) {
      malformed(expression, i, "host names cannot contain spaces");
    } else if (c == ',' && depth == 0) {
      // SLURM skips empty items ("a,,b", "a,"), as `scontrol show hostnames` does.
      if (i > start) expand_item(expression, expression.substr(start, i - start), start, hosts);
      start = i + 1;
    }
  }
  if (depth != 0) malformed(expression, expression.size(), "'[' is never closed");
  if (hosts.empty()) malformed(expression, 0, "no host names");
  return hosts;
}

std::vector<int64_t> expand_tasks_per_node(std::string_view text) {
  const auto bad = [&](const std::string& what) {
    throw Error(
        fmt::format("malformed SLURM task counts '{}': {}. HINT: expected SLURM's form, e.g. '2(x3),1' "
                    "(SLURM_TASKS_PER_NODE as SLURM sets it).",
                    text, what));
  };
  std::vector<int64_t> counts;
  for (const std::string& field : split(text, ',')) {
    const std::string_view item = field;
    const std::size_t paren = item.find("(x");
    const std::string_view count = item.substr(0, paren);
    std::string_view repeat = "1";
    if (paren != std::string_view::npos) {
      if (item.back() != ')') bad(fmt::format("'{}' does not end with ')'", item));
      repeat = item.substr(paren + 2, item.size() - paren - 3);
    }
    if (!all_digits(count) || !all_digits(repeat) || count.size() > 9 || repeat.size() > 7) {
      bad(fmt::format("'{}' is not N or N(xM)", item));
    }
    const long n = std::stol(std::string(count));
    const long times = std::stol(std::string(repeat));
    if (counts.size() + static_cast<std::size_t>(times) > kMaxHosts) bad(fmt::format("more than {} nodes", kMaxHosts));
    counts.insert(counts.end(), static_cast<std::size_t>(times), n);
  }
  return counts;
}

std::string first_host(std::string_view expression) {
  // Expanding only the first non-empty top-level item keeps this cheap for huge allocations.
  std::size_t start = 0;
  while (start <= expression.size()) {
    int depth = 0;
    std::size_t end = start;
    while (end < expression.size() && !(expression[end] == ',' && depth == 0)) {
      if (expression[end] == '[') ++depth;
      if (expression[end] == ']') --depth;
      ++end;
    }
    if (end > start) return expand_hostlist(expression.substr(start, end - start)).front();
    start = end + 1;
  }
  malformed(expression, 0, "no host names");
}

}  // namespace volt::slurm
