// MLFlowLogger without a server: what it keeps when none answers, and that it never hangs.
// tests/mlflow runs it against a real `mlflow server`.
#include "volt/loggers/mlflow_logger.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "volt/core/error.h"

namespace volt {
namespace {

namespace fs = std::filesystem;

/// A TCP socket on a free loopback port: listening (connections are queued, never answered) or
/// closed again (connections are refused).
class LoopbackPort {
 public:
  explicit LoopbackPort(bool listen_forever) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    socklen_t size = sizeof(address);
    EXPECT_EQ(::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &size), 0);
    port_ = ntohs(address.sin_port);
    if (listen_forever) {
      EXPECT_EQ(::listen(fd_, 16), 0);
    } else {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~LoopbackPort() {
    if (fd_ >= 0) ::close(fd_);
  }
  LoopbackPort(const LoopbackPort&) = delete;
  LoopbackPort& operator=(const LoopbackPort&) = delete;
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }
  /// The listening socket (-1 when closed).
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
  int port_ = 0;
};

/// A loopback HTTP server that answers every request with the same response, e.g. a proxy's
/// HTML page where an MLflow server was expected.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::string response) : response_(std::move(response)) {
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedServer() {
    ::shutdown(port_.fd(), SHUT_RDWR);  // ends accept()
    thread_.join();
  }
  ScriptedServer(const ScriptedServer&) = delete;
  ScriptedServer& operator=(const ScriptedServer&) = delete;
  std::string uri() const { return port_.uri(); }
  int requests() const { return requests_; }

 private:
  void serve() {
    while (true) {
      const int client = ::accept(port_.fd(), nullptr, nullptr);
      if (client < 0) return;
      // Reads the headers and a Content-Length body, answers, closes: one request a connection.
      std::string request;
      char buffer[4096];
      size_t header_end = std::string::npos;
      size_t length = 0;
      while (true) {
        const ssize_t got = ::recv(client, buffer, sizeof(buffer), 0);
        if (got <= 0) break;
        request.append(buffer, static_cast<size_t>(got));
        if (header_end == std::string::npos && (header_end = request.find("\r\n\r\n")) != std::string::npos) {
          const size_t at = request.find("Content-Length: ");
          if (at != std::string::npos && at < header_end) length = std::stoul(request.substr(at + 16));
        }
        if (header_end != std::string::npos && request.size() >= header_end + 4 + length) break;
      }
      ++requests_;
      (void)::send(client, response_.data(), response_.size(), MSG_NOSIGNAL);
      ::close(client);
    }
  }

  LoopbackPort port_{/*listen_forever=*/true};
  std::string response_;
  std::atomic<int> requests_{0};
  std::thread thread_;
};

std::string http_response(int status, const std::string& body) {
  return fmt::format("HTTP/1.1 {} X\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{}",
                     status, body.size(), body);
}

std::vector<nlohmann::json> read_lines(const fs::path& path) {
  std::vector<nlohmann::json> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  return lines;
}

class MLFlowLoggerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    root_ = fs::temp_directory_path() / fmt::format("volt_mlflow_logger_test_{}_{}", info->name(), ::getpid());
    fs::remove_all(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  LoggerOptions options() const {
    LoggerOptions o;
    o.save_dir = root_.string();
    o.name = "exp";
    o.version = "version_0";
    return o;
  }
  /// Short waits, so that a server that never answers costs the test a second or two.
  static MLFlowOptions quick(const std::string& uri) {
    return MLFlowOptions{.tracking_uri = uri,
                         .request_timeout_s = 0.3,
                         .flush_interval_s = 0.05,
                         .max_retry_interval_s = 0.1,
                         .finalize_timeout_s = 0.5};
  }

  fs::path root_;
};

