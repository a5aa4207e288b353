// A small program for the multi-process SyncBatchNorm tests (tests/ddp/test_syncbn.py): a conv
// net with two BatchNorm layers trains k SGD steps on its rank's rows of one fixed batch and
// writes, per rank, its rows' outputs of the first forward, the running statistics after each
// step and the final parameters and buffers as JSON.
//
// The ranks come from torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), which
// the test sets for each process it starts; without WORLD_SIZE the program is one process and
// joins no group. Flags inject a failure: a rank killed or hung just before the first forward.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include "volt/cli/run_main.h"
#include "volt/cli/trainer_flags.h"
#include "volt/core/env.h"
#include "volt/core/error.h"
#include "volt/distributed/gradient_synchronizer.h"
#include "volt/distributed/process_group.h"
#include "volt/volt.h"

namespace {

struct ProbeOptions {
  std::string out;
  int64_t batch = 16;  // the whole batch, over every rank
  int64_t steps = 3;
  double lr = 0.5;
  std::string norm = "sync";   // sync: volt::SyncBatchNorm; plain: torch::nn::BatchNorm2d (one process only)
  std::vector<int64_t> split;  // rows per rank; empty: as even as possible
  int64_t timeout_ms = 120000;
  std::string fail_mode = "none";  // none | kill | hang
  int64_t fail_rank = -1;
  bool detached = false;  // no enable_sync_batchnorm: each rank normalizes its own rows
  bool reducer = false;   // gradients averaged by ddp's engine (c10d's Reducer) instead of all_reduce
};

/// This process's place, from torchrun's variables; one process when WORLD_SIZE is unset.
volt::Topology topology_from(const volt::Env& env) {
  volt::Topology topology;
  topology.world_size = env.get_int("WORLD_SIZE").value_or(1);
  topology.global_rank = env.get_int("RANK").value_or(0);
  topology.local_rank = topology.global_rank;
  topology.processes_per_node = topology.world_size;
  topology.main_address = env.get_or("MASTER_ADDR", "127.0.0.1");
  topology.main_port = static_cast<int>(env.get_int("MASTER_PORT").value_or(0));
  topology.host = "localhost";
  return topology;
}

/// Conv -> norm -> ReLU, twice, then a linear head over the pooled channels. The norm layers
/// sit at "1" and "4" whichever kind they are, so both kinds' state dicts have the same keys.
torch::nn::Sequential make_net(const std::string& norm) {
  torch::manual_seed(0);  // the same initial parameters on every rank and in every run
  torch::nn::Sequential net;
  const auto add_norm = [&](int64_t channels) {
    if (norm == "plain") {
      net->push_back(torch::nn::BatchNorm2d(channels));
    } else {
      net->push_back(volt::SyncBatchNorm(torch::nn::BatchNormOptions(channels)));
    }
  };
  net->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(3, 6, 3).padding(1)));
  add_norm(6);
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::Conv2d(torch::nn::Conv2dOptions(6, 4, 3)));
  add_norm(4);
  net->push_back(torch::nn::ReLU());
  net->push_back(torch::nn::AdaptiveAvgPool2d(1));
  net->push_back(torch::nn::Flatten());
  net->push_back(torch::nn::Linear(4, 3));
  return net;
}

/// The first row and the row count of `rank`'s share of `batch` rows.
std::pair<int64_t, int64_t> rows_of(const ProbeOptions& options, const volt::Topology& topology) {
  std::vector<int64_t> split = options.split;
  if (split.empty()) {
    for (int64_t r = 0; r < topology.world_size; ++r) {
      split.push_back(options.batch / topology.world_size + (r < options.batch % topology.world_size ? 1 : 0));
    }
  }
  int64_t total = 0;
  for (const int64_t rows : split) total += rows;
  VOLT_CHECK(static_cast<int64_t>(split.size()) == topology.world_size && total == options.batch,
             "--split gives {} ranks {} rows; expected {} ranks and --batch {} rows. HINT: one count per rank, "
             "summing to --batch.",
             split.size(), total, topology.world_size, options.batch);
  int64_t start = 0;
  for (int64_t r = 0; r < topology.global_rank; ++r) start += split[static_cast<size_t>(r)];
  return {start, split[static_cast<size_t>(topology.global_rank)]};
}

std::vector<double> values_of(const torch::Tensor& tensor) {
  const torch::Tensor flat = tensor.detach().to(torch::kDouble).contiguous().view({-1});
  return std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
}

nlohmann::json running_stats(const torch::nn::Module& net) {
  nlohmann::json stats;
  for (const auto& buffer : net.named_buffers()) stats[buffer.key()] = values_of(buffer.value());
  return stats;
}

