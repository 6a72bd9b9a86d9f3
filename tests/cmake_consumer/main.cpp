// Links the installed rebound and uses every library but torch, without any other include path:
// a Service on a SQLite store with libcurl's transport behind the HTTP front (core, sqlite, http).
#include <rebound/delivery/backoff.hpp>
#include <rebound/delivery/webhook_signature.hpp>
#include <rebound/http/curl_transport.hpp>
#include <rebound/http/server.hpp>
#include <rebound/model.hpp>
#include <rebound/service.hpp>
#include <rebound/store/sqlite_job_store.hpp>
#include <rebound/version.hpp>
#ifdef CONSUMER_HAS_REDIS
#include <rebound/error.hpp>
#include <rebound/store/redis_job_store.hpp>
#endif

#include <boost/asio/io_context.hpp>
#include <boost/asio/thread_pool.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <string>
#include <thread>

int main() {
  const auto sig =
      rebound::sign_webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                            "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, R"({"test": 2432232314})");
  bool ok = sig == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" &&
            rebound::backoff::default_policy()->next_delay({}).has_value();

#ifdef CONSUMER_HAS_REDIS
  // Nothing listens on port 1: the store refuses to start, with a reason.
  try {
    rebound::RedisJobStore store(rebound::parse_redis_uri("redis://127.0.0.1:1"));
    ok = false;
  } catch (const rebound::Error& e) {
    ok = ok && std::string(e.what()).find("redis") != std::string::npos;
  }
#endif
  const std::string db = "consumer-" + std::to_string(getpid()) + ".db";
  boost::asio::thread_pool inference(2);
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });
  {
    rebound::Service service(inference.get_executor(), io.get_executor(),
                             std::make_unique<rebound::EchoModel>(),
                             std::make_unique<rebound::SqliteJobStore>(db),
                             std::make_unique<rebound::CurlTransport>(io.get_executor()));
    rebound::Server server(service, {});
    const std::string body = R"({"id":"job-1","input":{"x":1}})";
    const std::string submitted = server.serve_connection_bytes(
        "POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
    ok = ok && submitted.rfind("HTTP/1.1 202", 0) == 0;
    std::string status;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (ok && std::chrono::steady_clock::now() < deadline) {
      status = server.serve_connection_bytes(
          "GET /v1/inferences/job-1 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
      if (status.find(R"("status":"succeeded")") != std::string::npos) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ok = ok && status.find(R"("result":{"x":1})") != std::string::npos;
    ok = service.shutdown(std::chrono::seconds(10)) && ok;
  }
  work.reset();
  io_thread.join();
  inference.join();
  std::remove(db.c_str());
  std::cout << "rebound " << rebound::version << (ok ? " ok" : " BROKEN") << std::endl;
  return ok ? 0 : 1;
}
