#include "volt/tuner/tuner.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "volt/core/testing.h"
#include "volt/data/data_loader.h"
#include "volt/data/dataset.h"
#include "volt/module/lightning_module.h"

namespace volt {
namespace {

using volt::testing::error_message;

/// Linear regression on 400 examples whose train_dataloader reads hparams()["batch_size"];
/// optionally runs out of memory above a batch size, or holds `mb_per_example` MiB per example
/// in its step, as a large activation would.
class Regression : public LightningModule {
 public:
  explicit Regression(int64_t batch_size = 8) : LightningModule("Regression") {
    linear_ = register_module("linear", torch::nn::Linear(4, 1));
    const torch::Tensor x = torch::randn({400, 4});
    const torch::Tensor y = x.matmul(torch::tensor({1.0, -2.0, 0.5, 3.0}).unsqueeze(1)) + 0.1;
    data_ = std::make_shared<TensorDataset>(x, y);
    save_hyperparameters({{"batch_size", batch_size}});
  }
  torch::Tensor training_step(const Batch& batch, int64_t) override {
    const int64_t size = batch.size();
    if (oom_above && size > *oom_above) {
      throw std::runtime_error(
          fmt::format("DefaultCPUAllocator: can't allocate memory: you tried to allocate {} bytes", size << 30));
    }
    if (mb_per_example > 0) {
      // Memory the step touches and gives back, mapped apart from the heap so that what the
      // heap keeps or fragments cannot blur the figure: exactly size x mb_per_example MiB.
      const size_t bytes = static_cast<size_t>(size * mb_per_example) << 20;
      void* scratch = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (scratch == MAP_FAILED) throw std::runtime_error("mmap failed: out of memory");
      std::memset(scratch, 1, bytes);
      ::munmap(scratch, bytes);
    }
    return torch::mse_loss(linear_->forward(batch.data), batch.target);
  }
  OptimizerConfig configure_optimizers() override {
    return OptimizerConfig(std::make_shared<torch::optim::SGD>(parameters(), torch::optim::SGDOptions(0.01)));
  }
  DataLoader train_dataloader() override {
    return DataLoader(data_, {.batch_size = hparams()["batch_size"].get<int64_t>(), .shuffle = true});
  }
  std::optional<int64_t> oom_above;
  int64_t mb_per_example = 0;

 private:
  torch::nn::Linear linear_{nullptr};
  std::shared_ptr<TensorDataset> data_;
};

std::vector<torch::Tensor> values_of(torch::nn::Module& module) {
  std::vector<torch::Tensor> out;
  for (const auto& p : module.parameters()) out.push_back(p.detach().clone());
  return out;
}

bool same(const std::vector<torch::Tensor>& a, const std::vector<torch::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!torch::equal(a[i], b[i])) return false;
  }
  return true;
}

Tuner make_tuner(TrainerOptions options = {}) {
  options.num_threads = 1;
  options.default_root_dir = "/tmp/volt_tuner_test";
  return Tuner(std::move(options), Env(Env::Vars{}), MachineInfo{1, "/tmp"});
}

TEST(LrFind, SweepsExponentiallyAndLinearly) {
  LrFindOptions o{.min_lr = 1e-6, .max_lr = 1.0, .num_training = 6};
  EXPECT_DOUBLE_EQ(lr_at(o, 0), 1e-6);
  EXPECT_NEAR(lr_at(o, 3), 1e-3, 1e-15);
  EXPECT_NEAR(lr_at(o, 6), 1.0, 1e-12);
  o.mode = LrFindMode::kLinear;
  EXPECT_DOUBLE_EQ(lr_at(o, 3), 1e-6 + (1.0 - 1e-6) * 0.5);
  EXPECT_EQ(parse_lr_find_mode(" Linear "), LrFindMode::kLinear);
  EXPECT_NE(error_message([] { parse_lr_find_mode("cosine"); }).find("HINT:"), std::string::npos);
}