int run(const ProbeOptions& options) {
  const volt::Topology topology = topology_from(volt::Env::from_process());
  std::unique_ptr<volt::ProcessGroup> group;
  if (topology.world_size > 1) {
    VOLT_CHECK(options.norm == "sync",
               "--norm {} under {} processes; expected sync. HINT: plain BatchNorm is the "
               "one-process reference.",
               options.norm, topology.world_size);
    volt::ProcessGroupOptions group_options;
    group_options.timeout = std::chrono::milliseconds(options.timeout_ms);
    group_options.join_timeout = std::chrono::seconds(30);
    group = std::make_unique<volt::ProcessGroup>(topology, group_options);
  }
  volt::Collectives& collectives = group ? static_cast<volt::Collectives&>(*group) : volt::local_collectives();

  torch::nn::Sequential net = make_net(options.norm);
  // The group outlives every forward and backward below: it is destroyed after `net` is done.
  if (!options.detached) volt::enable_sync_batchnorm(*net, collectives);
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(options.lr));
  // ddp's way: autograd hooks all-reduce gradient buckets during backward, beside the layers'
  // own backward collectives, and average them.
  std::unique_ptr<volt::ReducerSynchronizer> reducer;
  if (options.reducer && group) {
    std::vector<torch::Tensor> parameters;
    std::vector<std::string> names;
    for (const auto& parameter : net->named_parameters()) {
      parameters.push_back(parameter.value());
      names.push_back(parameter.key());
    }
    reducer =
        std::make_unique<volt::ReducerSynchronizer>(parameters, names, group->backend(), volt::GradientSyncOptions{});
  }

  torch::manual_seed(1);
  const torch::Tensor x = torch::randn({options.batch, 3, 6, 6}) * 2 + 1;
  const torch::Tensor target = torch::randint(0, 3, {options.batch}, torch::kLong);
  const auto [start, rows] = rows_of(options, topology);
  const torch::Tensor my_x = x.narrow(0, start, rows);
  const torch::Tensor my_target = target.narrow(0, start, rows);

  if (topology.global_rank == options.fail_rank) {
    if (options.fail_mode == "kill") raise(SIGKILL);
    if (options.fail_mode == "hang") std::this_thread::sleep_for(std::chrono::hours(1));
  }

  nlohmann::json out;
  out["rank"] = topology.global_rank;
  out["rows"] = {start, rows};
  for (int64_t step = 0; step < options.steps; ++step) {
    optimizer.zero_grad();
    const torch::Tensor logits = net->forward(my_x);
    if (step == 0) out["first_output"] = values_of(logits);
    // This rank's share of the whole batch's mean loss: summed over ranks, the gradients are the
    // whole batch's for any split. The Reducer averages instead of summing: scale by the ranks.
    const double scale = reducer ? static_cast<double>(topology.world_size) : 1.0;
    const torch::Tensor loss =
        torch::nn::functional::cross_entropy(logits, my_target,
                                             torch::nn::functional::CrossEntropyFuncOptions().reduction(torch::kSum)) *
        (scale / static_cast<double>(options.batch));
    if (reducer) reducer->prepare_for_backward(loss);
    loss.backward();
    if (!reducer) {
      for (auto& parameter : net->parameters()) collectives.all_reduce(parameter.mutable_grad(), volt::Reduce::kSum);
    }
    optimizer.step();
    out["running"].push_back(running_stats(*net));
  }
  for (const auto& parameter : net->named_parameters()) out["params"][parameter.key()] = values_of(parameter.value());
  std::ofstream(options.out + "/rank" + std::to_string(topology.global_rank) + ".json") << out.dump();
  if (group) group->barrier();  // rank 0 serves the store: leave together
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return volt::run_main([&] {
    CLI::App app("Volt's multi-process SyncBatchNorm probe", "syncbn_probe");
    ProbeOptions options;
    app.add_option("--out", options.out, "directory for rank<N>.json")->required();
    app.add_option("--batch", options.batch, "the whole batch's rows, over every rank");
    app.add_option("--steps", options.steps, "SGD steps");
    app.add_option("--split", options.split, "rows per rank (default: as even as possible)");
    app.add_option("--norm", options.norm, "sync (volt::SyncBatchNorm) or plain (torch::nn::BatchNorm2d)");
    app.add_option("--timeout-ms", options.timeout_ms, "the process group's collective timeout");
    app.add_option("--fail-mode", options.fail_mode, "none, kill or hang, just before the first forward");
    app.add_option("--fail-rank", options.fail_rank, "the rank that fails");
    app.add_flag("--detached", options.detached, "leave the layers unsynchronized (a control)");
    app.add_flag("--reducer", options.reducer, "average gradients with c10d's Reducer, as ddp does");
    if (const std::optional<int> code = volt::parse_command_line(app, argc, argv)) return *code;
    return run(options);
  });
}
