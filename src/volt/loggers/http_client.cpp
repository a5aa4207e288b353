#include "volt/loggers/http_client.h"

#include <curl/curl.h>

#include <cstdio>
#include <cstring>
#include <mutex>

#include "volt/core/error.h"

namespace volt {
namespace {

/// curl_global_init once per process, on the first client: it is not thread-safe before 7.84,
/// and a program that never makes a client never pays for it.
void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

size_t append_body(char* data, size_t size, size_t count, void* out) {
  static_cast<std::string*>(out)->append(data, size * count);
  return size * count;
}

/// Frees a curl_slist when it goes out of scope.
struct HeaderList {
  curl_slist* list = nullptr;
  ~HeaderList() { curl_slist_free_all(list); }
  void add(const std::string& header) { list = curl_slist_append(list, header.c_str()); }
};

}  // namespace

std::string HttpResponse::describe() const {
  if (!error.empty()) return error;
  std::string text = body.size() > 300 ? body.substr(0, 300) + "..." : body;
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return "HTTP " + std::to_string(status) + (text.empty() ? "" : ": " + text);
}

std::string percent_encode(const std::string& text, const std::string& keep) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    const bool unreserved = (byte >= 'a' && byte <= 'z') || (byte >= 'A' && byte <= 'Z') ||
                            (byte >= '0' && byte <= '9') || c == '-' || c == '.' || c == '_' || c == '~';
    if (unreserved || keep.find(c) != std::string::npos) {
      out += c;
    } else {
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 0xF];
    }
  }
  return out;
}

struct HttpClient::Impl {
  HttpClientOptions options;
  CURL* curl = nullptr;
  char error[CURL_ERROR_SIZE] = {};

  /// Resets the handle (keeping its connection) and sets what every request shares.
  void prepare(const std::string& url, std::string& body) {
    curl_easy_reset(curl);
    error[0] = '\0';
    curl_easy_setopt(curl, CURLOPT_URL, url.c_str());
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    // No signals: a timeout must not raise SIGALRM in the training process (libcurl's resolver).
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, static_cast<long>(options.timeout_s * 1000));
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(options.connect_timeout_s * 1000));
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, append_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
    if (!options.username.empty()) {
      curl_easy_setopt(curl, CURLOPT_HTTPAUTH, CURLAUTH_BASIC);
      curl_easy_setopt(curl, CURLOPT_USERNAME, options.username.c_str());
      curl_easy_setopt(curl, CURLOPT_PASSWORD, options.password.c_str());
    }
    if (options.insecure_tls) {
      curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 0L);
      curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 0L);
    }
  }

  void add_auth(HeaderList& headers) const {
    if (!options.bearer_token.empty()) headers.add("Authorization: Bearer " + options.bearer_token);
  }

  HttpResponse perform(std::string& body) {
    HttpResponse response;
    const CURLcode code = curl_easy_perform(curl);
    if (code != CURLE_OK) {
      response.error = error[0] != '\0' ? std::string(error) : std::string(curl_easy_strerror(code));
    } else {
      curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
    }
    response.body = std::move(body);
    return response;
  }
};

HttpClient::HttpClient(HttpClientOptions options) : impl_(std::make_unique<Impl>()) {
  init_curl_once();
  impl_->options = std::move(options);
  impl_->curl = curl_easy_init();
  VOLT_CHECK(impl_->curl != nullptr,
             "libcurl could not make a handle (out of memory?). HINT: free memory on this host, or run without the "
             "MLflow logger.");
}

HttpClient::~HttpClient() { curl_easy_cleanup(impl_->curl); }

HttpResponse HttpClient::get(const std::string& url) {
  std::string body;
  impl_->prepare(url, body);
  HeaderList headers;
  impl_->add_auth(headers);
  curl_easy_setopt(impl_->curl, CURLOPT_HTTPHEADER, headers.list);
  return impl_->perform(body);
}

HttpResponse HttpClient::post_json(const std::string& url, const std::string& json) {
  std::string body;
  impl_->prepare(url, body);
  HeaderList headers;
  headers.add("Content-Type: application/json");
  impl_->add_auth(headers);
  curl_easy_setopt(impl_->curl, CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(impl_->curl, CURLOPT_POSTFIELDS, json.c_str());
  curl_easy_setopt(impl_->curl, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(json.size()));
  return impl_->perform(body);
}

HttpResponse HttpClient::put_file(const std::string& url, const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (file == nullptr) return HttpResponse{.error = "cannot open " + path + ": " + std::strerror(errno)};
  std::fseek(file, 0, SEEK_END);
  const long size = std::ftell(file);
  std::fseek(file, 0, SEEK_SET);
  std::string body;
  impl_->prepare(url, body);
  HeaderList headers;
  headers.add("Content-Type: application/octet-stream");
  impl_->add_auth(headers);
  curl_easy_setopt(impl_->curl, CURLOPT_HTTPHEADER, headers.list);
  curl_easy_setopt(impl_->curl, CURLOPT_UPLOAD, 1L);
  // libcurl's default read function reads a FILE* given as READDATA.
  curl_easy_setopt(impl_->curl, CURLOPT_READDATA, file);
  curl_easy_setopt(impl_->curl, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(size));
  // A checkpoint may take longer than a metrics request: no overall limit, but give up on a
  // transfer that stalls (under 1 KB/s for the request timeout).
  curl_easy_setopt(impl_->curl, CURLOPT_TIMEOUT_MS, 0L);
  curl_easy_setopt(impl_->curl, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(impl_->curl, CURLOPT_LOW_SPEED_TIME, static_cast<long>(impl_->options.timeout_s + 0.5));
  HttpResponse response = impl_->perform(body);
  std::fclose(file);
  return response;
}

}  // namespace volt
