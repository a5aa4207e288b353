#include "volt/checkpoint/async_writer.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <future>
#include <stdexcept>
#include <string>
#include <vector>

#include "volt/core/error.h"

namespace volt {
namespace {

TEST(HostCopy, OwnsItsTensorsSoChangingTheOriginalsLeavesItAsItWas) {
  torch::Tensor weight = torch::arange(6, torch::kFloat).reshape({2, 3});
  torch::Tensor step = torch::tensor(3);
  c10::impl::GenericDict inner(c10::StringType::get(), c10::AnyType::get());
  inner.insert("weight", weight);
  c10::impl::GenericList list(c10::AnyType::get());
  list.push_back(step);
  list.push_back(c10::ivalue::Tuple::create({c10::IValue(weight), c10::IValue(std::string("name"))}));
  c10::impl::GenericDict outer(c10::StringType::get(), c10::AnyType::get());
  outer.insert("state_dict", inner);
  outer.insert("optimizer_states", list);
  outer.insert("epoch", 4);

  const c10::IValue copy = host_copy(outer);
  weight.add_(100);  // training goes on
  step.fill_(9);

  const c10::impl::GenericDict dict = copy.toGenericDict();
  EXPECT_TRUE(torch::equal(dict.at("state_dict").toGenericDict().at("weight").toTensor(),
                           torch::arange(6, torch::kFloat).reshape({2, 3})));
  const c10::List<c10::IValue> copied = dict.at("optimizer_states").toList();
  EXPECT_EQ(copied.get(0).toTensor().item<int64_t>(), 3);
  const auto& tuple = copied.get(1).toTupleRef().elements();
  EXPECT_EQ(tuple[0].toTensor()[0][0].item<float>(), 0.0f);
  EXPECT_EQ(tuple[1].toStringRef(), "name");
  EXPECT_EQ(dict.at("epoch").toInt(), 4);
}

TEST(HostBuffers, TheNextCopyWritesIntoThePreviousCopysMemoryWhenTheShapesAgree) {
  HostBuffers buffers;
  c10::impl::GenericDict state(c10::StringType::get(), c10::AnyType::get());
  torch::Tensor weight = torch::ones({3, 4});
  state.insert("w", weight);
  state.insert("step", torch::tensor(1));
  const c10::IValue first = buffers.copy(state);
  const void* memory = first.toGenericDict().at("w").toTensor().data_ptr();
  EXPECT_NE(memory, weight.data_ptr()) << "a copy, not the training tensor";
  EXPECT_EQ(buffers.bytes(), 12 * 4 + 8);

  weight.fill_(2);
  const c10::IValue second = buffers.copy(state);
  const torch::Tensor copied = second.toGenericDict().at("w").toTensor();
  EXPECT_EQ(copied.data_ptr(), memory) << "the same buffer";
  EXPECT_TRUE(torch::equal(copied, torch::full({3, 4}, 2.0)));

  state.insert_or_assign("w", torch::zeros({5}));  // another shape: a buffer of its own
  const c10::IValue third = buffers.copy(state);
  EXPECT_EQ(third.toGenericDict().at("w").toTensor().sizes(), torch::IntArrayRef({5}));
  EXPECT_EQ(buffers.bytes(), 5 * 4 + 8);
}

TEST(HostBuffers, ATensorMetTwiceIsCopiedOnceAndStaysOneTensor) {
  // Two checkpoints of one save hold the same parameters; a tied weight is one tensor in two places.
  HostBuffers buffers;
  torch::Tensor weight = torch::arange(6, torch::kFloat).reshape({2, 3});
  c10::impl::GenericList state(c10::AnyType::get());
  for (int i = 0; i < 2; ++i) {
    c10::impl::GenericDict checkpoint(c10::StringType::get(), c10::AnyType::get());
    checkpoint.insert("w", weight);
    checkpoint.insert("first_row", weight[0]);  // another view of the same memory: a copy of its own
    state.push_back(checkpoint);
  }
  const c10::IValue copy = buffers.copy(state);
  const auto copies = copy.toListRef();
  const torch::Tensor a = copies[0].toGenericDict().at("w").toTensor();
  const torch::Tensor b = copies[1].toGenericDict().at("w").toTensor();
  EXPECT_TRUE(a.is_same(b));
  EXPECT_NE(a.data_ptr(), weight.data_ptr());
  EXPECT_TRUE(torch::equal(copies[1].toGenericDict().at("first_row").toTensor(), torch::tensor({0.0F, 1.0F, 2.0F})));
  EXPECT_EQ(buffers.bytes(), (6 + 3) * 4) << "w once, the row view once";

  const c10::IValue fresh = host_copy(state);
  EXPECT_TRUE(fresh.toListRef()[0].toGenericDict().at("w").toTensor().is_same(
      fresh.toListRef()[1].toGenericDict().at("w").toTensor()));
}

TEST(AsyncWriter, RunsAWriteInTheBackgroundAndWaitReturnsWhenItIsDone) {
  AsyncWriter writer;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::promise<void> started;
  bool written = false;
  writer.submit([&] {
    started.set_value();
    released.wait();
    written = true;
  });
  started.get_future().wait();
  EXPECT_TRUE(writer.busy()) << "the write waits for the test";
  release.set_value();
  writer.wait();
  EXPECT_TRUE(written);
  EXPECT_FALSE(writer.busy());
  EXPECT_EQ(writer.stats().writes, 1);
}

TEST(AsyncWriter, WritesRunOneAtATimeInTheOrderSubmitted) {
  AsyncWriter writer;
  std::vector<int> order;
  for (int i = 0; i < 5; ++i) writer.submit([&order, i] { order.push_back(i); });
  writer.wait();
  EXPECT_EQ(order, (std::vector<int>{0, 1, 2, 3, 4}));
  EXPECT_EQ(writer.stats().writes, 5);
}

TEST(AsyncWriter, ATaskQueuedWithThenRunsAfterTheWriteBeforeItWithoutWaiting) {
  AsyncWriter writer;
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<std::string> order;
  writer.submit([&] {
    released.wait();
    order.push_back("write new");
  });
  writer.then([&] { order.push_back("remove old"); });  // returns while the write still waits
  EXPECT_TRUE(writer.busy());
  release.set_value();
  writer.wait();
  EXPECT_EQ(order, (std::vector<std::string>{"write new", "remove old"}));
}

TEST(AsyncWriter, AFailedWriteIsRethrownOnTheCallersThreadOnceAndTheWriterGoesOn) {
  AsyncWriter writer;
  writer.submit([] { throw CheckpointError("disk full writing snapshot_3.ckpt"); });
  EXPECT_THROW(
      {
        try {
          writer.wait();
        } catch (const CheckpointError& e) {
          EXPECT_NE(std::string(e.what()).find("disk full"), std::string::npos);
          throw;
        }
      },
      CheckpointError);
  bool written = false;
  writer.submit([&] { written = true; });
  writer.wait();
  EXPECT_TRUE(written);
}

TEST(AsyncWriter, TheDestructorLetsTheWriteInFlightFinish) {
  bool written = false;
  {
    AsyncWriter writer;
    writer.submit([&] { written = true; });
  }
  EXPECT_TRUE(written);
}

}  // namespace
}  // namespace volt
