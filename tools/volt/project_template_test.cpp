#include "project_template.h"

#include <gtest/gtest.h>

#include "volt/core/testing.h"

namespace volt::tool {
namespace {

TEST(ProjectNameFromDir, KeepsIdentifierCharactersOfTheLastComponent) {
  EXPECT_EQ(project_name_from_dir("runs/my-model/"), "my_model");
  EXPECT_EQ(project_name_from_dir("/tmp/x/Net2"), "Net2");
  EXPECT_EQ(project_name_from_dir("3d"), "_3d");
  EXPECT_NE(testing::error_message([] { project_name_from_dir("/"); }).find("HINT"), std::string::npos);
  EXPECT_NE(testing::error_message([] { project_name_from_dir(".."); }).find("HINT"), std::string::npos);
}

TEST(RenderProject, SubstitutesTheNameAndPrefixEverywhere) {
  const auto files = render_project("demo", "/opt/volt");
  std::vector<std::string> paths;
  for (const auto& file : files) {
    paths.push_back(file.path);
    EXPECT_EQ(file.text.find("@NAME@"), std::string::npos) << file.path;
    EXPECT_EQ(file.text.find("@PREFIX@"), std::string::npos) << file.path;
  }
  EXPECT_EQ(paths, (std::vector<std::string>{"CMakeLists.txt", "src/main.cpp", "src/classifier.h", "config.yaml",
                                             "README.md", ".gitignore"}));
  const std::string& cmake = files[0].text;
  EXPECT_NE(cmake.find("project(demo LANGUAGES CXX)"), std::string::npos);
  EXPECT_NE(cmake.find("set(VOLT_HINT_PREFIX \"/opt/volt\""), std::string::npos);
  EXPECT_NE(cmake.find("target_link_libraries(demo PRIVATE volt::volt volt::cli)"), std::string::npos);
  // CMake's own ${...} is left alone.
  EXPECT_NE(cmake.find("HINTS ${VOLT_HINT_PREFIX}"), std::string::npos);
}

TEST(InstalledPrefixOf, IsEmptyOutsideAnInstalledPrefix) {
  EXPECT_EQ(installed_prefix_of("/nonexistent/build/tools/volt/volt"), "");
}

}  // namespace
}  // namespace volt::tool
