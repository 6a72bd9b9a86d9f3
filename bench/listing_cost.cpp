// What one tenant's dead-letter page costs while another tenant has many dead letters: the
// store's own call (JobStore::failed_callbacks_page, what `GET /v1/inferences?callback_state=
// failed` runs), timed for a tenant with 20 dead letters beside 0, 10,000 and 100,000 of another
// tenant's, all newer than the first tenant's. A listing whose cost grows with the other column is
// one tenant slowing (and, by its timing, learning about) another. Memory and SQLite stores; a
// Redis store too when a redis:// URI is given (its keys left under the prefixes "{bench0}" to
// "{bench2}": use a Redis of its own).
// Usage: rebound-listing-cost [redis://HOST:PORT]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rebound/store/memory_job_store.hpp"
#include "rebound/store/sqlite_job_store.hpp"
#ifdef REBOUND_BENCH_REDIS
#include "rebound/store/redis_job_store.hpp"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using rebound::Job;
using rebound::JobStore;
using rebound::Lease;

// Gives up the callbacks of `n` jobs of `tenant`, created from `first_ms` on (one ms apart).
void dead_letters(JobStore& store, const std::string& tenant, int n, long long first_ms) {
  const auto now = std::chrono::system_clock::now();
  std::vector<Job> jobs;
  jobs.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    Job job{tenant + "-" + std::to_string(i),
            "http://receiver.example/hook",
            {{"x", i}},
            std::chrono::system_clock::time_point(std::chrono::milliseconds(first_ms + i))};
    job.tenant = tenant;
    jobs.push_back(std::move(job));
  }
  for (std::size_t from = 0; from < jobs.size(); from += 1000) {
    std::vector<rebound::PutRequest> puts;
    for (std::size_t i = from; i < std::min(jobs.size(), from + 1000); ++i)
      puts.push_back({&jobs[i], Lease{"w", now + std::chrono::hours(1)}});
    store.put_many(puts);
  }
  const rebound::JobOutcome done{rebound::JobStatus::succeeded, {{"y", 1}}, std::nullopt};
  rebound::CallbackInfo given_up;
  given_up.state = rebound::CallbackState::failed;
  given_up.attempts = 1;
  for (const Job& job : jobs) {
    const std::string key = rebound::key_of(job);
    store.finish_job(key, "w", done, Lease{"cb", now + std::chrono::hours(1)}, now);
    store.record_attempt(key, "cb", given_up, now);
  }
}

// The median of `rounds` pages of acme's, in microseconds; checks that each holds acme's 10.
// `scan`: through list_jobs with the same filter (the memory store's page before it kept an
// index of its dead letters: every job looked at).
double page_us(const JobStore& store, int rounds, bool scan) {
  rebound::JobFilter filter;
  filter.callback_state = rebound::CallbackState::failed;
  filter.id_prefix = "acme/";
  std::vector<double> took;
  for (int r = 0; r < rounds; ++r) {
    const auto start = Clock::now();
    const auto page = scan ? store.list_jobs(filter, std::nullopt, 10)
                           : store.failed_callbacks_page("acme/", std::nullopt, 10);
    took.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count());
    if (page.jobs.size() != 10) {
      std::fprintf(stderr, "acme's page holds %zu entries, not 10\n", page.jobs.size());
      std::exit(1);
    }
  }
  std::sort(took.begin(), took.end());
  return took[took.size() / 2];
}

void measure(const char* name, const std::function<std::unique_ptr<JobStore>()>& make,
             bool scan = false) {
  std::printf("%-14s", name);
  for (const int others : {0, 10000, 100000}) {
    auto store = make();
    dead_letters(*store, "acme", 20, 1764000000000);
    dead_letters(*store, "evil", others, 1764000001000);
    std::printf("  %9.1f us", page_us(*store, 200, scan));
    std::fflush(stdout);
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::printf("acme's dead-letter page (10 of its 20), median of 200, beside another tenant's\n");
  std::printf("%-14s  %12s  %12s  %12s\n", "store", "0", "10,000", "100,000");
  auto memory = [] {
    rebound::MemoryJobStoreOptions o;
    o.max_finished = 1000000;
    return std::make_unique<rebound::MemoryJobStore>(o);
  };
  measure("memory", memory);
  measure("memory, scan", memory, true);
  const auto folder = std::filesystem::temp_directory_path() / "rebound-listing-cost";
  measure("sqlite", [&] {
    std::filesystem::remove_all(folder);
    std::filesystem::create_directories(folder);
    return std::make_unique<rebound::SqliteJobStore>((folder / "jobs.db").string());
  });
  std::filesystem::remove_all(folder);
#ifdef REBOUND_BENCH_REDIS
  if (argc > 1) {
    int round = 0;  // a prefix a column: each store starts empty
    measure("redis", [&] {
      auto o = rebound::parse_redis_uri(std::string(argv[1]) + "?prefix={bench" +
                                        std::to_string(round++) + "}");
      o.command_timeout = std::chrono::seconds(10);
      auto store = std::make_unique<rebound::RedisJobStore>(o);
      return store;
    });
  }
#else
  (void)argc;
  (void)argv;
#endif
  return 0;
}
