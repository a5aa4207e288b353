#include "volt/slurm/hostlist.h"

#include <gtest/gtest.h>

#include "volt/core/error.h"

namespace volt::slurm {
namespace {

using Hosts = std::vector<std::string>;

std::string error_of(std::string_view expression) {
  try {
    expand_hostlist(expression);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(Hostlist, PlainNamesAndCommaLists) {
  EXPECT_EQ(expand_hostlist("node1"), Hosts{"node1"});
  EXPECT_EQ(expand_hostlist("a,b"), (Hosts{"a", "b"}));
}

TEST(Hostlist, RangesKeepZeroPadding) {
  EXPECT_EQ(expand_hostlist("node[01-04,7]"), (Hosts{"node01", "node02", "node03", "node04", "node7"}));
  EXPECT_EQ(expand_hostlist("n[08-10]"), (Hosts{"n08", "n09", "n10"}));
}

TEST(Hostlist, DashesInNamesAreLiteral) {
  EXPECT_EQ(expand_hostlist("rack1-[2,5]"), (Hosts{"rack1-2", "rack1-5"}));
  EXPECT_EQ(expand_hostlist("gpu-a100-[1-2],login-1"), (Hosts{"gpu-a100-1", "gpu-a100-2", "login-1"}));
}

TEST(Hostlist, SeveralBracketGroupsExpandAsAProduct) {
  EXPECT_EQ(expand_hostlist("r[1-2]-n[1-2]"), (Hosts{"r1-n1", "r1-n2", "r2-n1", "r2-n2"}));
  EXPECT_EQ(expand_hostlist("node[1-2]a"), (Hosts{"node1a", "node2a"}));
}

TEST(Hostlist, FirstHostDoesNotExpandTheRest) {
  EXPECT_EQ(first_host("node[01-04,7],other[1-100000000]"), "node01");
  EXPECT_EQ(first_host("localhost"), "localhost");
  EXPECT_EQ(first_host(",,b[2-3]"), "b2");
  EXPECT_THROW(first_host(","), Error);
}

/// What `scontrol show hostnames EXPR` printed (Slurm 22.05, Debian), joined with spaces.
struct SlurmCase {
  const char* expression;
  const char* hosts;
};

TEST(Hostlist, MatchesScontrolShowHostnames) {
  const SlurmCase cases[] = {
      {"x[1-2]y[3-4]z[5-6]", "x1y3z5 x1y3z6 x2y3z5 x2y3z6 x1y4z5 x1y4z6 x2y4z5 x2y4z6"},
      {"a[1-2]b[3-4]c[5-6]d[7-8]",
       "a1b3c5d7 a1b3c5d8 a2b3c5d7 a2b3c5d8 a1b4c5d7 a1b4c5d8 a2b4c5d7 a2b4c5d8 a1b3c6d7 a1b3c6d8 a2b3c6d7 a2b3c6d8 "
       "a1b4c6d7 a1b4c6d8 a2b4c6d7 a2b4c6d8"},
      {"x[1-2]y[3]z[5-6]", "x1y3z5 x1y3z6 x2y3z5 x2y3z6"},
      {"x[1-2]y[3-4]", "x1y3 x1y4 x2y3 x2y4"},
      {"r[1-2]-n[01-02]", "r1-n01 r1-n02 r2-n01 r2-n02"},
      {"a,,b", "a b"},
      {"a,", "a"},
      {",a", "a"},
      {"n[1-2],m", "n1 n2 m"},
      {"n[9-11]", "n9 n10 n11"},
      {"n[09-11]", "n09 n10 n11"},
      {"n[1-3,5]", "n1 n2 n3 n5"},
  };
  for (const auto& c : cases) {
    std::string joined;
    for (const auto& host : expand_hostlist(c.expression)) joined += (joined.empty() ? "" : " ") + host;
    EXPECT_EQ(joined, c.hosts) << c.expression;
  }
}

TEST(Hostlist, MalformedInputIsAClearError) {
  EXPECT_NE(error_of("node[1-3").find("never closed"), std::string::npos);
  EXPECT_NE(error_of("node1-3]").find("']' without '['"), std::string::npos);
  EXPECT_NE(error_of("node[[1]]").find("cannot nest"), std::string::npos);
  EXPECT_NE(error_of("node[5-3]").find("backwards"), std::string::npos);
  EXPECT_NE(error_of("node[a-b]").find("digits only"), std::string::npos);
  EXPECT_NE(error_of("node[]").find("digits only"), std::string::npos);
  EXPECT_NE(error_of("").find("no host names"), std::string::npos);
  EXPECT_NE(error_of(",").find("no host names"), std::string::npos);
  EXPECT_NE(error_of("n[0-99999999]").find("more than"), std::string::npos);
  EXPECT_NE(error_of("n[0-999],m[0-9999]x[0-999]").find("more than"), std::string::npos);
  EXPECT_NE(error_of("node[1-3").find("HINT"), std::string::npos);
}

TEST(TasksPerNode, ExpandsSlurmsRepeatCounts) {
  EXPECT_EQ(expand_tasks_per_node("2(x3),1"), (std::vector<int64_t>{2, 2, 2, 1}));
  EXPECT_EQ(expand_tasks_per_node("3,1"), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(expand_tasks_per_node("4"), (std::vector<int64_t>{4}));
  for (const char* bad : {"", "2(x3", "a", "2(xb)", "2,,1"}) {
    try {
      expand_tasks_per_node(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("HINT"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace volt::slurm
