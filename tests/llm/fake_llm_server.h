// A loopback HTTP server speaking just enough of the OpenAI chat-completions and
// Anthropic messages APIs for the client tests. Each test scripts the replies
// (status, headers, body, delay) in order; the last one repeats. Requests are
// kept for inspection. Thread-safe; stops (and ends slow replies early) on
// destruction.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace ks::testing {

struct FakeReply {
  int status = 200;
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
  double delay_s = 0;
};

struct SeenRequest {
  std::string path;
  std::string body;
  httplib::Headers headers;
};

class FakeLlmServer {
 public:
  FakeLlmServer() {
    auto handle = [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res); };
    server_.Post("/v1/chat/completions", handle);
    server_.Post("/v1/messages", handle);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // This httplib has no wait_until_ready; connections queue in the backlog
    // anyway once bound, but wait so that stop() never races listen().
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeLlmServer() {
    stopping_ = true;
    server_.stop();
    thread_.join();
  }
  FakeLlmServer(const FakeLlmServer&) = delete;
  FakeLlmServer& operator=(const FakeLlmServer&) = delete;

  int port() const { return port_; }
  std::string base() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string openai_base() const { return base() + "/v1"; }

  void Script(std::vector<FakeReply> replies) {
    std::lock_guard<std::mutex> lock(mu_);
    script_.assign(replies.begin(), replies.end());
  }
  std::vector<SeenRequest> seen() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  int max_in_flight() const { return max_in_flight_; }

  // Reply bodies in each API's format.
  static std::string OpenAiBody(const std::string& text, const std::string& finish = "stop", int in = 11,
                                int out = 7) {
    return nlohmann::json{{"id", "chatcmpl-1"},
                          {"object", "chat.completion"},
                          {"choices", {{{"index", 0},
                                        {"message", {{"role", "assistant"}, {"content", text}}},
                                        {"finish_reason", finish}}}},
                          {"usage", {{"prompt_tokens", in}, {"completion_tokens", out}, {"total_tokens", in + out}}}}
        .dump();
  }
  static std::string AnthropicBody(const std::string& text, const std::string& stop = "end_turn", int in = 13,
                                   int out = 5) {
    return nlohmann::json{{"id", "msg_1"},
                          {"type", "message"},
                          {"role", "assistant"},
                          {"content", {{{"type", "text"}, {"text", text}}}},
                          {"stop_reason", stop},
                          {"usage", {{"input_tokens", in}, {"output_tokens", out}}}}
        .dump();
  }

 private:
  void Handle(const httplib::Request& req, httplib::Response& res) {
    int now = ++in_flight_;
    for (int m = max_in_flight_; now > m && !max_in_flight_.compare_exchange_weak(m, now);) {
    }
    FakeReply reply;
    {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back({req.path, req.body, req.headers});
      if (!script_.empty()) {
        reply = script_.front();
        if (script_.size() > 1) script_.pop_front();
      } else {
        reply = {500, R"({"error":{"message":"no scripted reply"}})", {}, 0};
      }
    }
    auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(reply.delay_s);
    while (!stopping_ && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    res.status = reply.status;
    for (const auto& [k, v] : reply.headers) res.set_header(k, v);
    res.set_content(reply.body, "application/json");
    --in_flight_;
  }

  httplib::Server server_;
  int port_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  mutable std::mutex mu_;
  std::deque<FakeReply> script_;
  std::vector<SeenRequest> seen_;
};

}  // namespace ks::testing
