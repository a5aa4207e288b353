#include "volt/loggers/mlflow_rest.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "volt/core/env.h"
#include "volt/core/error.h"
#include "volt/loggers/http_client.h"
#include "volt/loggers/mlflow_logger.h"

namespace volt::mlflow {
namespace {

TEST(MlflowRest, MetricKeysKeepWhatMlflowAllowsAndReplaceTheRest) {
  EXPECT_EQ(metric_key("train/loss_step"), "train/loss_step");
  EXPECT_EQ(metric_key("val acc:top-1.5"), "val acc:top-1.5");
  EXPECT_EQ(metric_key("loss[0]+λ"), "loss_0____");  // λ is two bytes in UTF-8, each one a _
  EXPECT_EQ(metric_key(std::string(300, 'a')).size(), kMaxKeyLength);
}

TEST(MlflowRest, ParamsAreFlattenedWithSlashesAndSorted) {
  const nlohmann::json params = {{"lr", 0.001},
                                 {"model", "mlp"},
                                 {"optimizer", {{"name", "adam"}, {"betas", {0.9, 0.999}}}},
                                 {"shuffle", true},
                                 {"empty", nlohmann::json::object()}};
  const auto flat = flatten_params(params);
  const std::vector<std::pair<std::string, std::string>> expected = {{"empty", "{}"},
                                                                     {"lr", "0.001"},
                                                                     {"model", "mlp"},
                                                                     {"optimizer/betas", "[0.9,0.999]"},
                                                                     {"optimizer/name", "adam"},
                                                                     {"shuffle", "true"}};
  EXPECT_EQ(flat, expected);
  EXPECT_TRUE(flatten_params(nlohmann::json()).empty());
  EXPECT_EQ(flatten_params({{"long", std::string(7000, 'x')}})[0].second.size(), kMaxParamValueLength);
  EXPECT_THROW(flatten_params(nlohmann::json::array({1, 2})), Error);
}

TEST(MlflowRest, NonFiniteValuesAreTheStringsMlflowsParserReads) {
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_EQ(metric_json({"a", std::nan(""), 5, 7})["value"], "NaN");
  EXPECT_EQ(metric_json({"a", inf, 5, 7})["value"], "Infinity");
  EXPECT_EQ(metric_json({"a", -inf, 5, 7})["value"], "-Infinity");
  const nlohmann::json finite = metric_json({"train/loss", 0.25, 1700000000123, 42});
  EXPECT_EQ(finite,
            (nlohmann::json{{"key", "train/loss"}, {"value", 0.25}, {"timestamp", 1700000000123}, {"step", 42}}));
}

TEST(MlflowRest, RunStatusFollowsHowTheRunEnded) {
  EXPECT_EQ(run_status("success"), "FINISHED");
  EXPECT_EQ(run_status("failed"), "FAILED");
  EXPECT_EQ(run_status("interrupted"), "KILLED");
  EXPECT_EQ(run_status("requeued"), "KILLED");
}

TEST(MlflowRest, TrackingUrisMustBeHttpServers) {
  EXPECT_EQ(normalize_tracking_uri("http://127.0.0.1:5000/"), "http://127.0.0.1:5000");
  EXPECT_EQ(normalize_tracking_uri("https://mlflow.example.org/prefix"), "https://mlflow.example.org/prefix");
  for (const char* bad : {"file:./mlruns", "./mlruns", "databricks", "http://", "ftp://host"}) {
    try {
      normalize_tracking_uri(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(bad), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("HINT: "), std::string::npos) << e.what();
    }
  }
}

TEST(MlflowRest, ArtifactUploadsGoToTheServersArtifactProxy) {
  EXPECT_EQ(artifact_upload_url("http://h:5000", "mlflow-artifacts:/1/abc/artifacts", "checkpoints/last.ckpt"),
            "http://h:5000/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts/checkpoints/last.ckpt");
  // A name with characters that need escaping, as ModelCheckpoint's "{val/acc:.4f}" makes.
  EXPECT_EQ(artifact_upload_url("http://h:5000", "mlflow-artifacts:/1/abc/artifacts", "checkpoints/epoch=1 a.ckpt"),
            "http://h:5000/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts/checkpoints/epoch%3D1%20a.ckpt");
  // A root naming its server: that host, with the tracking URI's scheme.
  EXPECT_EQ(artifact_upload_url("https://t:443", "mlflow-artifacts://store:8080/mlartifacts/2/r/artifacts", "x"),
            "https://store:8080/api/2.0/mlflow-artifacts/artifacts/mlartifacts/2/r/artifacts/x");
  EXPECT_EQ(artifact_upload_url("http://h:5000", "/srv/mlruns/1/abc/artifacts", "x"), std::nullopt);
  EXPECT_EQ(artifact_upload_url("http://h:5000", "s3://bucket/1/abc/artifacts", "x"), std::nullopt);
}

TEST(MlflowRest, RetriesWaitLongerEachTimeUpToTheLimit) {
  EXPECT_EQ(retry_delay_s(0, 30), 0);
  EXPECT_EQ(retry_delay_s(1, 30), 0.5);
  EXPECT_EQ(retry_delay_s(2, 30), 1.0);
  EXPECT_EQ(retry_delay_s(4, 30), 4.0);
  EXPECT_EQ(retry_delay_s(10, 30), 30.0);
  EXPECT_EQ(retry_delay_s(1000, 30), 30.0);
}

TEST(MlflowRest, ErrorCodesAreReadFromTheBody) {
  EXPECT_EQ(error_code(R"({"error_code": "RESOURCE_DOES_NOT_EXIST", "message": "x"})"), "RESOURCE_DOES_NOT_EXIST");
  EXPECT_EQ(error_code("<html>502 Bad Gateway</html>"), "");
  EXPECT_EQ(error_code(""), "");
}

TEST(MlflowRest, PercentEncodingKeepsUnreservedBytesAndWhatIsAskedFor) {
  EXPECT_EQ(percent_encode("lightning logs/ä"), "lightning%20logs%2F%C3%A4");
  EXPECT_EQ(percent_encode("a b/c", "/"), "a%20b/c");
  EXPECT_EQ(percent_encode("AZaz09-._~"), "AZaz09-._~");
}

TEST(MlflowRest, LogModelNamesIncludeLightningsBooleans) {
  EXPECT_EQ(parse_log_model("none"), LogModel::kNone);
  EXPECT_EQ(parse_log_model("False"), LogModel::kNone);
  EXPECT_EQ(parse_log_model("true"), LogModel::kEnd);
  EXPECT_EQ(parse_log_model(" end "), LogModel::kEnd);
  EXPECT_EQ(parse_log_model("all"), LogModel::kAll);
  for (const LogModel mode : {LogModel::kNone, LogModel::kEnd, LogModel::kAll}) {
    EXPECT_EQ(parse_log_model(to_string(mode)), mode);
  }
  EXPECT_THROW(parse_log_model("best"), Error);
}

TEST(MlflowRest, UnsetOptionsComeFromMlflowsEnvironmentVariables) {
  const Env env({{"MLFLOW_TRACKING_URI", "http://env:5000"},
                 {"MLFLOW_EXPERIMENT_NAME", "from-env"},
                 {"MLFLOW_TRACKING_TOKEN", "secret"},
                 {"MLFLOW_TRACKING_USERNAME", "u"},
                 {"MLFLOW_TRACKING_PASSWORD", "p"},
                 {"MLFLOW_TRACKING_INSECURE_TLS", "true"}});
  const MLFlowOptions from_env = mlflow_options_from_env({}, env);
  EXPECT_EQ(from_env.tracking_uri, "http://env:5000");
  EXPECT_EQ(from_env.experiment_name, "from-env");
  EXPECT_EQ(from_env.token, "secret");
  EXPECT_EQ(from_env.username, "u");
  EXPECT_EQ(from_env.password, "p");
  EXPECT_TRUE(from_env.insecure_tls);
  EXPECT_FALSE(from_env.run_id.has_value());
  // What the program set wins over the environment.
  const MLFlowOptions given =
      mlflow_options_from_env({.tracking_uri = "http://given:1", .experiment_name = "mine"}, env);
  EXPECT_EQ(given.tracking_uri, "http://given:1");
  EXPECT_EQ(given.experiment_name, "mine");
  EXPECT_FALSE(mlflow_options_from_env({}, Env()).tracking_uri.has_value());
}

}  // namespace
}  // namespace volt::mlflow
