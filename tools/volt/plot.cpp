#include "plot.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "process.h"
#include "volt/core/error.h"
#include "volt/core/strings.h"

namespace volt::tool {
namespace {

namespace fs = std::filesystem;

enum class PanelKind { kLoss, kAccuracy, kOther };

PanelKind kind_of(const std::string& column) {
  if (column.find("loss") != std::string::npos) return PanelKind::kLoss;
  if (column.find("acc") != std::string::npos) return PanelKind::kAccuracy;
  return PanelKind::kOther;
}

const char* title_of(PanelKind kind) {
  switch (kind) {
    case PanelKind::kLoss:
      return "loss";
    case PanelKind::kAccuracy:
      return "accuracy";
    case PanelKind::kOther:
      return "other";
  }
  return "other";
}

/// The numeric columns a user may pass to --metrics, for HINTs.
std::string numeric_columns(const MetricsTable& table) {
  std::vector<std::string> names;
  for (std::size_t i = 0; i < table.columns.size(); ++i) {
    if (table.columns[i] != "step" && table.has_numbers(i)) names.push_back(table.columns[i]);
  }
  return names.empty() ? "(none)" : join(names, ", ");
}

/// The version number of a `version_N` directory, or -1.
int64_t version_number(const fs::path& dir) {
  const std::string name = dir.filename().string();
  const std::string prefix = "version_";
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size()) return -1;
  const std::string digits = name.substr(prefix.size());
  if (!std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; })) return -1;
  return digits.size() > 9 ? -1 : std::stoll(digits);
}

/// The highest version_N/metrics.csv directly under `root`, or "".
std::string newest_version_csv(const fs::path& root) {
  std::error_code error;
  if (!fs::is_directory(root, error)) return "";
  int64_t best = -1;
  std::string found;
  for (const auto& entry : fs::directory_iterator(root, error)) {
    const int64_t version = version_number(entry.path());
    const fs::path csv = entry.path() / "metrics.csv";
    if (version > best && fs::is_regular_file(csv, error)) {
      best = version;
      found = csv.string();
    }
  }
  return found;
}

