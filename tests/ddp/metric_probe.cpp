// A small program for the metrics' multi-process tests (tests/ddp/test_metrics.py): every rank
// builds the same data set from a seed, takes its contiguous, unpadded shard, updates every
// built-in metric in uneven batches, computes them synced over a ProcessGroup, and writes the
// values to <out>/rank<R>.json. RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT place it (as
// torchrun does); without them it runs alone. --fail-mode makes one rank leave before compute.
// It also records how long the updates and each compute took (for measurements, not checked).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "volt/core/error.h"
#include "volt/core/strings.h"
#include "volt/distributed/process_group.h"
#include "volt/metrics/metrics.h"

namespace {

struct ProbeOptions {
  std::string out;
  int64_t seed = 0;
  int64_t examples = 101;
  int64_t classes = 5;
  int64_t timeout_ms = 120000;     // the process group's collective timeout
  std::string fail_mode = "none";  // none | exit (leave before compute) | hang (never call compute)
  int64_t fail_rank = -1;
  int64_t batch_scale = 1;  // batches of {7, 3, 12, 1, 5} times this many examples
};

int64_t env_int(const char* name, int64_t fallback) {
  const char* value = std::getenv(name);
  return value == nullptr ? fallback : std::stoll(value);
}

volt::Topology topology_from_env() {
  volt::Topology t;
  t.world_size = env_int("WORLD_SIZE", 1);
  t.global_rank = env_int("RANK", 0);
  t.local_rank = t.global_rank;
  t.processes_per_node = t.world_size;
  if (const char* address = std::getenv("MASTER_ADDR")) t.main_address = address;
  t.main_port = static_cast<int>(env_int("MASTER_PORT", 0));
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  t.host = host;
  return t;
}

/// The data every rank builds alike: class scores with ties, labels, binary scores, regression.
struct Data {
  torch::Tensor logits, target, binary_scores, binary_target, regression, regression_target;
};

Data make_data(const ProbeOptions& o) {
  torch::manual_seed(o.seed);
  Data d;
  // Scores rounded to 0.1 and 0.05: many ties, which AUROC must rank alike however it is split.
  d.logits = (torch::randn({o.examples, o.classes}) * 10).round() / 10;
  d.target = torch::randint(0, o.classes, {o.examples}, torch::kLong);
  d.binary_scores = (torch::rand({o.examples}) * 20).round() / 20;
  d.binary_target = torch::randint(0, 2, {o.examples}, torch::kLong);
  d.regression = torch::randn({o.examples, 3});
  d.regression_target = torch::randn({o.examples, 3});
  return d;
}

/// A metric and the inputs it is updated with, out of one batch of Data.
struct Entry {
  std::string name;
  std::unique_ptr<volt::Metric> metric;
  std::function<void(volt::Metric&, const Data&)> update;
};

std::vector<Entry> make_metrics(int64_t classes) {
  using volt::Average;
  const auto classification = [](volt::Metric& m, const Data& d) { m.update(d.logits, d.target); };
  std::vector<Entry> entries;
  const auto add = [&](std::string name, std::unique_ptr<volt::Metric> metric,
                       std::function<void(volt::Metric&, const Data&)> update) {
    entries.push_back({std::move(name), std::move(metric), std::move(update)});
  };
  for (const Average average : {Average::kMicro, Average::kMacro}) {
    const std::string suffix = std::string("_") + volt::to_string(average);
    const volt::ClassificationOptions top1{.num_classes = classes, .average = average};
    add("accuracy" + suffix, std::make_unique<volt::MulticlassAccuracy>(top1), classification);
    add("accuracy_top2" + suffix,
        std::make_unique<volt::MulticlassAccuracy>(
            volt::ClassificationOptions{.num_classes = classes, .top_k = 2, .average = average}),
        classification);
    add("precision" + suffix, std::make_unique<volt::MulticlassPrecision>(top1), classification);
    add("recall" + suffix, std::make_unique<volt::MulticlassRecall>(top1), classification);
    add("f1" + suffix, std::make_unique<volt::MulticlassF1Score>(top1), classification);
  }
  add("auroc_binary", std::make_unique<volt::BinaryAUROC>(),
      [](volt::Metric& m, const Data& d) { m.update(d.binary_scores, d.binary_target); });
  add("auroc_multiclass", std::make_unique<volt::MulticlassAUROC>(classes),
      [](volt::Metric& m, const Data& d) { m.update(d.logits.softmax(1), d.target); });
  add("mse", std::make_unique<volt::MeanSquaredError>(),
      [](volt::Metric& m, const Data& d) { m.update(d.regression, d.regression_target); });
  add("confusion_matrix", std::make_unique<volt::MulticlassConfusionMatrix>(classes), classification);
  return entries;
}

Data rows(const Data& d, int64_t start, int64_t size) {
  return {d.logits.narrow(0, start, size),        d.target.narrow(0, start, size),
          d.binary_scores.narrow(0, start, size), d.binary_target.narrow(0, start, size),
          d.regression.narrow(0, start, size),    d.regression_target.narrow(0, start, size)};
}

nlohmann::json to_json(const torch::Tensor& value) {
  if (value.dim() == 0) return value.item<double>();
  const torch::Tensor flat = value.to(torch::kLong).contiguous().view({-1});
  return std::vector<int64_t>(flat.data_ptr<int64_t>(), flat.data_ptr<int64_t>() + flat.numel());
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

int run(const ProbeOptions& o) {
  const volt::Topology topology = topology_from_env();
  const int64_t rank = topology.global_rank;
  const int64_t world = topology.world_size;
  std::unique_ptr<volt::ProcessGroup> group;
  if (world > 1) {
    group = std::make_unique<volt::ProcessGroup>(
        topology, volt::ProcessGroupOptions{.timeout = std::chrono::milliseconds(o.timeout_ms)});
  }
  volt::Collectives& collectives = group ? *group : volt::local_collectives();

  const Data data = make_data(o);
  // This rank's contiguous shard, unpadded: the shards of 101 examples over 3 ranks are 33, 34, 34.
  const int64_t start = o.examples * rank / world;
  const int64_t end = o.examples * (rank + 1) / world;
  std::vector<Entry> metrics = make_metrics(o.classes);
  const auto started = std::chrono::steady_clock::now();
  const int64_t sizes[] = {7, 3, 12, 1, 5};  // uneven batches; the last one of a shard is shorter
  int64_t batches = 0;
  for (int64_t at = start; at < end; ++batches) {
    const int64_t size = std::min(sizes[batches % 5] * o.batch_scale, end - at);
    const Data batch = rows(data, at, size);
    for (Entry& e : metrics) e.update(*e.metric, batch);
    at += size;
  }

  if (rank == o.fail_rank && o.fail_mode == "exit") return 0;  // leaves without compute()
  if (rank == o.fail_rank && o.fail_mode == "hang") {
    std::this_thread::sleep_for(std::chrono::seconds(300));
    return 0;
  }
  nlohmann::json out;
  out["rank"] = rank;
  out["world_size"] = world;
  out["examples"] = end - start;
  out["batches"] = batches;
  const auto updated = std::chrono::steady_clock::now();
  try {
    for (Entry& e : metrics) {
      const auto before = std::chrono::steady_clock::now();
      out["values"][e.name] = to_json(e.metric->compute(collectives));
      out["update_counts"][e.name] = e.metric->update_count();
      out["compute_seconds"][e.name] = seconds_since(before);
    }
  } catch (const volt::Error& e) {
    if (!group) throw;
    // Every rank still running gets here; the ranks that do not are the ones that left.
    const auto absent = group->absent_ranks("metric_probe/compute", std::chrono::seconds(3));
    std::string who = "rank 0, which serves the rendezvous store, is gone";
    if (absent && !absent->empty()) {
      std::vector<std::string> names;
      for (const int64_t r : *absent) names.push_back("rank " + std::to_string(r));
      who = volt::join(names, ", ") + " never reached compute()";
    } else if (absent) {
      who = "every rank reached compute()";
    }
    throw volt::Error(fmt::format("rank {}: computing the metrics failed, {}: {}", rank, who, e.what()));
  }
  out["update_seconds"] = std::chrono::duration<double>(updated - started).count();
  std::ofstream(o.out + "/rank" + std::to_string(rank) + ".json") << out.dump();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("Volt's metrics probe: every built-in metric over a sharded data set", "metric_probe");
  ProbeOptions o;
  app.add_option("--out", o.out, "directory for rank<R>.json")->required();
  app.add_option("--seed", o.seed, "the data set's seed");
  app.add_option("--examples", o.examples, "the data set's size");
  app.add_option("--classes", o.classes, "the number of classes");
  app.add_option("--timeout-ms", o.timeout_ms, "the process group's collective timeout");
  app.add_option("--fail-mode", o.fail_mode, "none, exit (leave before compute) or hang (never compute)");
  app.add_option("--fail-rank", o.fail_rank, "the rank that fails");
  app.add_option("--batch-scale", o.batch_scale, "multiplies the batch sizes (7, 3, 12, 1, 5)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  }
  try {
    return run(o);
  } catch (const std::exception& e) {
    std::cerr << "metric_probe: " << e.what() << "\n";
    return 1;
  }
}
