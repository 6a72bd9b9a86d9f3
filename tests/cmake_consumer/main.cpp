// Links the installed rebound and uses every library but torch, without any other include path:
// a JobQueue that owns its threads, on a SQLite store from make_store, with results back through
// use_future and a plain handler, libcurl's transport by default, behind the HTTP front.
#include <rebound/rebound.hpp>
#ifdef CONSUMER_HAS_REDIS
#include <rebound/store/redis_job_store.hpp>
#endif

#include <boost/asio/use_future.hpp>

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

// A backend of one's own that warms up (Model::warm_up): the queue calls it once, before any job.
class Warmed final : public rebound::Model {
 public:
  explicit Warmed(int& warm_ups) : warm_ups_(warm_ups) {}
  std::string name() const override { return "warmed"; }
  void warm_up() override { ++warm_ups_; }
  rebound::Prediction predict(const nlohmann::json& input) override {
    return rebound::Prediction::success(input);
  }

 private:
  int& warm_ups_;
};

int main() {
  const auto sig =
      rebound::sign_webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                            "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, R"({"test": 2432232314})");
  bool ok = sig == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" &&
            rebound::backoff::default_policy()->next_delay({}).has_value();

#ifdef CONSUMER_HAS_REDIS
  // Nothing listens on port 1: the store refuses to start, with a reason.
  try {
    rebound::RedisJobStoreOptions options = rebound::parse_redis_uri("redis://127.0.0.1:1");
    options.batch_writes = false;  // every call its own round trip, on the caller's thread
    rebound::RedisJobStore store(options);
    ok = false;
  } catch (const rebound::Error& e) {
    ok = ok && std::string(e.what()).find("redis") != std::string::npos;
  }
#endif
  {
    // A store used directly, as a custom store's author would: the renewals of a pass in one
    // call, and the acknowledgement that answers through a callback.
    rebound::MemoryJobStore store;
    const auto now = std::chrono::system_clock::now();
    ok = ok && store.put(rebound::make_job("held"),
                         rebound::Lease{"me", now + std::chrono::seconds(30)}) ==
                   rebound::PutOutcome::created;
    // Several jobs in one call, as a batch submission stores them: one outcome each, in order.
    const rebound::Job fresh = rebound::make_job("fresh"), again = rebound::make_job("held");
    ok = ok && store.put_many({{&fresh, std::nullopt}, {&again, std::nullopt}}) ==
                   std::vector<rebound::PutOutcome>{rebound::PutOutcome::created,
                                                    rebound::PutOutcome::duplicate};
    ok = ok && store.renew_all({{"held", {"me", now + std::chrono::seconds(60)}},
                                {"other", {"me", now + std::chrono::seconds(60)}}},
                               now) == std::vector<bool>{true, false};
    // Asked for the record, it answers the job as stored (what a wait is completed with).
    bool acknowledged = false;
    store.async_finish_job("held", "me", {rebound::JobStatus::succeeded, 1, std::nullopt, now},
                           std::nullopt, now, true,
                           [&](std::exception_ptr error, rebound::JobStore::FinishAnswer answer) {
                             acknowledged = !error && answer.held && answer.record &&
                                            answer.record->outcome.result == 1;
                           });
    ok = ok && acknowledged && store.get("held")->status == rebound::JobStatus::succeeded &&
         store.answer_thread(rebound::JobStore::AsyncCall::finish_job, true) ==
             rebound::JobStore::AnswerThread::caller;
  }
  {
    int warm_ups = 0;
    rebound::JobQueue queue(std::make_unique<Warmed>(warm_ups));
    ok = ok && warm_ups == 1 && queue.ready() && queue.telemetry().model_ready() &&
         queue.async_submit(rebound::make_job("warm", 7), boost::asio::use_future).get().status ==
             rebound::JobStatus::succeeded &&
         warm_ups == 1;
  }
  {
    // Two versions of one model (ModelRepository): the highest is the default, a job may pin the
    // other, and each warms up once.
    int warm_ups = 0;
    rebound::ModelRepository models;
    models.add(std::make_unique<Warmed>(warm_ups), "1")
        .add(std::make_unique<Warmed>(warm_ups), "2");
    // Live loads build their version with the repository's loader (here: version 3).
    models.set_loader([&warm_ups](const rebound::ModelRef&) -> std::unique_ptr<rebound::Model> {
      return std::make_unique<Warmed>(warm_ups);
    });
    rebound::JobQueue queue(std::move(models));
    rebound::Job pinned = rebound::make_job("pinned", 1);
    pinned.model = rebound::ModelRef{"warmed", "1"};
    ok = ok && warm_ups == 2 &&
         queue.async_submit(std::move(pinned), boost::asio::use_future).get().job.model.version ==
             "1" &&
         queue.async_submit(rebound::make_job("default", 2), boost::asio::use_future)
                 .get()
                 .job.model.version == "2";
    // Swapped live: version 3 loaded and made the default, version 1 unloaded.
    const rebound::ModelInfo loaded =
        queue.models().async_load("warmed", "3", boost::asio::use_future).get();
    ok = ok && loaded.versions.size() == 3 &&
         loaded.versions.back().state == rebound::VersionState::ready &&
         !queue.models().set_route("warmed", {"3", {}}) &&
         queue.models()
                 .async_unload("warmed", "1", boost::asio::use_future)
                 .get()
                 .versions.front()
                 .state == rebound::VersionState::unloaded &&
         queue.async_submit(rebound::make_job("swapped", 3), boost::asio::use_future)
                 .get()
                 .job.model.version == "3";
  }
  {
    // An operator's decision per tenant, read as rebound-server's --tenant reads it: the default
    // tenant may submit two jobs at once, then errc::tenant_rate.
    rebound::JobQueueOptions options;
    options.tenants.emplace("", rebound::parse_tenant_spec("acme:rate=0.01,burst=2").second);
    // A tenant that just sent callbacks keeps its reservation of the connections for 5 s.
    options.origins.tenant_share_window = std::chrono::seconds(5);
    rebound::JobQueue queue(std::make_unique<rebound::EchoModel>(),
                            std::make_unique<rebound::MemoryJobStore>(), options);
    std::vector<rebound::Job> jobs;
    for (int n = 0; n < 3; ++n)
      jobs.push_back(rebound::make_job("rated-" + std::to_string(n)));
    const std::vector<rebound::Submitted> answers = queue.submit_many(std::move(jobs));
    ok = ok && answers.size() == 3 && answers[0] && answers[1] &&
         answers[2].error == rebound::errc::tenant_rate;
  }
  {
    // Traces, as a library user turns them on: every job's submission and run become spans, an
    // observer exports them. Nothing listens on port 1, so they are dropped, and counted in the
    // queue's metrics (wired by the queue itself).
    rebound::OtlpTracerOptions to;
    to.endpoint = "http://127.0.0.1:1/v1/traces";
    to.model_name = "echo";
    to.interval = std::chrono::milliseconds(20);
    auto tracer = std::make_shared<rebound::OtlpTracer>(to);
    rebound::JobQueueOptions options;
    options.observers.push_back(tracer);
    options.trace_submissions = true;
    rebound::JobQueue queue(std::make_unique<rebound::EchoModel>(),
                            std::make_unique<rebound::MemoryJobStore>(), options);
    const rebound::JobRecord done =
        queue.async_submit(rebound::make_job("traced"), boost::asio::use_future).get();
    ok = ok && done.job.traceparent.size() == 55;  // a trace context of its own
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (tracer->dropped() < 2 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ok = ok && tracer->dropped() >= 2 && tracer->exported() == 0 &&
         queue.telemetry().metrics().trace_spans_dropped.load() >= 2;
  }
  const std::string db = "consumer-" + std::to_string(getpid()) + ".db";
  {
    rebound::JobQueueOptions options;
    options.workers = 2;
    options.allow_private_callbacks = true;
    // At most 2 jobs wait in memory; those submitted beyond wait in the SQLite file.
    options.prefetch = 2;
    rebound::JobQueue queue(std::make_unique<rebound::EchoModel>(),
                            rebound::make_store("sqlite:" + db), options);
    // The full library delivers callbacks without being told how.
    ok = ok && queue.operations().delivers_callbacks();
    rebound::Job job;
    job.id = "job-0";
    job.input = {{"x", 0}};
    const rebound::JobRecord done = queue.async_submit(job, boost::asio::use_future).get();
    ok = ok && done.status == rebound::JobStatus::succeeded && done.outcome.result == job.input;
    // The record names the model that ran it (rebound::ModelRef), as the SQLite file keeps it.
    ok = ok && done.job.model == rebound::ModelRef{"echo", "1"} &&
         rebound::is_valid_model_name(done.job.model.name);
    std::promise<boost::system::error_code> refused;
    queue.async_submit(job, [&](boost::system::error_code ec, rebound::JobRecord r) {
      refused.set_value(
          ec ? ec : (r.job.id == "job-0" ? boost::system::error_code{} : rebound::errc::not_found));
    });
    ok = ok && !refused.get_future().get();  // the same request: the first job's record

    // GET /v1/models names the model by the digest the program gives it.
    rebound::ServerOptions server_options;
    server_options.model_digest = rebound::model_digest("echo");
    rebound::Server server(queue, server_options);
    const std::string models = server.serve_connection_bytes(
        "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    ok = ok && models.rfind("HTTP/1.1 200", 0) == 0 &&
         models.find(server_options.model_digest) != std::string::npos;
    const std::string body = R"({"id":"job-1","input":{"x":1}})";
    const std::string submitted = server.serve_connection_bytes(
        "POST /v1/inferences HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: " +
        std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body);
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
    // The queue's numbers as the store counts them, and a page of dead letters (none here).
    const std::optional<rebound::QueueStats> stats = queue.telemetry().queue_stats();
    ok = ok && stats && stats->queued == 0 && stats->running == 0;
    // A store's own counters for /metrics (JobStore::counters): none from the shipped memory
    // and SQLite stores (PostgresJobStore gives its transactions), so none rendered here.
    const std::vector<rebound::StoreCounter> counters = rebound::MemoryJobStore().counters();
    ok = ok && counters.empty() &&
         queue.telemetry().render_metrics().find("rebound_store_transactions") == std::string::npos;
    const rebound::JobPage dead = queue.operations().failed_callbacks_page("", std::nullopt, 10);
    ok = ok && dead.jobs.empty() && !dead.next;
    // What the operator console lists: every job by filter, here the two that succeeded, with
    // their attempt logs kept (none: they had no callback).
    rebound::JobFilter succeeded;
    succeeded.status = rebound::JobStatus::succeeded;
    succeeded.id_prefix = "job-1";
    const rebound::JobPage listed = queue.operations().list_jobs(succeeded, std::nullopt, 10);
    ok = ok && listed.jobs.size() == 1 && listed.jobs[0].job.id == "job-1";
    succeeded.id_prefix.clear();
    ok = ok && queue.operations().list_jobs(succeeded, std::nullopt, 10).jobs.size() == 2;
    ok = ok && queue.find("job-1") && queue.find("job-1")->attempt_log.empty();
    // A burst beyond the prefetch: parked in the store, claimed back as the workers drain. Half
    // one by one, half in one call (one SQLite transaction).
    for (int n = 2; n < 21; ++n) {
      const rebound::Submitted taken =
          queue
              .submit(rebound::make_job("job-" + std::to_string(n), {{"x", n}}),
                      boost::asio::use_future)
              .get();
      ok = ok && taken && !taken.duplicate;
    }
    std::vector<rebound::Job> rest;
    for (int n = 21; n < 40; ++n)
      rest.push_back(rebound::make_job("job-" + std::to_string(n), {{"x", n}}));
    for (const rebound::Submitted& taken : queue.submit_many(std::move(rest)))
      ok = ok && taken && !taken.duplicate;
    const auto burst_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    auto last = queue.find("job-39");
    while (ok && (!last || last->status != rebound::JobStatus::succeeded) &&
           std::chrono::steady_clock::now() < burst_deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      last = queue.find("job-39");
    }
    ok = ok && last && last->status == rebound::JobStatus::succeeded;
    ok = queue.shutdown(std::chrono::seconds(10)) && ok;
    queue.abandon_running();  // (a process past its drain's deadline; nothing runs here)
  }
  std::remove(db.c_str());
  std::cout << "rebound " << rebound::version << (ok ? " ok" : " BROKEN") << std::endl;
  return ok ? 0 : 1;
}
