// Links rebound::core alone: a JobQueue with the memory store and a callback transport of its own
// (no cpp-httplib, libcurl or SQLite). The transport answers 503 once, then 200; the consumer
// checks that the job's signed callback arrived after a retry. A JobQueue given no transport
// refuses a job with a callback URL (errc::no_transport) and still runs one without.
#include <rebound/delivery/backoff.hpp>
#include <rebound/delivery/callback_transport.hpp>
#include <rebound/delivery/origin_gate.hpp>
#include <rebound/delivery/webhook_signature.hpp>
#include <rebound/job_queue.hpp>
#include <rebound/model.hpp>
#include <rebound/store/memory_job_store.hpp>
#include <rebound/tenant.hpp>

#include <boost/asio/io_context.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/use_future.hpp>

#include <chrono>
#include <iostream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace {

const char* const kSecret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

// Delivers "in process": a real service would hand the request to its own HTTP stack here.
class InProcessTransport final : public rebound::CallbackTransport {
 public:
  explicit InProcessTransport(boost::asio::any_io_executor executor) : executor_(executor) {}
  void send(rebound::CallbackRequest request, rebound::CallbackResponseHandler on_done) override {
    rebound::CallbackResponse response;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      requests_.push_back(request);
      response.status = requests_.size() == 1 ? 503 : 200;
    }
    boost::asio::post(executor_, [on_done, response] { on_done(response); });
  }
  std::vector<rebound::CallbackRequest> requests() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return requests_;
  }

 private:
  boost::asio::any_io_executor executor_;
  mutable std::mutex mutex_;
  std::vector<rebound::CallbackRequest> requests_;
};

std::string header(const rebound::CallbackRequest& request, const std::string& name) {
  for (const auto& [key, value] : request.headers)
    if (key == name) return value;
  return {};
}

}  // namespace

int main() {
  boost::asio::thread_pool inference(2);
  boost::asio::io_context io;
  auto work = boost::asio::make_work_guard(io);
  std::thread io_thread([&] { io.run(); });

  auto transport = std::make_unique<InProcessTransport>(io.get_executor());
  InProcessTransport* sent = transport.get();
  rebound::JobQueueOptions options;
  options.delivery.backoff =
      rebound::backoff::max_tries(rebound::backoff::constant(std::chrono::milliseconds(50)), 5);
  options.delivery.signing_secrets = {kSecret};
  bool ok = false;
  {
    rebound::JobQueue service(
        inference.get_executor(), io.get_executor(), std::make_unique<rebound::EchoModel>(),
        std::make_unique<rebound::MemoryJobStore>(), std::move(transport), options);
    rebound::Job job;
    job.id = "job-1";
    job.callback_url = "https://receiver.example/hook";
    job.input = {{"x", 1}};
    ok = !service.submit(job, boost::asio::use_future).get().duplicate;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    std::optional<rebound::JobRecord> record;
    while (ok && std::chrono::steady_clock::now() < deadline) {
      record = service.find("job-1");
      if (record && record->callback.state == rebound::CallbackState::delivered) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    const auto requests = sent->requests();
    ok = ok && record && record->callback.state == rebound::CallbackState::delivered &&
         record->callback.attempts == 2 && requests.size() == 2 &&
         requests[1].url == "https://receiver.example/hook" &&
         requests[1].body.find(R"("x":1)") != std::string::npos &&
         rebound::verify_webhook(kSecret, header(requests[1], "webhook-id"),
                                 header(requests[1], "webhook-timestamp"), requests[1].body,
                                 header(requests[1], "webhook-signature"),
                                 std::chrono::duration_cast<std::chrono::seconds>(
                                     std::chrono::system_clock::now().time_since_epoch())
                                     .count());
    ok = service.shutdown(std::chrono::seconds(10)) && ok;
  }
  work.reset();
  io_thread.join();
  inference.join();
  {
    // rebound::core has no transport of its own: a callback job is refused, never dropped.
    rebound::JobQueue bare(std::make_unique<rebound::EchoModel>());
    rebound::Job job;
    job.id = "with-callback";
    job.callback_url = "https://receiver.example/hook";
    ok = ok && !bare.operations().delivers_callbacks();
    try {
      bare.submit(job, boost::asio::use_future).get();
      ok = false;
    } catch (const boost::system::system_error& e) {
      ok = ok && e.code() == rebound::errc::no_transport;
    }
    try {
      bare.async_submit(job, boost::asio::use_future).get();
      ok = false;
    } catch (const boost::system::system_error& e) {
      ok = ok && e.code() == rebound::errc::no_transport;
    }
    job.id = "poll-only";
    job.callback_url.clear();
    job.input = 7;
    ok = ok && bare.async_submit(job, boost::asio::use_future).get().outcome.result == 7;
  }
  {
    // A store read as a tool would, through the read side alone: several jobs at once, one
    // answer an id, in order.
    rebound::MemoryJobStore store;
    rebound::Job job;
    job.id = "stored";
    job.input = 3;
    ok = ok && store.put(job) == rebound::PutOutcome::created;
    const rebound::JobReadStore& reads = store;
    const auto many = reads.get_many({"missing", "stored"});
    ok = ok && many.size() == 2 && !many[0] && many[1] && many[1]->job.input == 3;
  }
  {
    // A gate in front of a transport of one's own: one failure opens the circuit, and the next
    // request is deferred without reaching the transport.
    boost::asio::io_context gate_io;
    auto down = std::make_unique<InProcessTransport>(gate_io.get_executor());  // 503 first
    InProcessTransport* reached = down.get();
    rebound::OriginGateOptions limits;
    limits.breaker_failures = 1;
    rebound::OriginGate gate(std::move(down), limits);
    std::vector<rebound::CallbackResponse> answers;
    for (int i = 0; i < 2; ++i) {
      rebound::CallbackRequest request;
      request.url = "https://receiver.example/hook";
      gate.send(request, [&](rebound::CallbackResponse r) { answers.push_back(r); });
      gate_io.run();
      gate_io.restart();
    }
    ok = ok && answers.size() == 2 && answers[0].status == 503 &&
         answers[1].error == rebound::TransportError::deferred && reached->requests().size() == 1;
    // Tenants: a job's tenant and its key, and each tenant's own signing secret.
    rebound::Job job = rebound::make_job("1234");
    job.tenant = "acme";
    ok = ok && rebound::key_of(job) == "acme/1234" &&
         rebound::webhook_id_of(job) == "msg_acme.1234" &&
         rebound::derive_webhook_keys({kSecret}, "acme") !=
             rebound::derive_webhook_keys({kSecret}, "globex");
  }
  std::cout << "rebound::core " << (ok ? "ok" : "BROKEN") << std::endl;
  return ok ? 0 : 1;
}
