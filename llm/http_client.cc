#include "llm/http_client.h"

#include <curl/curl.h>
#include <strings.h>

#include <cstdlib>
#include <memory>
#include <mutex>

namespace ks {
namespace {

// RAII for libcurl's handles (ggml-cpp.h style: a deleter per handle type).
struct CurlEasyDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct CurlSlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using CurlEasyPtr = std::unique_ptr<CURL, CurlEasyDeleter>;
using CurlSlistPtr = std::unique_ptr<curl_slist, CurlSlistDeleter>;

// curl_global_init is not thread-safe; the search starts calls from many threads.
Status GlobalInit() {
  static std::once_flag once;
  static CURLcode rc = CURLE_OK;
  std::call_once(once, [] { rc = curl_global_init(CURL_GLOBAL_DEFAULT); });
  if (rc != CURLE_OK) return Internal(std::string("curl_global_init: ") + curl_easy_strerror(rc));
  return Status::Ok();
}

size_t WriteBody(char* data, size_t size, size_t n, void* user) {
  static_cast<std::string*>(user)->append(data, size * n);
  return size * n;
}

size_t ReadHeader(char* data, size_t size, size_t n, void* user) {
  auto* resp = static_cast<HttpResponse*>(user);
  std::string line(data, size * n);
  constexpr char kName[] = "retry-after:";
  if (line.size() > sizeof kName && strncasecmp(line.c_str(), kName, sizeof kName - 1) == 0) {
    const char* v = line.c_str() + sizeof kName - 1;
    char* end = nullptr;
    double s = std::strtod(v, &end);
    // Only the delta-seconds form; an HTTP date falls back to our own back-off.
    if (end != v && s >= 0) resp->retry_after_s = s;
  }
  return size * n;
}

int Progress(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  auto* flags = static_cast<const std::vector<const std::atomic<bool>*>*>(user);
  for (const auto* f : *flags)
    if (f && f->load()) return 1;  // aborts with CURLE_ABORTED_BY_CALLBACK
  return 0;
}

}  // namespace

std::string BodyExcerpt(const std::string& body, size_t max_chars) {
  std::string out;
  for (char c : body.substr(0, max_chars)) out += (c == '\n' || c == '\r' || c == '\t') ? ' ' : c;
  if (body.size() > max_chars) out += "...";
  return out;
}

StatusOr<HttpResponse> HttpPost(const HttpRequest& request) {
  KS_RETURN_IF_ERROR(GlobalInit());
  for (const auto* f : request.cancel)
    if (f && f->load()) return Cancelled("cancelled before sending to " + request.url);

  CurlEasyPtr curl(curl_easy_init());
  if (!curl) return Internal("curl_easy_init failed");
  CurlSlistPtr headers;
  for (const auto& h : request.headers) {
    curl_slist* next = curl_slist_append(headers.get(), h.c_str());
    if (!next) return Internal("curl_slist_append failed");
    headers.release();  // `next` now owns the old list
    headers.reset(next);
  }

  HttpResponse resp;
  CURL* c = curl.get();
  curl_easy_setopt(c, CURLOPT_URL, request.url.c_str());
  curl_easy_setopt(c, CURLOPT_POST, 1L);
  curl_easy_setopt(c, CURLOPT_POSTFIELDS, request.body.data());
  curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(request.body.size()));
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, WriteBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &resp.body);
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, ReadHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &resp);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(request.connect_timeout_s * 1000));
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, static_cast<long>(request.timeout_s * 1000));
  // Signals and threads do not mix; without this, DNS time-outs use SIGALRM.
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, Progress);
  curl_easy_setopt(c, CURLOPT_XFERINFODATA, &request.cancel);
  curl_easy_setopt(c, CURLOPT_ACCEPT_ENCODING, "");  // whatever libcurl can decode
  char errbuf[CURL_ERROR_SIZE] = {0};
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, errbuf);

  CURLcode rc = curl_easy_perform(c);
  if (rc != CURLE_OK) {
    std::string why = errbuf[0] ? errbuf : curl_easy_strerror(rc);
    std::string msg = "POST " + request.url + ": " + why;
    switch (rc) {
      case CURLE_ABORTED_BY_CALLBACK: return Cancelled("cancelled during POST " + request.url);
      case CURLE_OPERATION_TIMEDOUT: return DeadlineExceeded(msg);
      case CURLE_URL_MALFORMAT:
      case CURLE_UNSUPPORTED_PROTOCOL: return InvalidArgument("bad URL: " + msg);
      default: return Unavailable(msg);
    }
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &resp.status);
  return resp;
}

}  // namespace ks
