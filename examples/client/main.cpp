// rebound-demo-client: opens a callback receiver, submits one job, prints what comes back.
// The seed's request.py, done properly: exits 0 on a (verified) result, non-zero otherwise.
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "rebound/delivery/webhook_signature.hpp"
#include "rebound/version.hpp"

namespace {

struct Callback {
  std::string body;
  std::string webhook_id;
  std::string timestamp;
  std::string signature;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"rebound-demo-client: submit one job and wait for its callback"};
  std::string server_url = "http://127.0.0.1:8080";
  std::string listen = "127.0.0.1:0";
  std::string id;
  std::string input_text = "null";
  std::string secret;
  bool server_keys = false;
  std::optional<int> priority;
  std::optional<int> wait_s;
  double timeout_s = 30;
  app.add_option("--server", server_url, "rebound-server base URL")->capture_default_str();
  app.add_option("--listen", listen, "HOST:PORT of the callback receiver (port 0: any free port)")
      ->capture_default_str();
  app.add_option("--id", id, "Job id (default: demo-<unix time>)");
  app.add_option("--input", input_text, "Model input, as JSON")->capture_default_str();
  app.add_option("--signing-secret", secret,
                 "Verify the callback's signature with this whsec_... secret (HMAC, v1) or "
                 "whpk_... public key (Ed25519, v1a)");
  app.add_flag("--server-keys", server_keys,
               "Verify the callback's Ed25519 signature with the public keys the server publishes "
               "at GET /v1/webhook-keys (fetched before submitting)");
  app.add_option("--priority", priority, "The job's priority, 0 (runs first) to 9")
      ->check(CLI::Range(0, 9));
  app.add_option("--wait", wait_s,
                 "Ask the server to answer with the result if it is ready within this many "
                 "seconds (Prefer: wait=N)")
      ->check(CLI::Range(0, 60));
  app.add_option("--timeout", timeout_s, "Seconds to wait for the callback")
      ->check(CLI::Range(0.1, 86400.0))
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  if (id.empty()) id = "demo-" + std::to_string(std::time(nullptr));
  nlohmann::json input = nlohmann::json::parse(input_text, nullptr, false);
  if (input.is_discarded()) {
    std::cerr << "rebound-demo-client: --input is not valid JSON\n";
    return 2;
  }
  const auto colon = listen.rfind(':');
  if (colon == std::string::npos) {
    std::cerr << "rebound-demo-client: --listen must be HOST:PORT\n";
    return 2;
  }
  const std::string listen_host = listen.substr(0, colon);
  int listen_port = 0;
  try {
    listen_port = std::stoi(listen.substr(colon + 1));
  } catch (const std::exception&) {
    listen_port = -1;
  }
  if (listen_port < 0 || listen_port > 65535) {
    std::cerr << "rebound-demo-client: --listen has a bad port\n";
    return 2;
  }

  // The receiver: answers 200 to the first callback and hands it to the main thread.
  std::mutex mutex;
  std::condition_variable arrived;
  std::optional<Callback> received;
  httplib::Server receiver;
  receiver.Post("/v1/results", [&](const httplib::Request& req, httplib::Response& res) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (!received) {
        received = Callback{req.body, req.get_header_value("webhook-id"),
                            req.get_header_value("webhook-timestamp"),
                            req.get_header_value("webhook-signature")};
      }
    }
    arrived.notify_all();
    res.set_content("{}", "application/json");
  });
  const int port = listen_port == 0
                       ? receiver.bind_to_any_port(listen_host)
                       : (receiver.bind_to_port(listen_host, listen_port) ? listen_port : -1);
  if (port <= 0) {
    std::cerr << "rebound-demo-client: cannot listen on " << listen << "\n";
    return 2;
  }
  std::thread receiver_thread([&] { receiver.listen_after_bind(); });
  auto stop_receiver = [&] {
    receiver.stop();
    receiver_thread.join();
  };

  const std::string callback_url =
      "http://" + listen_host + ":" + std::to_string(port) + "/v1/results";
  nlohmann::json job = {{"id", id}, {"callback_url", callback_url}, {"input", input}};
  if (priority) job["priority"] = *priority;
  std::cout << "submitting " << job.dump() << " to " << server_url << std::endl;

  httplib::Client client(server_url);
  client.set_connection_timeout(std::chrono::seconds(5));
  std::vector<std::string> keys;
  if (!secret.empty()) keys.push_back(secret);
  if (server_keys) {
    auto published = client.Get("/v1/webhook-keys");
    const auto doc = published && published->status == 200
                         ? nlohmann::json::parse(published->body, nullptr, false)
                         : nlohmann::json();
    if (doc.is_object() && doc.contains("keys") && doc["keys"].is_array()) {
      for (const auto& key : doc["keys"])
        if (key.is_string()) keys.push_back(key.get<std::string>());
    }
    if (keys.empty() || (keys.size() == 1 && !secret.empty())) {
      std::cerr << "rebound-demo-client: the server publishes no webhook keys "
                   "(start it with --signing-key whsk_...)\n";
      stop_receiver();
      return 1;
    }
    std::cout << "server's webhook keys: " << doc["keys"].dump() << std::endl;
  }
  httplib::Headers headers;
  if (wait_s) headers.emplace("Prefer", "wait=" + std::to_string(*wait_s));
  auto res = client.Post("/v1/inferences", headers, job.dump(), "application/json");
  if (!res) {
    std::cerr << "rebound-demo-client: cannot reach " << server_url << ": "
              << httplib::to_string(res.error()) << "\n";
    stop_receiver();
    return 1;
  }
  std::cout << "server answered " << res->status << " " << res->body << std::endl;
  // 200: with --wait, the job was final in time and the answer is its status; the callback still
  // comes as usual.
  if (res->status != 202 && res->status != 200) {
    stop_receiver();
    return 1;
  }

  std::unique_lock<std::mutex> lock(mutex);
  const bool got = arrived.wait_for(lock, std::chrono::duration<double>(timeout_s),
                                    [&] { return received.has_value(); });
  const std::optional<Callback> callback = received;
  lock.unlock();
  stop_receiver();
  if (!got) {
    std::cerr << "rebound-demo-client: no callback within " << timeout_s << " s\n";
    return 1;
  }
  std::cout << "callback received (webhook-id " << callback->webhook_id << "): " << callback->body
            << std::endl;
  if (!keys.empty()) {
    bool valid = false;
    for (const auto& key : keys) {
      valid = valid || rebound::verify_webhook(key, callback->webhook_id, callback->timestamp,
                                               callback->body, callback->signature,
                                               static_cast<std::int64_t>(std::time(nullptr)));
    }
    if (!valid) {
      std::cerr << "rebound-demo-client: the callback's signature does not verify\n";
      return 3;
    }
    std::cout << "signature verified" << std::endl;
  }
  return 0;
}
