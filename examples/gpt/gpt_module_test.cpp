// The example module's pieces: AdamW's parameter groups and schedule, the held-out split, and the
// byte-level text (round trip, printable decoding, windows).
#include "gpt/gpt_module.h"

#include <gtest/gtest.h>

#include "volt/core/testing.h"

namespace gpt {
namespace {

GptModuleOptions tiny_options() {
  GptModuleOptions options;
  options.model = GptConfig{.n_layer = 1, .n_head = 2, .n_embd = 16, .n_positions = 8, .vocab_size = 256};
  options.warmup_steps = 4;
  options.lr_decay_steps = 20;
  return options;
}

TEST(GptModule, DecaysMatricesAndEmbeddingsOnly) {
  GptModule module(tiny_options());
  const volt::OptimizerConfig config = module.configure_optimizers();
  ASSERT_EQ(config.optimizers.size(), 1u);
  const auto& groups = config.optimizers[0]->param_groups();
  ASSERT_EQ(groups.size(), 2u);
  // wte, wpe and the four projection weights; then the four projection biases and the weights and
  // biases of ln_1, ln_2 and ln_f.
  EXPECT_EQ(groups[0].params().size(), 6u);
  EXPECT_EQ(groups[1].params().size(), 10u);
  for (const torch::Tensor& p : groups[0].params()) EXPECT_GE(p.dim(), 2);
  for (const torch::Tensor& p : groups[1].params()) EXPECT_EQ(p.dim(), 1);
  EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(groups[0].options()).weight_decay(), 0.1);
  EXPECT_EQ(static_cast<const torch::optim::AdamWOptions&>(groups[1].options()).weight_decay(), 0.0);
  ASSERT_EQ(config.schedulers.size(), 1u);
  EXPECT_EQ(config.schedulers[0].interval, volt::Interval::kStep);
}

// The lr of the first group after each of `steps` scheduler steps, from step 0 (construction) on.
std::vector<double> lrs(const volt::OptimizerConfig& config, int steps) {
  std::vector<double> out{config.optimizers[0]->param_groups()[0].options().get_lr()};
  for (int i = 0; i < steps; ++i) {
    config.schedulers[0].scheduler->step();
    out.push_back(config.optimizers[0]->param_groups()[0].options().get_lr());
  }
  return out;
}

TEST(GptModule, WarmsUpThenDecaysAlongACosineToItsFloor) {
  GptModuleOptions options = tiny_options();  // lr 1e-3, warmup 4 of 20 steps, floor 0.1 lr
  GptModule module(options);
  const std::vector<double> lr = lrs(module.configure_optimizers(), 25);
  EXPECT_DOUBLE_EQ(lr[0], 0.0);
  EXPECT_DOUBLE_EQ(lr[2], 0.5e-3);
  EXPECT_DOUBLE_EQ(lr[4], 1e-3);
  EXPECT_NEAR(lr[12], 0.55e-3, 1e-12);  // halfway down the cosine
  EXPECT_NEAR(lr[20], 1e-4, 1e-12);
  EXPECT_NEAR(lr[25], 1e-4, 1e-12);
  // Without --warmup-steps the warmup is a tenth of the decay: 2 of 20 steps.
  options.warmup_steps = 0;
  GptModule auto_warmup(options);
  const std::vector<double> short_warmup = lrs(auto_warmup.configure_optimizers(), 2);
  EXPECT_DOUBLE_EQ(short_warmup[1], 0.5e-3);
  EXPECT_DOUBLE_EQ(short_warmup[2], 1e-3);
}

TEST(GptModule, RefusesAScheduleWithoutALength) {
  GptModuleOptions options = tiny_options();
  options.lr_decay_steps = 0;  // outside a fit the run's steps are unknown
  std::string message = volt::testing::error_message([&] { GptModule(options).configure_optimizers(); });
  EXPECT_NE(message.find("the learning-rate decay has no length"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT: pass --max-steps N or --lr-decay-steps N"), std::string::npos) << message;
  options.lr_decay_steps = 4;
  message = volt::testing::error_message([&] { GptModule(options).configure_optimizers(); });
  EXPECT_NE(message.find("--warmup-steps=4 leaves no decay"), std::string::npos) << message;
}

TEST(GptModule, HoldsOutTheTextsEndForValidation) {
  GptModuleOptions options = tiny_options();  // windows of 8 + 1 bytes
  options.batch_size = 1;
  options.text = volt::testing::write_scratch_file("text.txt", std::string(100, 'a'));
  GptModule module(options);
  // 90 bytes train (11 windows of 8 targets), the last 10 validate (1 window).
  EXPECT_EQ(module.train_dataloader().num_batches(), 11);
  EXPECT_EQ(module.val_dataloader().num_batches(), 1);
  options.text = volt::testing::write_scratch_file("short.txt", "abcdefgh");
  const std::string message = volt::testing::error_message([&] { GptModule(options).train_dataloader(); });
  EXPECT_NE(message.find("8 bytes leave 8 for training, less than one window of --block-size + 1 = 9 bytes"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
}

TEST(GptModule, TrainsOnWindowsShorterThanTheModelsContextWhenAskedTo) {
  GptModuleOptions options = tiny_options();  // n_positions 8
  options.block_size = 4;
  options.batch_size = 1;
  options.text = volt::testing::write_scratch_file("text.txt", std::string(100, 'a'));
  GptModule module(options);
  // 90 bytes train: 22 windows of 4 + 1 bytes, each starting 4 after the one before; the last 10
  // validate (2 windows).
  volt::DataLoader train = module.train_dataloader();
  EXPECT_EQ(train.num_batches(), 22);
  EXPECT_EQ(module.val_dataloader().num_batches(), 2);
  train.set_epoch(0);
  const volt::Batch batch = train.batch(0);
  EXPECT_EQ(batch.data.sizes(), torch::IntArrayRef({1, 4}));
  EXPECT_EQ(module.transformer()->config().n_positions, 8);  // the model keeps its context
  options.block_size = 9;
  const std::string message = volt::testing::error_message([&] { GptModule{options}; });
  EXPECT_NE(message.find("--block-size=9 cannot be the training window of this model: expected 2..n_positions=8"),
            std::string::npos)
      << message;
}

TEST(ByteText, RoundTripsTextAndEscapesWhatIsNotPrintable) {
  EXPECT_EQ(decode_bytes(encode_bytes("héllo\n\tworld")), "héllo\n\tworld");
  // A lone continuation byte, a truncated sequence and a control character.
  EXPECT_EQ(decode_bytes(torch::tensor({0x41, 0x80, 0xc3, 0x07, 0x42}, torch::kLong)), "A\\x80\\xc3\\x07B");
  // An overlong form, a surrogate and a code point past U+10FFFF are not UTF-8 either.
  EXPECT_EQ(decode_bytes(torch::tensor({0xc0, 0xaf, 0xed, 0xa0, 0x80, 0xf4, 0x90, 0x80, 0x80}, torch::kLong)),
            "\\xc0\\xaf\\xed\\xa0\\x80\\xf4\\x90\\x80\\x80");
}

TEST(ByteText, CutsNonOverlappingWindowsWithTargetsShiftedByOne) {
  const torch::Tensor tokens = torch::arange(10, torch::kLong);
  const std::shared_ptr<volt::Dataset> windows = token_windows(tokens, 3);
  ASSERT_EQ(windows->size(), 3);  // [0..3], [3..6], [6..9]
  const volt::Batch batch = windows->get_batch(torch::tensor({1, 2}, torch::kLong));
  EXPECT_TRUE(torch::equal(batch.data, torch::tensor({3, 4, 5, 6, 7, 8}, torch::kLong).view({2, 3})));
  EXPECT_TRUE(torch::equal(batch.target, torch::tensor({4, 5, 6, 7, 8, 9}, torch::kLong).view({2, 3})));
  const std::string message = volt::testing::error_message([&] { token_windows(tokens, 10); });
  EXPECT_NE(message.find("10 tokens make no window of block_size + 1 = 11 tokens"), std::string::npos) << message;
}

}  // namespace
}  // namespace gpt
