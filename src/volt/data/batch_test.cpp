#include "volt/data/batch.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "volt/core/error.h"
#include "volt/core/testing.h"

namespace volt {
namespace {

/// Example i: an image-like input, a label, a mask, and i + 1 boxes (varying size).
Example example(int64_t i) {
  Example e;
  e.data = torch::full({2, 3}, static_cast<float>(i));
  e.target = torch::tensor(i);
  e.tensors["mask"] = torch::ones({3}) * i;
  e.lists["boxes"] = torch::full({i + 1, 4}, static_cast<float>(i));
  return e;
}

TEST(Batch, DefaultCollateStacksTensorsAndKeepsListsPerExample) {
  const Batch batch = default_collate({example(0), example(1), example(2)});
  EXPECT_EQ(batch.size(), 3);
  EXPECT_EQ(batch.data.sizes(), (std::vector<int64_t>{3, 2, 3}));
  EXPECT_EQ(batch.target.sizes(), (std::vector<int64_t>{3}));
  EXPECT_EQ(batch.at("mask").sizes(), (std::vector<int64_t>{3, 3}));
  EXPECT_EQ(batch.at("mask")[2][0].item<float>(), 2.0f);
  ASSERT_EQ(batch.list("boxes").size(), 3u);
  EXPECT_EQ(batch.list("boxes")[2].sizes(), (std::vector<int64_t>{3, 4}));
}

TEST(Batch, DefaultCollateRefusesUnequalShapesNamingTheFieldAndTheExamples) {
  std::vector<Example> examples = {example(0), example(1)};
  examples[1].tensors["mask"] = torch::ones({5});
  const std::string message = testing::error_message([&] { default_collate(examples); });
  EXPECT_NE(message.find("cannot stack 'mask': example 0 has shape [3] but example 1 has [5]"), std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT: put tensors whose size varies in Example::lists"), std::string::npos) << message;

  examples = {example(0), example(1)};
  examples[1].tensors.erase("mask");
  examples[1].tensors["other"] = torch::ones({3});
  EXPECT_NE(
      testing::error_message([&] { default_collate(examples); }).find("example 0 has 'mask' but example 1 does not"),
      std::string::npos);
  examples = {example(0), example(1)};
  examples[1].target = torch::Tensor();
  EXPECT_NE(
      testing::error_message([&] { default_collate(examples); }).find("example 0 has 'target' but example 1 does not"),
      std::string::npos);
}

TEST(Batch, SliceAndMapReachEveryTensor) {
  const Batch batch = default_collate({example(0), example(1), example(2), example(3)});
  const Batch piece = batch.slice(1, 2);
  EXPECT_EQ(piece.size(), 2);
  EXPECT_EQ(piece.data[0][0][0].item<float>(), 1.0f);
  EXPECT_EQ(piece.at("mask")[1][0].item<float>(), 2.0f);
  ASSERT_EQ(piece.list("boxes").size(), 2u);
  EXPECT_EQ(piece.list("boxes")[1].size(0), 3);

  int64_t seen = 0;
  const Batch doubled = batch.map([&](const torch::Tensor& t) {
    ++seen;
    return t * 2;
  });
  EXPECT_EQ(seen, 3 + 4);  // data, target, mask, and 4 boxes
  EXPECT_EQ(doubled.list("boxes")[3][0][0].item<float>(), 6.0f);
  EXPECT_EQ(doubled.target[3].item<int64_t>(), 6);
}

TEST(Batch, SizeComesFromWhateverTheBatchHolds) {
  Batch only_named;
  only_named.tensors["ids"] = torch::zeros({5, 7});
  EXPECT_EQ(only_named.size(), 5);
  Batch only_lists;
  only_lists.lists["tokens"] = {torch::zeros({3}), torch::zeros({9})};
  EXPECT_EQ(only_lists.size(), 2);
  EXPECT_EQ(Batch{}.size(), 1);
}

TEST(Batch, MissingNamesAndUnevenSizesAreClearErrors) {
  const Batch batch = default_collate({example(0), example(1)});
  EXPECT_NE(testing::error_message([&] { batch.at("masks"); }).find("no tensor 'masks'; its named tensors are 'mask'"),
            std::string::npos);
  EXPECT_NE(testing::error_message([&] { batch.list("box"); }).find("no list 'box'; its lists are 'boxes'"),
            std::string::npos);
  Batch uneven = batch;
  uneven.tensors["mask"] = torch::ones({3, 3});
  EXPECT_NE(
      testing::error_message([&] { uneven.check_sizes("dp"); }).find("'mask' has shape [3, 3] while the batch has 2"),
      std::string::npos);
  EXPECT_NO_THROW(batch.check_sizes("dp"));
}

}  // namespace
}  // namespace volt
