#include "plot.h"

#include <gtest/gtest.h>

#include "volt/core/testing.h"

namespace volt::tool {
namespace {

constexpr const char* kCsv =
    "epoch,step,lr-Adam,train/loss_epoch,train/loss_step,val/acc,val/loss\n"
    "0,0,0.001,,,,\n"
    "0,4,,,1.5,,\n"
    "0,9,,,1.0,0.6,0.9\n"
    "0,9,,1.2,,,\n";

TEST(PlanPanels, ByDefaultLossesAndAccuraciesGoToSeparatePanels) {
  const auto panels = plan_panels(parse_metrics_csv(kCsv, "m.csv"), {}, "m.csv");
  ASSERT_EQ(panels.size(), 2u);
  EXPECT_EQ(panels[0].title, "loss");
  ASSERT_EQ(panels[0].series.size(), 3u);
  EXPECT_EQ(panels[0].series[0].name, "train/loss_epoch");
  EXPECT_EQ(panels[0].series[1].name, "train/loss_step");
  EXPECT_EQ(panels[0].series[1].points, (std::vector<std::pair<double, double>>{{4, 1.5}, {9, 1.0}}));
  EXPECT_EQ(panels[1].title, "accuracy");
  EXPECT_EQ(panels[1].series.at(0).name, "val/acc");
}

TEST(PlanPanels, ChosenMetricsMayIncludeOthers) {
  const auto panels = plan_panels(parse_metrics_csv(kCsv, "m.csv"), {"lr-Adam", "val/acc"}, "m.csv");
  ASSERT_EQ(panels.size(), 2u);
  EXPECT_EQ(panels[0].title, "accuracy");
  EXPECT_EQ(panels[1].title, "other");
  EXPECT_EQ(panels[1].series.at(0).name, "lr-Adam");
}

TEST(PlanPanels, MissingOrEmptyColumnsNameWhatIsThere) {
  const MetricsTable table = parse_metrics_csv(kCsv, "m.csv");
  const std::string missing = testing::error_message([&] { plan_panels(table, {"val/f1"}, "m.csv"); });
  EXPECT_NE(missing.find("'val/f1'"), std::string::npos) << missing;
  EXPECT_NE(missing.find("HINT: choose from: epoch, lr-Adam, train/loss_epoch"), std::string::npos) << missing;
  const std::string none =
      testing::error_message([] { plan_panels(parse_metrics_csv("step,lr\n1,0.1\n", "m.csv"), {}, "m.csv"); });
  EXPECT_NE(none.find("no loss or accuracy column"), std::string::npos) << none;
  EXPECT_NE(none.find("HINT"), std::string::npos) << none;
  const std::string no_step =
      testing::error_message([] { plan_panels(parse_metrics_csv("epoch,loss\n1,0.1\n", "m.csv"), {}, "m.csv"); });
  EXPECT_NE(no_step.find("no 'step' column"), std::string::npos) << no_step;
  EXPECT_NE(no_step.find("--x"), std::string::npos) << no_step;
}

TEST(RenderGnuplotScript, InlinesTheDataAndQuotesNames) {
  const std::vector<PlotPanel> panels = {{"loss", {{"it's/loss", {{1, 2.5}, {2, 2.0}}}}}};
  const std::string script = render_gnuplot_script(panels, "/tmp/out.png", 800, 600, "run");
  EXPECT_NE(script.find("size 800,600"), std::string::npos);
  EXPECT_NE(script.find("set output '/tmp/out.png'"), std::string::npos);
  EXPECT_NE(script.find("$s0 << EOD\n1 2.5\n2 2\nEOD\n"), std::string::npos) << script;
  EXPECT_NE(script.find("title 'it''s/loss'"), std::string::npos) << script;
  EXPECT_NE(script.find("set multiplot layout 1,1"), std::string::npos);
}

TEST(PlanPanels, AnotherColumnMayBeTheXAxis) {
  // lr_find.csv, as the learning-rate finder writes it.
  const MetricsTable table = parse_metrics_csv("step,lr,loss,suggested\n0,1e-05,2.5,0\n1,0.001,1.5,1\n", "f.csv");
  const auto panels = plan_panels(table, {"loss"}, "f.csv", "lr");
  ASSERT_EQ(panels.size(), 1u);
  EXPECT_EQ(panels[0].series.at(0).points, (std::vector<std::pair<double, double>>{{1e-5, 2.5}, {0.001, 1.5}}));
  const std::string script = render_gnuplot_script(panels, "/tmp/f.png", 800, 350, "f.csv", "lr", true, 0.001);
  EXPECT_NE(script.find("set xlabel 'lr'"), std::string::npos) << script;
  EXPECT_NE(script.find("set logscale x"), std::string::npos) << script;
  EXPECT_NE(script.find("set arrow from 0.001, graph 0 to 0.001, graph 1"), std::string::npos) << script;
  EXPECT_EQ(render_gnuplot_script(panels, "/tmp/f.png", 800, 350, "f.csv").find("logscale"), std::string::npos);
}

}  // namespace
}  // namespace volt::tool
