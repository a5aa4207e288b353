#include "rank_table.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "volt/core/testing.h"

namespace volt::tool {
namespace {

using volt::testing::error_message;

slurm::JobSpec two_by_two() {
  slurm::JobSpec spec;
  spec.job_name = "mnist";
  spec.nodes = 2;
  spec.ntasks_per_node = 2;
  return spec;
}

TEST(RankTableOptions, DefaultsArePinned) {
  const RankTableOptions options;
  EXPECT_EQ(options.job_id, "12345");
  EXPECT_EQ(options.nodelist, "");
}

TEST(RankTable, TwoNodesOfTwoTasksAreRanksZeroToThree) {
  const auto rows = build_rank_table(two_by_two(), {"4242", "gpu[07-08]"});
  ASSERT_EQ(rows.size(), 4u);
  const std::vector<std::string> hosts{"gpu07", "gpu07", "gpu08", "gpu08"};
  const std::vector<int64_t> local{0, 1, 0, 1}, node{0, 0, 1, 1};
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const ClusterInfo& info = rows[i].info;
    EXPECT_EQ(info.kind, ClusterKind::kSlurm);
    EXPECT_EQ(rows[i].host, hosts[i]);
    EXPECT_EQ(info.global_rank, static_cast<int64_t>(i));
    EXPECT_EQ(info.local_rank, local[i]);
    EXPECT_EQ(info.node_rank, node[i]);
    EXPECT_EQ(info.world_size, 4);
    EXPECT_EQ(info.num_nodes, 2);
    EXPECT_EQ(info.main_address, "gpu07");
    EXPECT_EQ(info.main_port, job_main_port("4242"));
    EXPECT_EQ(info.job_id, "4242");
  }
}

TEST(RankTable, TheDefaultNodeListIsNodeOneToN) {
  const auto rows = build_rank_table(two_by_two());
  EXPECT_EQ(rows[0].env.get_or("SLURM_JOB_NODELIST", ""), "node[1-2]");
  EXPECT_EQ(rows[3].host, "node2");
  EXPECT_EQ(rows[0].info.main_address, "node1");
  EXPECT_EQ(rows[0].info.main_port, job_main_port("12345"));
  slurm::JobSpec one;
  EXPECT_EQ(build_rank_table(one)[0].host, "node1");
}

TEST(RankTable, GpuJobsSeeEveryGpuOfTheirNode) {
  slurm::JobSpec spec = two_by_two();
  EXPECT_FALSE(build_rank_table(spec)[0].env.has("CUDA_VISIBLE_DEVICES"));
  spec.gpus_per_node = 2;
  const auto rows = build_rank_table(spec);
  EXPECT_EQ(rows[3].env.get_or("CUDA_VISIBLE_DEVICES", ""), "0,1");
}

TEST(RankTable, ArrayTaskZeroHasTheArrayJobId) {
  slurm::JobSpec spec;
  spec.array = slurm::ArraySpec{4, 2};
  const auto rows = build_rank_table(spec, {"777", ""});
  EXPECT_EQ(rows[0].info.job_id, "777_0");
  EXPECT_EQ(rows[0].info.main_port, job_main_port("777_0"));
}

TEST(RankTable, AnInteractiveJobNameIsDetectedAsLocal) {
  slurm::JobSpec spec;
  spec.job_name = "bash";
  EXPECT_EQ(build_rank_table(spec)[0].info.kind, ClusterKind::kLocal);
}

TEST(RankTable, TheNodeListMustNameOneHostPerNode) {
  const std::string message = error_message([] { build_rank_table(two_by_two(), {"1", "gpu[1-3]"}); });
  EXPECT_NE(message.find("--nodelist 'gpu[1-3]' names 3 host(s) but the job asks for --nodes=2"), std::string::npos)
      << message;
  EXPECT_NE(message.find("HINT:"), std::string::npos);
  EXPECT_NE(error_message([] {
              build_rank_table(two_by_two(), {"abc", ""});
            }).find("--job-id 'abc'"),
            std::string::npos);
  EXPECT_NE(error_message([] { build_rank_table(two_by_two(), {"1", "gpu[2-1]"}); }), "");
}

TEST(RankTable, RendersOneCommentLinePerTask) {
  const std::string table = render_rank_table(build_rank_table(two_by_two()));
  EXPECT_EQ(std::count(table.begin(), table.end(), '\n'), 5);
  EXPECT_EQ(table.rfind("# host", 0), 0u) << table;
  EXPECT_NE(table.find("node1:" + std::to_string(job_main_port("12345"))), std::string::npos) << table;
}

}  // namespace
}  // namespace volt::tool
