// Writes a small training run's logs the way the Trainer would, through CSVLogger and
// TensorBoardLogger sharing one version folder, and prints as JSON exactly what it logged, so
// test_tensorboard.py can check every value against what the real `tensorboard` package reads.
//
//   tb_writer SAVE_DIR [--version V] [--status success|failed|interrupted] [--no-csv]
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "volt/core/error.h"
#include "volt/loggers/loggers.h"

namespace {

struct Args {
  std::string save_dir;
  std::optional<std::string> version;
  std::string status = "success";
  bool csv = true;
};

Args parse_args(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const bool has_value = i + 1 < argc;
    if (arg == "--version" && has_value) {
      args.version = argv[++i];
    } else if (arg == "--status" && has_value) {
      args.status = argv[++i];
    } else if (arg == "--no-csv") {
      args.csv = false;
    } else if (args.save_dir.empty() && arg.rfind("--", 0) != 0) {
      args.save_dir = arg;
    } else {
      throw volt::Error("tb_writer: unexpected argument '" + arg +
                        "'. HINT: tb_writer SAVE_DIR "
                        "[--version V] [--status S] [--no-csv]");
    }
  }
  if (args.save_dir.empty()) throw volt::Error("tb_writer: SAVE_DIR is missing");
  return args;
}

/// Metrics of a 3-epoch run with 4 steps an epoch: per-step training metrics and per-epoch
/// validation metrics, with values that test float32 rounding, zero, signs and magnitudes.
std::vector<std::pair<int64_t, std::map<std::string, double>>> run_metrics() {
  std::vector<std::pair<int64_t, std::map<std::string, double>>> rows;
  int64_t step = 0;
  for (int epoch = 0; epoch < 3; ++epoch) {
    for (int batch = 0; batch < 4; ++batch, ++step) {
      rows.push_back({step,
                      {{"train/loss", 2.302585 / (1.0 + 0.37 * static_cast<double>(step))},
                       {"lr-Adam", 1e-3 * std::pow(0.5, epoch)}}});
    }
    rows.push_back({step - 1,
                    {{"val/loss", 0.1 * (3 - epoch)},
                     {"val/acc", epoch == 0 ? 0.0 : 0.8 + 0.05 * epoch},
                     {"delta", -1.5e-7 * (epoch + 1)},
                     {"big", 3.0e38},
                     {"epoch", epoch}}});
  }
  return rows;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse_args(argc, argv);

  // What the Trainer does to share one folder: resolve the version once, pass it to every logger.
  volt::LoggerOptions options;
  options.save_dir = args.save_dir;
  options.version = args.version ? *args.version : volt::resolve_version(options);

  std::vector<std::shared_ptr<volt::Logger>> loggers;
  auto tensorboard = std::make_shared<volt::TensorBoardLogger>(options);
  loggers.push_back(tensorboard);
  if (args.csv) loggers.push_back(std::make_shared<volt::CSVLogger>(options));

  const nlohmann::json hparams = {
      {"lr", 0.001},
      {"batch_size", 64},
      {"model", "cnn"},
      {"deterministic", true},
      {"optimizer", {{"name", "adam"}, {"betas", {0.9, 0.999}}}},
      {"seed", nullptr},
  };
  for (const auto& logger : loggers) logger->log_hyperparams(hparams);

  nlohmann::json scalars = nlohmann::json::array();
  scalars.push_back({{"tag", volt::TensorBoardLogger::kHpMetric}, {"step", 0}, {"value", -1.0}});
  for (const auto& [step, metrics] : run_metrics()) {
    for (const auto& logger : loggers) logger->log_metrics(metrics, step);
    for (const auto& [tag, value] : metrics) {
      scalars.push_back({{"tag", tag}, {"step", step}, {"value", value}});
    }
  }
  for (const auto& logger : loggers) logger->save();
  for (const auto& logger : loggers) logger->finalize(args.status);

  const nlohmann::json report = {
      {"log_dir", tensorboard->log_dir()},
      {"version", tensorboard->version()},
      {"event_file", tensorboard->event_file_path()},
      {"pid", static_cast<long long>(::getpid())},
      {"scalars", scalars},
      {"hparams",
       {{"lr", 0.001},
        {"batch_size", 64},
        {"model", "cnn"},
        {"deterministic", true},
        {"optimizer/name", "adam"},
        {"optimizer/betas", "[0.9,0.999]"},
        {"seed", "None"}}},
      {"status", args.status},
  };
  std::cout << report.dump(2) << "\n";
  return 0;
} catch (const std::exception& e) {
  std::cerr << "tb_writer: " << e.what() << "\n";
  return 1;
}