/// A gnuplot single-quoted string: no escapes inside but '' for a quote.
std::string quoted(const std::string& text) {
  std::string out = "'";
  for (const char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  VOLT_CHECK(in.good(), "'{}' cannot be read. HINT: check its permissions.", path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

std::string find_metrics_csv(const std::string& log_dir) {
  std::error_code error;
  const fs::path dir(log_dir);
  if (fs::is_regular_file(dir, error)) return dir.string();
  VOLT_CHECK(fs::is_directory(dir, error),
             "the log directory '{}' does not exist. HINT: pass a run's folder, e.g. "
             "lightning_logs/version_0, or the --default-root-dir it trained with.",
             log_dir);
  if (fs::is_regular_file(dir / "metrics.csv", error)) return (dir / "metrics.csv").string();
  for (const fs::path& root : {dir, dir / "lightning_logs"}) {
    if (std::string csv = newest_version_csv(root); !csv.empty()) return csv;
  }
  throw Error(
      fmt::format("no metrics.csv in '{}' (nor in its version_N/ or lightning_logs/version_N/ folders). HINT: pass the "
                  "folder of a run that used the CSV logger (the default), e.g. lightning_logs/version_0.",
                  log_dir));
}

std::vector<PlotPanel> plan_panels(const MetricsTable& table, const std::vector<std::string>& metrics,
                                   const std::string& path, const std::string& x) {
  const auto step = table.column(x);
  VOLT_CHECK(step.has_value(),
             "'{}' has no '{}' column for the x axis (columns: {}). HINT: volt plot reads the metrics.csv of Volt's "
             "or Lightning's CSVLogger, which logs each row's global step; --x picks another column (lr_find.csv: "
             "--x lr).",
             path, x, table.columns.empty() ? "(none)" : join(table.columns, ", "));
  std::vector<std::size_t> chosen;
  if (metrics.empty()) {
    for (std::size_t i = 0; i < table.columns.size(); ++i) {
      if (i != *step && table.columns[i] != "step" && kind_of(table.columns[i]) != PanelKind::kOther &&
          table.has_numbers(i)) {
        chosen.push_back(i);
      }
    }
    VOLT_CHECK(!chosen.empty(),
               "'{}' has no loss or accuracy column with numbers to plot (numeric columns: {}). HINT: pass "
               "--metrics with some of those names, e.g. --metrics a,b; a run that has only just started may "
               "not have flushed its rows yet.",
               path, numeric_columns(table));
  } else {
    for (const std::string& name : metrics) {
      const auto index = table.column(name);
      VOLT_CHECK(index.has_value(), "--metrics names '{}', which '{}' does not have. HINT: choose from: {}.", name,
                 path, numeric_columns(table));
      VOLT_CHECK(table.has_numbers(*index), "the column '{}' of '{}' holds no numbers to plot. HINT: choose from: {}.",
                 name, path, numeric_columns(table));
      if (std::find(chosen.begin(), chosen.end(), *index) == chosen.end()) chosen.push_back(*index);
    }
    std::sort(chosen.begin(), chosen.end());
  }

  std::vector<PlotPanel> panels;
  for (const PanelKind kind : {PanelKind::kLoss, PanelKind::kAccuracy, PanelKind::kOther}) {
    PlotPanel panel{title_of(kind), {}};
    for (const std::size_t column : chosen) {
      if (kind_of(table.columns[column]) != kind) continue;
      PlotSeries series{table.columns[column], {}};
      for (const auto& row : table.rows) {
        if (row[*step] && row[column]) series.points.emplace_back(*row[*step], *row[column]);
      }
      panel.series.push_back(std::move(series));
    }
    if (!panel.series.empty()) panels.push_back(std::move(panel));
  }
  return panels;
}

std::string render_gnuplot_script(const std::vector<PlotPanel>& panels, const std::string& png_path, int64_t width,
                                  int64_t height, const std::string& title, const std::string& x, bool logx,
                                  std::optional<double> vline) {
  std::string script = fmt::format(
      "# Written by `volt plot`; `gnuplot <this file>` draws {} again.\n"
      "# noenhanced: metric names such as train/loss_step are shown as they are, not with subscripts.\n"
      "if (strstrt(GPVAL_TERMINALS, 'pngcairo') > 0) {{\n"
      "  set terminal pngcairo size {},{} noenhanced font 'sans,10'\n"
      "}} else {{\n"
      "  set terminal png size {},{} noenhanced\n"
      "}}\n"
      "set output {}\n",
      png_path, width, height, width, height, quoted(png_path));
  std::size_t block = 0;
  for (const auto& panel : panels) {
    for (const auto& series : panel.series) {
      script += fmt::format("$s{} << EOD\n", block++);
      for (const auto& [x, y] : series.points) script += fmt::format("{:.17g} {:.17g}\n", x, y);
      script += "EOD\n";
    }
  }
  script += fmt::format(
      "set multiplot layout {},1 title {}\n"
      "set grid\n"
      "set key top right opaque box\n"
      "set format y '%g'\n"
      "set offsets 0, 0, graph 0.05, graph 0.05\n"
      "set xlabel {}\n",
      panels.size(), quoted(title), quoted(x));
  if (logx) script += "set logscale x\nset format x '%.0e'\n";
  if (vline) {
    script += fmt::format("set arrow from {:.17g}, graph 0 to {:.17g}, graph 1 nohead dashtype 2 linewidth 1.5\n",
                          *vline, *vline);
  }
  // One step axis for every panel, so a validation point lines up with the training step above it;
  // a margin keeps the first and last points off the frame.
  double low = std::numeric_limits<double>::infinity(), high = -low;
  for (const auto& panel : panels) {
    for (const auto& series : panel.series) {
      for (const auto& point : series.points) {
        low = std::min(low, point.first);
        high = std::max(high, point.first);
      }
    }
  }
  if (low < high && logx && low > 0) {
    script += fmt::format("set xrange [{:.17g}:{:.17g}]\n", low / 1.1, high * 1.1);
  } else if (low < high) {
    const double margin = (high - low) * 0.02;
    script += fmt::format("set xrange [{:.17g}:{:.17g}]\n", low - margin, high + margin);
  }
  block = 0;
  for (const auto& panel : panels) {
    script += fmt::format("set title {}\nset ylabel {}\nplot ", quoted(panel.title), quoted(panel.title));
    for (std::size_t i = 0; i < panel.series.size(); ++i) {
      const PlotSeries& series = panel.series[i];
      // Epoch-level metrics have a few points each: mark them, or a 3-epoch run shows two segments.
      const char* style = series.points.size() <= 60 ? "linespoints pointtype 7 pointsize 0.6" : "lines";
      script += fmt::format("{}$s{} using 1:2 with {} linewidth 1.5 title {}", i == 0 ? "" : ", \\\n     ", block++,
                            style, quoted(series.name));
    }
    script += "\n";
  }
  script += "unset multiplot\nset output\n";
  return script;
}

PlotResult plot_metrics(const PlotOptions& options) {
  VOLT_CHECK(options.width >= 200 && options.width <= 20000,
             "--width={} is out of range; expected 200 to 20000 pixels. HINT: the default is 1000.", options.width);
  VOLT_CHECK(options.height == 0 || (options.height >= 150 && options.height <= 20000),
             "--height={} is out of range; expected 150 to 20000 pixels, or 0 for 350 per panel. HINT: the default 0 "
             "sizes the image by its panels.",
             options.height);
  const std::string csv = find_metrics_csv(options.log_dir);
  const MetricsTable table = parse_metrics_csv(read_file(csv), csv);
  PlotResult result;
  result.panels = plan_panels(table, options.metrics, csv, options.x);
  if (options.logx) {
    for (const PlotPanel& panel : result.panels) {
      for (const PlotSeries& series : panel.series) {
        for (const auto& point : series.points) {
          VOLT_CHECK(point.first > 0, "--logx needs positive x values, but '{}' has {}={} in '{}'. HINT: drop --logx.",
                     csv, options.x, point.first, series.name);
        }
      }
    }
  }
  const fs::path png = options.out.empty() ? fs::path(csv).parent_path() / "metrics.png" : fs::path(options.out);
  result.png = png.string();
  result.script = fs::path(png).replace_extension(".gp").string();
  VOLT_CHECK(result.script != result.png, "--out '{}' must not end in .gp. HINT: name the PNG, e.g. --out plot.png.",
             options.out);
  const int64_t height = options.height > 0 ? options.height : 350 * static_cast<int64_t>(result.panels.size());
  const std::string script = render_gnuplot_script(result.panels, result.png, options.width, height, csv, options.x,
                                                   options.logx, options.vline);
  {
    std::ofstream out(result.script, std::ios::trunc);
    out << script;
    out.close();
    VOLT_CHECK(out.good(), "cannot write '{}'. HINT: check that the directory of --out exists and is writable.",
               result.script);
  }
  ProcessResult run;
  try {
    run = run_process({options.gnuplot, result.script});
  } catch (const Error& e) {
    throw Error(
        fmt::format("{}\nHINT: volt plot draws with gnuplot: install it (Debian: apt-get install "
                    "gnuplot-nox) or pass --gnuplot PATH. The script is in {}.",
                    e.what(), result.script));
  }
  VOLT_CHECK(run.exit_code == 0, "gnuplot failed on '{}' (exit code {}): {}\nHINT: read gnuplot's message above.",
             result.script, run.exit_code, trim(run.err + run.out));
  std::error_code error;
  VOLT_CHECK(fs::is_regular_file(png, error) && fs::file_size(png, error) > 0,
             "gnuplot ran but wrote no '{}'. HINT: check that its directory exists and is writable.", result.png);
  return result;
}

}  // namespace volt::tool
