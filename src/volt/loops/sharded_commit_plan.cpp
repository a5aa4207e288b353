#include "volt/loops/sharded_commit_plan.h"

#include <fmt/format.h>

#include <cctype>
#include <cstdint>

#include "volt/core/error.h"

namespace volt {

namespace {

// Bumped when the layout changes: every process runs the same build, but a mismatch should say so.
constexpr const char* kTag = "volt-sharded-commit-1;";

void put_field(std::string& out, const std::string& field) {
  out += std::to_string(field.size());
  out += ':';
  out += field;
}

/// Reads a message written by encode(), naming what it expected where it stops making sense.
class Reader {
 public:
  explicit Reader(const std::string& bytes) : bytes_(bytes) {}

  void expect(const std::string& literal, const char* what) {
    if (bytes_.compare(at_, literal.size(), literal) != 0) fail(fmt::format("'{}' ({})", literal, what));
    at_ += literal.size();
  }
  /// A decimal count ended by `end`.
  size_t count(char end, const std::string& what) {
    const size_t begin = at_;
    uint64_t value = 0;
    while (at_ < bytes_.size() && std::isdigit(static_cast<unsigned char>(bytes_[at_])) && at_ - begin < 19) {
      value = value * 10 + static_cast<uint64_t>(bytes_[at_] - '0');
      ++at_;
    }
    if (at_ == begin || at_ >= bytes_.size() || bytes_[at_] != end) {
      at_ = begin;
      fail(fmt::format("a decimal {} ended by '{}'", what, end));
    }
    ++at_;
    return static_cast<size_t>(value);
  }
  std::string field(const char* what) {
    const size_t size = count(':', fmt::format("length of {}", what));
    if (size > bytes_.size() - at_) {
      fail(fmt::format("{} bytes of {} ({} left)", size, what, bytes_.size() - at_));
    }
    std::string out = bytes_.substr(at_, size);
    at_ += size;
    return out;
  }
  char flag() {
    if (at_ >= bytes_.size() || (bytes_[at_] != 'W' && bytes_[at_] != 'F')) fail("'W' (weights only) or 'F' (full)");
    return bytes_[at_++];
  }
  void finish() const {
    if (at_ != bytes_.size()) fail("the end of the message");
  }

 private:
  [[noreturn]] void fail(const std::string& expected) const {
    // A prefix is enough to recognize what was sent instead (a plan's paths may be long).
    constexpr size_t kShown = 80;
    const std::string shown =
        bytes_.size() > kShown ? bytes_.substr(0, kShown) + fmt::format("... ({} bytes)", bytes_.size()) : bytes_;
    throw Error(
        fmt::format("malformed sharded commit plan \"{}\": expected {} at byte {}. HINT: every process must "
                    "run the same build of Volt.",
                    shown, expected, at_));
  }

  const std::string& bytes_;
  size_t at_ = 0;
};

}  // namespace

std::string encode(const ShardedCommitPlan& plan) {
  std::string out = kTag;
  put_field(out, plan.save_id);
  out += std::to_string(plan.entries.size());
  out += ';';
  for (const ShardedCommitPlan::Entry& entry : plan.entries) {
    out += entry.weights_only ? 'W' : 'F';
    put_field(out, entry.path);
  }
  return out;
}

ShardedCommitPlan decode_sharded_commit_plan(const std::string& bytes) {
  Reader reader(bytes);
  reader.expect(kTag, "the message's version tag");
  ShardedCommitPlan plan;
  plan.save_id = reader.field("the save id");
  const size_t entries = reader.count(';', "number of entries");
  for (size_t i = 0; i < entries; ++i) {
    const bool weights_only = reader.flag() == 'W';
    plan.entries.push_back({.path = reader.field("a path"), .weights_only = weights_only});
  }
  reader.finish();
  return plan;
}

}  // namespace volt