TEST(LrFind, SuggestsTheSteepestDescentInsideTheWindow) {
  //                               0    1    2    3    4    5    6    7
  const std::vector<double> loss = {9.0, 1.0, 1.0, 0.9, 0.5, 0.3, 0.29, 50.0};
  // Skipping the first step (its drop from 9 is start-up) and the last (divergence): the
  // steepest central difference is at 4 ((0.3 - 0.9) / 2).
  EXPECT_EQ(steepest_descent(loss, 1, 1), 4u);
  EXPECT_EQ(steepest_descent(loss, 0, 0), 0u) << "without the window the start-up drop wins";
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(steepest_descent({1.0, nan, 0.5, 0.4}, 0, 0), 0u) << "non-finite losses are left out";
  EXPECT_FALSE(steepest_descent({1.0, 0.5}, 1, 0)) << "fewer than two points";
}

TEST(LrFind, FindsARateAndPutsTheModuleAndGeneratorBack) {
  torch::manual_seed(3);
  Regression module(/*batch_size=*/32);
  const auto before = values_of(module);
  const torch::Tensor rng = at::detail::getDefaultCPUGenerator().get_state();
  Tuner tuner = make_tuner({.seed = 11});
  const LrFindResult found = tuner.lr_find(module, {.min_lr = 1e-5, .max_lr = 10.0, .num_training = 100});
  ASSERT_GE(found.lr.size(), 50u);
  EXPECT_LE(found.lr.size(), 100u);
  EXPECT_EQ(found.lr.size(), found.loss.size());
  EXPECT_DOUBLE_EQ(found.lr.front(), 1e-5);
  for (size_t i = 1; i < found.lr.size(); ++i) EXPECT_GT(found.lr[i], found.lr[i - 1]);
  ASSERT_TRUE(found.suggestion()) << found.to_csv();
  // SGD on this regression learns fastest between about 1e-2 and 1: far below, 100 steps move
  // nothing; above about 1 (2 / the inputs' largest curvature) it diverges.
  EXPECT_GT(*found.suggestion(), 1e-2) << found.to_csv();
  EXPECT_LT(*found.suggestion(), 1.0) << found.to_csv();
  EXPECT_TRUE(same(before, values_of(module))) << "the module's weights are as they were";
  EXPECT_TRUE(torch::equal(rng, at::detail::getDefaultCPUGenerator().get_state())) << "the generator too";
  const std::string csv = found.to_csv();
  EXPECT_EQ(csv.rfind("step,lr,loss,suggested\n", 0), 0u);
  EXPECT_NE(csv.find(",1\n"), std::string::npos) << "the suggested step is marked";
}

TEST(LrFind, StopsWhenTheLossDiverges) {
  torch::manual_seed(3);
  Regression module;
  Tuner tuner = make_tuner();
  const LrFindResult found = tuner.lr_find(module, {.min_lr = 1e-3, .max_lr = 1e4, .num_training = 100});
  EXPECT_LT(found.lr.size(), 90u) << "SGD diverges long before 1e4";
  const LrFindResult all =
      tuner.lr_find(module, {.min_lr = 1e-3, .max_lr = 1e4, .num_training = 100, .early_stop_threshold = {}});
  EXPECT_GT(all.lr.size(), found.lr.size()) << "no threshold: no early stop";
}

TEST(LrFind, RefusesBadOptionsAndSeveralProcesses) {
  Regression module;
  Tuner tuner = make_tuner();
  const std::string bad = error_message([&] { tuner.lr_find(module, {.min_lr = 1.0, .max_lr = 0.1}); });
  EXPECT_NE(bad.find("min_lr=1"), std::string::npos) << bad;
  EXPECT_NE(bad.find("HINT:"), std::string::npos) << bad;
  Tuner ddp = make_tuner({.devices = DeviceRequest("2"), .strategy = StrategyRequest::kDdp});
  const std::string many = error_message([&] { ddp.lr_find(module); });
  EXPECT_NE(many.find("runs in one process"), std::string::npos) << many;
  EXPECT_NE(many.find("--devices 1"), std::string::npos) << many;
}