TEST_F(MLFlowLoggerTest, WhatAnUnreachableServerNeverTookIsWrittenDownWhole) {
  const LoopbackPort refused(/*listen_forever=*/false);
  MLFlowLogger logger(options(), quick(refused.uri()));
  EXPECT_EQ(logger.log_dir(), (root_ / "exp" / "version_0").string());
  logger.log_hyperparams({{"lr", 0.5}, {"model", {{"hidden", 64}}}});
  logger.log_metrics({{"train/loss", 1.5}, {"bad key!", 2.0}}, 0);
  logger.log_metrics({{"train/loss", std::nan("")}}, 1);
  logger.set_tag("note", "x");
  logger.finalize("success");

  const MLFlowDelivery delivery = logger.delivery();
  EXPECT_EQ(delivery.run_id, "");
  EXPECT_EQ(delivery.metrics_sent, 0);
  EXPECT_EQ(delivery.metrics_saved, 3);
  EXPECT_EQ(delivery.metrics_pending, 0);
  EXPECT_GT(delivery.failed_requests, 0);
  EXPECT_FALSE(delivery.last_error.empty());
  const std::vector<nlohmann::json> lines =
      read_lines(root_ / "exp" / "version_0" / MLFlowLogger::kUndeliveredFileName);
  std::vector<nlohmann::json> metrics;
  std::map<std::string, std::string> params;
  std::string status;
  for (const auto& line : lines) {
    if (line["type"] == "metric") metrics.push_back(line);
    if (line["type"] == "param") params[line["key"]] = line["value"];
    if (line["type"] == "status") status = line["status"];
  }
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0]["type"], "run");  // where the records belong, for whoever sends them later
  EXPECT_EQ(lines[0]["tracking_uri"], refused.uri());
  EXPECT_EQ(lines[0]["experiment_name"], "exp");
  EXPECT_EQ(lines[0]["run_name"], "version_0");
  ASSERT_EQ(metrics.size(), 3u);
  EXPECT_EQ(metrics[0]["key"], "bad key_");
  EXPECT_EQ(metrics[0]["value"], 2.0);
  EXPECT_EQ(metrics[1]["key"], "train/loss");
  EXPECT_EQ(metrics[1]["value"], 1.5);
  EXPECT_EQ(metrics[1]["step"], 0);
  EXPECT_EQ(metrics[2]["value"], "NaN");
  EXPECT_EQ(metrics[2]["step"], 1);
  EXPECT_EQ(params, (std::map<std::string, std::string>{{"lr", "0.5"}, {"model/hidden", "64"}}));
  EXPECT_EQ(status, "FINISHED");
}

TEST_F(MLFlowLoggerTest, ItsReportsAreWarningsOnTheConsoleItWasGiven) {
  const LoopbackPort refused(/*listen_forever=*/false);
  const auto console = std::make_shared<RecordingConsole>();
  LoggerOptions o = options();
  o.console = console;
  MLFlowLogger logger(o, quick(refused.uri()));
  logger.log_hyperparams({{"lr", 0.5}});
  logger.log_hyperparams({{"lr", 0.1}});  // MLflow keeps a param's first value: said once, here
  logger.log_metrics({{"loss", 1.0}}, 0);
  logger.finalize("success");  // joins the sender, which reported the first failure

  const std::vector<std::string>& warnings = console->warnings;
  auto said = [&](const std::string& text) {
    return std::any_of(warnings.begin(), warnings.end(),
                       [&](const std::string& line) { return line.find(text) != std::string::npos; });
  };
  EXPECT_TRUE(said("MLFlowLogger: MLflow keeps a run's first value of a param; not sent: lr (0.5 -> 0.1)"));
  EXPECT_TRUE(said("; keeping the metrics and trying again (every 0.1 s at most)."));
  EXPECT_TRUE(said("MLFlowLogger: " + refused.uri() + " did not take 1 metric values, 1 params"));
  for (const std::string& line : warnings) EXPECT_EQ(line.rfind("MLFlowLogger", 0), 0u) << line;
  EXPECT_TRUE(console->infos.empty());
}

TEST_F(MLFlowLoggerTest, ASilentServerCostsFinalizeItsTimeoutNotMore) {
  const LoopbackPort silent(/*listen_forever=*/true);
  MLFlowLogger logger(options(), quick(silent.uri()));
  logger.log_metrics({{"a", 1.0}}, 0);
  const auto start = std::chrono::steady_clock::now();
  logger.finalize("failed");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // finalize_timeout_s plus one request's timeout, with room for a loaded machine.
  EXPECT_LT(seconds, 5.0);
  EXPECT_EQ(logger.delivery().metrics_saved, 1);
  EXPECT_NE(logger.delivery().last_error.find("timed out"), std::string::npos) << logger.delivery().last_error;
}

TEST_F(MLFlowLoggerTest, MetricsBeyondTheBufferGoToTheFileWhileTheRunGoesOn) {
  const LoopbackPort refused(/*listen_forever=*/false);
  MLFlowOptions mlflow = quick(refused.uri());
  mlflow.max_buffered_metrics = 5;
  MLFlowLogger logger(options(), mlflow);
  for (int step = 0; step < 20; ++step) logger.log_metrics({{"loss", static_cast<double>(step)}}, step);
  // The sender moves the oldest 15 out on its next wake-up, before finalize.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (logger.delivery().metrics_saved < 15 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(logger.delivery().metrics_saved, 15);
  EXPECT_EQ(logger.delivery().metrics_pending, 5);
  logger.finalize("success");
  std::vector<int64_t> steps;
  for (const auto& line : read_lines(root_ / "exp" / "version_0" / MLFlowLogger::kUndeliveredFileName)) {
    if (line["type"] == "metric") steps.push_back(line["step"]);
  }
  ASSERT_EQ(steps.size(), 20u);
  for (int step = 0; step < 20; ++step) EXPECT_EQ(steps[step], step);  // oldest first, none twice
}

