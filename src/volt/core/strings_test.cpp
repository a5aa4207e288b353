#include "volt/core/strings.h"

#include <gtest/gtest.h>

namespace volt {
namespace {

enum class Color { kRed, kGreen };
const char* to_string(Color c) {
  switch (c) {
    case Color::kRed:
      return "red";
    case Color::kGreen:
      return "green";
  }
  return "?";
}

TEST(Strings, ParseIntAcceptsWholeNumbersOnly) {
  EXPECT_EQ(parse_int(" 42 "), 42);
  EXPECT_EQ(parse_int("-3"), -3);
  EXPECT_FALSE(parse_int("4x").has_value());
  EXPECT_FALSE(parse_int("").has_value());
  EXPECT_FALSE(parse_int("99999999999999999999999").has_value());
}

TEST(Strings, ParseDoubleRejectsNonFinite) {
  EXPECT_DOUBLE_EQ(*parse_double("0.25"), 0.25);
  EXPECT_FALSE(parse_double("inf").has_value());
  EXPECT_FALSE(parse_double("1.0abc").has_value());
}

TEST(Strings, SplitKeepsEmptyFields) {
  EXPECT_EQ(split("a,,b", ','), (std::vector<std::string>{"a", "", "b"}));
  EXPECT_EQ(join({"a", "b"}, ", "), "a, b");
}

TEST(Strings, ParseEnumNamesTheChoicesOnError) {
  const Color all[] = {Color::kRed, Color::kGreen};
  EXPECT_EQ(parse_enum(" GREEN", all, "color"), Color::kGreen);
  try {
    parse_enum("blue", all, "color");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "unknown color 'blue'; expected one of: red, green.");
  }
}

TEST(ParseShardFileName, ReadsTheCheckpointTheSaveAndTheRank) {
  const std::optional<ShardFileName> shard = parse_shard_file_name("last.ckpt.0123456789abcdef.shard12");
  ASSERT_TRUE(shard.has_value());
  EXPECT_EQ(shard->checkpoint, "last.ckpt");
  EXPECT_EQ(shard->save_id, "0123456789abcdef");
  EXPECT_EQ(shard->rank, 12);
  EXPECT_EQ(parse_shard_file_name("a.b.ckpt.ffffffffffffffff.shard0")->checkpoint, "a.b.ckpt");
  for (const char* other :
       {"last.ckpt", "last.ckpt.shard0", "last.ckpt.0123456789abcdef.shard", "last.ckpt.0123456789ABCDEF.shard1",
        "last.ckpt.0123456789abcdef.shard1.tmp.5", "last.ckpt.0123456789abcde.shard1",
        "last.ckpt.0123456789abcdef.shard1x", ".0123456789abcdef.shard1x"})
    EXPECT_FALSE(parse_shard_file_name(other).has_value()) << other;
}

}  // namespace
}  // namespace volt