TEST(BatchSizeSearch, PowerDoublesUntilTooLargeAndBinsearchBisects) {
  const auto fits_up_to = [](int64_t limit) {
    return [limit](int64_t size) { return size <= limit ? TrialOutcome::kFits : TrialOutcome::kTooLarge; };
  };
  EXPECT_EQ(search_batch_size({.mode = BatchSizeMode::kPower}, fits_up_to(48)), 32);
  EXPECT_EQ(search_batch_size({.mode = BatchSizeMode::kBinsearch}, fits_up_to(48)), 48);
  EXPECT_EQ(search_batch_size({.mode = BatchSizeMode::kBinsearch, .init_val = 3}, fits_up_to(1000)), 1000);
  EXPECT_EQ(search_batch_size({.mode = BatchSizeMode::kPower, .max_trials = 3}, fits_up_to(1000)), 8)
      << "2, 4, 8: the trials ran out";
  std::vector<int64_t> tried;
  const auto data_of_20 = [&tried](int64_t size) {
    tried.push_back(size);
    return size >= 20 ? TrialOutcome::kDataTooSmall : TrialOutcome::kFits;
  };
  EXPECT_EQ(search_batch_size({}, data_of_20), 32);
  EXPECT_EQ(tried, (std::vector<int64_t>{2, 4, 8, 16, 32})) << "nothing beyond a batch that holds all the data";
  const std::string first = error_message([&] { search_batch_size({.init_val = 64}, fits_up_to(48)); });
  EXPECT_NE(first.find("even the first size tried, 64"), std::string::npos) << first;
  EXPECT_NE(first.find("HINT:"), std::string::npos) << first;
}

TEST(ScaleBatchSize, FindsTheLargestSizeThatDoesNotRunOutOfMemory) {
  torch::manual_seed(5);
  Regression module(/*batch_size=*/8);
  module.oom_above = 40;
  const auto before = values_of(module);
  Tuner tuner = make_tuner();
  EXPECT_EQ(tuner.scale_batch_size(module, {.mode = BatchSizeMode::kPower}), 32);
  EXPECT_EQ(module.hparams()["batch_size"], 32) << "the module is left at the result";
  EXPECT_EQ(tuner.scale_batch_size(module, {.mode = BatchSizeMode::kBinsearch}), 40);
  EXPECT_TRUE(same(before, values_of(module)));
  int64_t set = 0;
  EXPECT_EQ(tuner.scale_batch_size(module, {.set_batch_size =
                                                [&](int64_t b) {
                                                  set = b;
                                                  module.save_hyperparameters({{"batch_size", b}});
                                                }}),
            32);
  EXPECT_EQ(set, 32) << "a setter takes the hyperparameter's place";
}

TEST(ScaleBatchSize, KeepsUnderAMemoryLimit) {
  torch::manual_seed(5);
  Regression module;
  // A batch of 4 takes 64 MiB, of 8 128 MiB: 32 MiB of room either side of the limit.
  module.mb_per_example = 16;
  Tuner tuner = make_tuner();
  EXPECT_EQ(tuner.scale_batch_size(module, {.max_memory_mb = 96.0}), 4);
}

TEST(ScaleBatchSize, NamesAMissingHyperparameterAndPassesOtherErrorsOn) {
  Regression module;
  module.save_hyperparameters({{"lr", 0.1}});
  Tuner tuner = make_tuner();
  const std::string missing = error_message([&] { tuner.scale_batch_size(module, {}); });
  EXPECT_NE(missing.find("hyperparameter 'batch_size'"), std::string::npos) << missing;
  EXPECT_NE(missing.find("set_batch_size"), std::string::npos) << missing;
}

}  // namespace
}  // namespace volt
