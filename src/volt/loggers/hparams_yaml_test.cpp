#include "volt/loggers/hparams_yaml.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <string>

#include "volt/core/error.h"

namespace volt {
namespace {

using nlohmann::json;

TEST(HparamsYaml, NestedObjectsAndArraysBecomeBlockMapsAndSequences) {
  const json params = {{"lr", 0.001},
                       {"model", {{"layers", json::array({64, 32})}, {"act", "relu"}}},
                       {"seed", 42},
                       {"shuffle", true},
                       {"ckpt", nullptr}};
  EXPECT_EQ(to_hparams_yaml(params),
            "ckpt: ~\n"
            "lr: 0.001\n"
            "model:\n"
            "  act: relu\n"
            "  layers:\n"
            "    - 64\n"
            "    - 32\n"
            "seed: 42\n"
            "shuffle: true\n");
}

TEST(HparamsYaml, FloatsKeepADotSoPyYamlReadsThemAsFloats) {
  const json params = {
      {"a", 1e-05}, {"b", 3.0}, {"c", -2.5e20}, {"d", 0.1}, {"e", std::numeric_limits<double>::infinity()}};
  EXPECT_EQ(to_hparams_yaml(params), "a: 1.0e-05\nb: 3.0\nc: -2.5e+20\nd: 0.1\ne: .inf\n");
}

TEST(HparamsYaml, StringsThatLookLikeOtherTypesAreQuoted) {
  const json params = {{"a", "true"},  {"b", "1e-3"}, {"c", ""},     {"d", "No"},
                       {"e", "12:30"}, {"f", "adam"}, {"g", "null"}, {"1", "key"}};
  EXPECT_EQ(to_hparams_yaml(params),
            "\"1\": key\n"
            "a: \"true\"\n"
            "b: \"1e-3\"\n"
            "c: \"\"\n"
            "d: \"No\"\n"
            "e: \"12:30\"\n"
            "f: adam\n"
            "g: \"null\"\n");
}

TEST(HparamsYaml, ReadsBackWithTheSameValues) {
  const json params = {{"name", "run: 1"},
                       {"lr", 0.0003},
                       {"steps", 123456789012LL},
                       {"tags", json::array({"a", "b"})},
                       {"empty", json::object()}};
  const YAML::Node node = YAML::Load(to_hparams_yaml(params));
  EXPECT_EQ(node["name"].as<std::string>(), "run: 1");
  EXPECT_EQ(node["lr"].as<double>(), 0.0003);
  EXPECT_EQ(node["steps"].as<long long>(), 123456789012LL);
  EXPECT_EQ(node["tags"][1].as<std::string>(), "b");
  EXPECT_TRUE(node["empty"].IsMap());
  EXPECT_EQ(node["empty"].size(), 0u);
}

TEST(HparamsYaml, BinaryValuesAreRejected) {
  const json params = {{"blob", json::binary({1, 2, 3})}};
  EXPECT_THROW(to_hparams_yaml(params), Error);
}

}  // namespace
}  // namespace volt
