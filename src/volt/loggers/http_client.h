// A small blocking HTTP client over libcurl, for loggers that talk to a tracking server.
//
// The header names no libcurl type, so users of the loggers need not see curl's headers.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace volt {

/// What one HTTP request came back with.
struct HttpResponse {
  /// The HTTP status, or 0 when no response arrived (see `error`).
  long status = 0;
  /// The response's body.
  std::string body;
  /// Why no response arrived ("Couldn't connect to server", "Timeout was reached"); empty when one did.
  std::string error;

  /// A 2xx response.
  bool ok() const { return error.empty() && status >= 200 && status < 300; }
  /// Worth sending again later: no response, a timeout (408), too many requests (429) or a server
  /// error (5xx). Any other failure is the request's own fault and fails again.
  bool transient() const { return !error.empty() || status == 408 || status == 429 || status >= 500; }
  /// The failure in a few words, for a report: the error, or "HTTP <status>: <body>".
  std::string describe() const;
};

/// `text` with every byte but RFC 3986's unreserved ones (letters, digits, `-._~`) and those in
/// `keep` percent-encoded: `percent_encode("a b/c", "/")` is "a%20b/c".
std::string percent_encode(const std::string& text, const std::string& keep = "");

/// How an HttpClient connects.
struct HttpClientOptions {
  /// The most seconds one request may take, connection included.
  double timeout_s = 10;
  /// The most seconds connecting may take.
  double connect_timeout_s = 5;
  /// Sent as `Authorization: Bearer <token>` when not empty.
  std::string bearer_token;
  /// With `password`, sent as HTTP basic authentication when not empty.
  std::string username;
  std::string password;  ///< see username
  /// Accept any TLS certificate (MLflow's MLFLOW_TRACKING_INSECURE_TLS): for a self-signed one.
  bool insecure_tls = false;
};

/// Sends HTTP requests one at a time on one connection it keeps open. Not thread-safe: one
/// thread uses it (a logger's sender thread).
class HttpClient {
 public:
  /// A client with `options`; connects on the first request.
  explicit HttpClient(HttpClientOptions options = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  /// GET `url`.
  HttpResponse get(const std::string& url);
  /// POST `json` to `url` as `application/json`.
  HttpResponse post_json(const std::string& url, const std::string& json);
  /// PUT the file at `path` to `url` as `application/octet-stream`, read as it is sent (a
  /// checkpoint is not loaded into memory). A file that cannot be opened is an `error`.
  HttpResponse put_file(const std::string& url, const std::string& path);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace volt
