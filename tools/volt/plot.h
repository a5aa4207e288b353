// `volt plot`: training and validation curves from a run's metrics.csv, drawn by gnuplot.
//
// The pieces are pure (which file, which panels, the gnuplot script) and unit-tested; only
// plot_metrics reads files and runs gnuplot.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "metrics_csv.h"

namespace volt::tool {

/// What `volt plot` was asked for.
struct PlotOptions {
  /// A run's log directory (lightning_logs/version_N), a root holding lightning_logs/, or a CSV file.
  std::string log_dir;
  /// The PNG to write; empty: metrics.png beside metrics.csv.
  std::string out;
  /// The columns to draw, e.g. {"train/loss_step", "val/acc"}; empty: every loss and accuracy column.
  std::vector<std::string> metrics;
  /// The image's width in pixels.
  int64_t width = 1000;
  /// The image's height in pixels; 0: 350 per panel.
  int64_t height = 0;
  /// The gnuplot program to run (found on PATH).
  std::string gnuplot = "gnuplot";
  /// The column on the x axis: "step", or e.g. "lr" for the learning-rate finder's lr_find.csv.
  std::string x = "step";
  /// A logarithmic x axis (a learning-rate sweep).
  bool logx = false;
  /// A vertical line at this x (the learning-rate finder's suggestion); unset: none.
  std::optional<double> vline;
};

/// One curve: a metric's (x, value) points in file order (x: the step unless --x says otherwise).
struct PlotSeries {
  /// The column's name, also the curve's key entry.
  std::string name;
  /// (step, value) for each row that logged the metric.
  std::vector<std::pair<double, double>> points;
};

/// One panel of the figure: curves sharing a y axis.
struct PlotPanel {
  /// "loss", "accuracy" or "other"; the panel's title.
  std::string title;
  /// Its curves, in the CSV's column order.
  std::vector<PlotSeries> series;
};

/// The metrics.csv that `log_dir` names: the path itself if it is a file, <log_dir>/metrics.csv,
/// else the highest version_N/metrics.csv under <log_dir> or <log_dir>/lightning_logs. Throws
/// volt::Error with a HINT when there is none.
std::string find_metrics_csv(const std::string& log_dir);

/// Splits the chosen columns into panels: losses ("loss" in the name), accuracies ("acc"), then
/// anything else asked for by name. x values come from the column `x` ("step" unless asked
/// otherwise). Throws volt::Error with a HINT naming the available columns when a requested one is
/// missing or has no numbers, when there is no x column, or when nothing is left to draw. `path`
/// names the file in errors.
std::vector<PlotPanel> plan_panels(const MetricsTable& table, const std::vector<std::string>& metrics,
                                   const std::string& path, const std::string& x = "step");

/// The gnuplot script that draws `panels` stacked into a `width` x `height` PNG at `png_path`
/// (pngcairo when gnuplot has it, else png), with the data inline, so the script alone redraws it.
/// The x axis is labelled `x`, logarithmic when `logx`, with a dashed vertical line at `vline`.
std::string render_gnuplot_script(const std::vector<PlotPanel>& panels, const std::string& png_path, int64_t width,
                                  int64_t height, const std::string& title, const std::string& x = "step",
                                  bool logx = false, std::optional<double> vline = std::nullopt);

/// What plot_metrics wrote.
struct PlotResult {
  /// The PNG.
  std::string png;
  /// The gnuplot script beside it (<png without .png>.gp).
  std::string script;
  /// The panels drawn.
  std::vector<PlotPanel> panels;
};

/// Reads the run's metrics.csv, writes the script and runs gnuplot on it. Throws volt::Error with a
/// HINT for bad input, a missing gnuplot or a gnuplot failure.
PlotResult plot_metrics(const PlotOptions& options);

}  // namespace volt::tool