TEST_F(MLFlowLoggerTest, ARequeuedRunSendsWhatItsEarlierProcessCouldNotFirst) {
  const LoopbackPort refused(/*listen_forever=*/false);
  LoggerOptions folder = options();
  folder.append = true;  // a requeued SLURM job's folder
  const fs::path undelivered = root_ / "exp" / "version_0" / MLFlowLogger::kUndeliveredFileName;
  {
    MLFlowLogger before(folder, quick(refused.uri()));
    before.log_hyperparams({{"lr", 0.5}});
    before.log_metrics({{"loss", 1.0}}, 10);
    before.log_metrics({{"loss", -std::numeric_limits<double>::infinity()}}, 20);
    before.finalize("requeued");
  }
  ASSERT_TRUE(fs::exists(undelivered));
  {
    // Another server's file is not this logger's to send.
    MLFlowLogger elsewhere(folder, quick("http://127.0.0.1:1"));
    EXPECT_EQ(elsewhere.delivery().metrics_pending, 0);
  }
  ASSERT_TRUE(fs::exists(undelivered));
  MLFlowLogger after(folder, quick(refused.uri()));
  EXPECT_EQ(after.delivery().metrics_pending, 2);  // queued ahead of the new run's records
  EXPECT_FALSE(fs::exists(undelivered));
  after.log_hyperparams({{"lr", 0.5}});
  after.log_metrics({{"loss", 0.5}}, 30);
  after.finalize("success");
  std::vector<std::pair<int64_t, nlohmann::json>> values;
  int params = 0;
  std::vector<std::string> statuses;
  for (const auto& line : read_lines(undelivered)) {
    if (line["type"] == "metric") values.emplace_back(line["step"], line["value"]);
    if (line["type"] == "param") ++params;
    if (line["type"] == "status") statuses.push_back(line["status"]);
  }
  const std::vector<std::pair<int64_t, nlohmann::json>> expected = {{10, 1.0}, {20, "-Infinity"}, {30, 0.5}};
  EXPECT_EQ(values, expected);
  EXPECT_EQ(params, 1);
  EXPECT_EQ(statuses, std::vector<std::string>{"FINISHED"});
  EXPECT_FALSE(fs::exists(undelivered.string() + ".resending"));
}

TEST_F(MLFlowLoggerTest, AServerThatIsNotMlflowIsGivenUpAtOnceAndNothingIsLost) {
  const ScriptedServer html(http_response(200, "<html>a login page</html>"));
  MLFlowLogger logger(options(), quick(html.uri()));
  logger.log_metrics({{"loss", 1.0}}, 1);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (logger.delivery().failed_requests == 0 && html.requests() == 0 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int requests = html.requests();
  EXPECT_EQ(requests, 1);                  // not retried: no MLflow server answers like that
  logger.log_metrics({{"loss", 2.0}}, 2);  // straight to the file
  EXPECT_EQ(logger.delivery().metrics_saved, 2);
  logger.finalize("success");
  EXPECT_EQ(html.requests(), requests);
  int metrics = 0;
  for (const auto& line : read_lines(root_ / "exp" / "version_0" / MLFlowLogger::kUndeliveredFileName)) {
    metrics += line["type"] == "metric" ? 1 : 0;
  }
  EXPECT_EQ(metrics, 2);
}

TEST_F(MLFlowLoggerTest, ARefusedRequestIsNotRetried) {
  // 403 for everything: the experiment cannot be looked up, so no run is made.
  const ScriptedServer forbidden(http_response(403, R"({"error_code": "PERMISSION_DENIED", "message": "no"})"));
  MLFlowLogger logger(options(), quick(forbidden.uri()));
  logger.log_hyperparams({{"lr", 0.1}});
  logger.finalize("success");
  EXPECT_EQ(forbidden.requests(), 1);
  EXPECT_NE(logger.delivery().last_error.find("HTTP 403"), std::string::npos) << logger.delivery().last_error;
  EXPECT_NE(logger.delivery().last_error.find("PERMISSION_DENIED"), std::string::npos);
}

TEST_F(MLFlowLoggerTest, ARunThatLoggedNothingEndsWithoutContactingTheServer) {
  const LoopbackPort refused(/*listen_forever=*/false);
  MLFlowLogger logger(options(), quick(refused.uri()));
  logger.finalize("success");
  EXPECT_EQ(logger.delivery().failed_requests, 0);
  EXPECT_FALSE(fs::exists(root_ / "exp"));
}

TEST_F(MLFlowLoggerTest, AMissingOrNonHttpTrackingUriIsRefusedWithAHint) {
  try {
    MLFlowLogger logger(options(), MLFlowOptions{});
    ADD_FAILURE() << "no tracking URI was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MLFLOW_TRACKING_URI"), std::string::npos) << e.what();
  }
  EXPECT_THROW(MLFlowLogger(options(), MLFlowOptions{.tracking_uri = "file:./mlruns"}), Error);
  EXPECT_THROW(MLFlowLogger(options(), MLFlowOptions{.tracking_uri = "http://h:1", .flush_interval_s = 0}), Error);
}

}  // namespace
}  // namespace volt
