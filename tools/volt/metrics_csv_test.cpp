#include "metrics_csv.h"

#include <gtest/gtest.h>

#include "volt/core/testing.h"

namespace volt::tool {
namespace {

TEST(ParseMetricsCsv, ReadsLightningsLayoutWithEmptyCells) {
  const MetricsTable table =
      parse_metrics_csv("epoch,step,train/loss_step,val/acc\r\n0.0,5,1.5,\r\n0.0,9,,0.75\r\n", "metrics.csv");
  ASSERT_EQ(table.columns, (std::vector<std::string>{"epoch", "step", "train/loss_step", "val/acc"}));
  ASSERT_EQ(table.rows.size(), 2u);
  EXPECT_EQ(table.rows[0][1], 5.0);
  EXPECT_EQ(table.rows[0][2], 1.5);
  EXPECT_EQ(table.rows[0][3], std::nullopt);
  EXPECT_EQ(table.rows[1][3], 0.75);
  EXPECT_EQ(table.column("val/acc"), 3u);
  EXPECT_EQ(table.column("missing"), std::nullopt);
}

TEST(ParseMetricsCsv, QuotedHeadersMayHoldCommasAndQuotes) {
  const MetricsTable table = parse_metrics_csv("step,\"a,b\",\"say \"\"hi\"\"\"\n1,2,3\n", "m.csv");
  EXPECT_EQ(table.columns, (std::vector<std::string>{"step", "a,b", "say \"hi\""}));
  EXPECT_EQ(table.rows.at(0)[2], 3.0);
}

TEST(ParseMetricsCsv, NonNumbersAndNonFiniteValuesAreEmptyCells) {
  const MetricsTable table = parse_metrics_csv("step,loss,tag\n1,nan,x\n2,inf,y\n", "m.csv");
  EXPECT_FALSE(table.has_numbers(1));
  EXPECT_FALSE(table.has_numbers(2));
  EXPECT_TRUE(table.has_numbers(0));
}

TEST(ParseMetricsCsv, AnEmptyFileOrARaggedRowIsAnErrorWithAHint) {
  EXPECT_NE(testing::error_message([] { parse_metrics_csv("", "m.csv"); }).find("HINT"), std::string::npos);
  const std::string ragged = testing::error_message([] { parse_metrics_csv("step,loss\n1,2\n3\n", "m.csv"); });
  EXPECT_NE(ragged.find("line 3 has 1 cells but the header has 2"), std::string::npos) << ragged;
}

}  // namespace
}  // namespace volt::tool
