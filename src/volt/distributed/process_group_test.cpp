// The process group's collectives over real Gloo, with each rank a thread of this process (one
// TCPStore rendezvous on a free local port), so they are checked without launching processes.
#include "volt/distributed/process_group.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <torch/torch.h>

#include "volt/core/error.h"
#include "volt/core/testing.h"
#include "volt/distributed/testing_process_group.h"

namespace volt {
namespace {

using testing::on_ranks;

TEST(ProcessGroupTest, ReduceScatterLeavesEachRankItsChunkOfTheSumOrMean) {
  for (const int64_t world : {2, 3}) {
    on_ranks(world, [world](ProcessGroup& group) {
      const int64_t r = group.rank();
      // Rank r contributes (r + 1) * [0, 1, ..., 2 * world - 1]: the sum is that times the
      // triangle number, and rank r receives elements [2r, 2r + 2).
      const torch::Tensor values = torch::arange(2 * world, torch::kFloat) * static_cast<double>(r + 1);
      const double factor = static_cast<double>(world * (world + 1) / 2);
      const torch::Tensor sum = group.reduce_scatter(values.clone(), Reduce::kSum);
      const torch::Tensor expected = torch::arange(2 * r, 2 * r + 2, torch::kFloat) * factor;
      EXPECT_TRUE(torch::allclose(sum, expected)) << "rank " << r << " got " << sum << " expected " << expected;
      const torch::Tensor mean = group.reduce_scatter(values.clone(), Reduce::kMean);
      EXPECT_TRUE(torch::allclose(mean, expected / static_cast<double>(world)));
    });
  }
}

TEST(ProcessGroupTest, ReduceScatterRefusesALengthThatIsNoMultipleOfTheWorld) {
  EXPECT_THROW(on_ranks(2, [](ProcessGroup& group) { group.reduce_scatter(torch::zeros({3}), Reduce::kSum); }), Error);
}

TEST(ProcessGroupTest, AllGatherFlatConcatenatesEveryRanksChunkInRankOrder) {
  on_ranks(3, [](ProcessGroup& group) {
    const torch::Tensor mine = torch::full({2}, static_cast<double>(group.rank()), torch::kDouble);
    const torch::Tensor all = group.all_gather_flat(mine);
    EXPECT_TRUE(torch::equal(all, torch::tensor({0.0, 0.0, 1.0, 1.0, 2.0, 2.0}, torch::kDouble))) << all;
  });
}

TEST(ProcessGroupTest, AllGatherIntoFillsAFlatBufferWhoseOwnSliceIsTheInput) {
  on_ranks(2, [](ProcessGroup& group) {
    // fsdp's parameters: the flat buffer this rank keeps, its own chunk already in place.
    torch::Tensor flat = torch::full({4}, -1.0);
    const torch::Tensor own = flat.narrow(0, 2 * group.rank(), 2);
    own.fill_(static_cast<double>(group.rank() + 1));
    group.all_gather_into(own, flat);
    EXPECT_TRUE(torch::equal(flat, torch::tensor({1.0, 1.0, 2.0, 2.0}))) << flat;
    torch::Tensor wrong = torch::zeros({3});
    EXPECT_THROW(group.all_gather_into(own, wrong), Error);
  });
}

TEST(ProcessGroupTest, GatheringEmptyBytesOnEveryRankReturnsEmptyStrings) {
  // Gloo's allgather divides by the message size: an all-empty gather used to end in SIGFPE.
  on_ranks(2, [](ProcessGroup& group) {
    const std::vector<std::string> all = group.all_gather_bytes("");
    ASSERT_EQ(all.size(), 2U);
    EXPECT_TRUE(all[0].empty() && all[1].empty());
    // One empty among non-empty ones is padded as before.
    const std::vector<std::string> mixed = group.all_gather_bytes(group.rank() == 0 ? "" : "ab");
    EXPECT_EQ(mixed[0], "");
    EXPECT_EQ(mixed[1], "ab");
  });
}

TEST(ProcessGroupTest, APeerChannelCarriesBytesBetweenTwoRanksWhileTheOthersGoOn) {
  on_ranks(3, [](ProcessGroup& group) {
    const std::vector<char> big(3 << 20, 'x');  // more than a socket's buffers
    if (group.rank() == 0) {
      const std::unique_ptr<PeerChannel> channel = group.connect_peer(2);
      ASSERT_NE(channel, nullptr);
      channel->send(7, {'a', '\0', 'b'});
      channel->send(8, big);
      channel->send(9, {});
    } else if (group.rank() == 2) {
      const std::unique_ptr<PeerChannel> channel = group.connect_peer(0);
      EXPECT_EQ(channel->receive(), (std::pair<int64_t, std::vector<char>>{7, {'a', '\0', 'b'}}));
      EXPECT_EQ(channel->receive(), (std::pair<int64_t, std::vector<char>>{8, big}));
      EXPECT_EQ(channel->receive(), (std::pair<int64_t, std::vector<char>>{9, {}}));
    }
    // The group's own collectives are untouched by the channel.
    EXPECT_EQ(group.all_reduce(1.0, Reduce::kSum), 3.0);
  });
}

TEST(ProcessGroupTest, APeerThatIsGoneFailsTheChannelNamingItInsteadOfHanging) {
  std::string message;
  on_ranks(2, [&message](ProcessGroup& group) {
    std::unique_ptr<PeerChannel> channel = group.connect_peer(1 - group.rank());
    if (group.rank() == 1) channel.reset();  // rank 1's end closes, as when its process dies
    group.barrier();
    if (group.rank() == 0) message = testing::error_message([&] { (void)channel->receive(); });
  });
  EXPECT_NE(message.find("could not receive from rank 1"), std::string::npos) << message;
  EXPECT_NE(message.find("HINT"), std::string::npos) << message;
}

TEST(ProcessGroupTest, APeerIsAnotherRankOfTheRun) {
  on_ranks(2, [](ProcessGroup& group) {
    EXPECT_THROW((void)group.connect_peer(group.rank()), Error);
    EXPECT_THROW((void)group.connect_peer(2), Error);
  });
}

void (*sigpipe_handler())(int) {
  struct sigaction now {};
  sigaction(SIGPIPE, nullptr, &now);
  return now.sa_handler;
}

void on_sigpipe(int) {}

TEST(ProcessGroupTest, SigpipeIsIgnoredWhileAGroupLivesAndComesBackAfterwards) {
  // Gloo's writev to a peer that closed its socket raises SIGPIPE: at its default action the
  // process died silently instead of failing the collective with the peer's name.
  ::signal(SIGPIPE, SIG_DFL);
  on_ranks(2, [](ProcessGroup&) { EXPECT_EQ(sigpipe_handler(), SIG_IGN); });
  EXPECT_EQ(sigpipe_handler(), SIG_DFL);
  // A handler the program installed is its own business.
  ::signal(SIGPIPE, on_sigpipe);
  on_ranks(2, [](ProcessGroup&) { EXPECT_EQ(sigpipe_handler(), &on_sigpipe); });
  EXPECT_EQ(sigpipe_handler(), &on_sigpipe);
  ::signal(SIGPIPE, SIG_DFL);
}

}  // namespace
}  // namespace volt
