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
}

TEST(Hostlist, MalformedInputIsAClearError) {
  EXPECT_NE(error_of("node[1-3").find("never closed"), std::string::npos);
  EXPECT_NE(error_of("node1-3]").find("']' without '['"), std::string::npos);
  EXPECT_NE(error_of("node[[1]]").find("cannot nest"), std::string::npos);
  EXPECT_NE(error_of("node[5-3]").find("backwards"), std::string::npos);
  EXPECT_NE(error_of("node[a-b]").find("digits only"), std::string::npos);
  EXPECT_NE(error_of("node[]").find("digits only"), std::string::npos);
  EXPECT_NE(error_of("a,,b").find("empty host name"), std::string::npos);
  EXPECT_NE(error_of("").find("empty host name"), std::string::npos);
  EXPECT_NE(error_of("n[0-99999999]").find("more than"), std::string::npos);
  EXPECT_NE(error_of("n[0-999],m[0-9999]x[0-999]").find("more than"), std::string::npos);
  EXPECT_NE(error_of("node[1-3").find("HINT"), std::string::npos);
}

}  // namespace
}  // namespace volt::slurm
