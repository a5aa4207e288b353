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

}  // namespace
}  // namespace volt
