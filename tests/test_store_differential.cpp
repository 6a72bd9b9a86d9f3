// The stores side by side: one seeded random sequence of store calls (puts, claims by several
// holders, renewals, acknowledgements, cancellations, callback attempts, redeliveries), with the
// clock moved forward and sometimes back and the durable stores restarted, applied to every store
// at once; every answer and every record is compared with the memory store's after every step.
//
// Bounded for CI (REBOUND_DIFF_STEPS steps, default 600, on seed REBOUND_DIFF_SEED, default 1 and
// the next two); by hand, run it as long as one likes:
//   REBOUND_DIFF_STEPS=200000 REBOUND_DIFF_SEED=$RANDOM build/tests/rebound_tests -tc='stores*'
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "rebound/store/memory_job_store.hpp"
#include "rebound/store/sqlite_job_store.hpp"
#include "rebound/tenant.hpp"
#include "support/temp_dir.hpp"
#ifdef REBOUND_TEST_REDIS
#include "rebound/store/redis_job_store.hpp"
#include "support/redis_server.hpp"
#endif
#ifdef REBOUND_TEST_POSTGRES
#include "rebound/store/postgres_job_store.hpp"
#include "support/postgres_server.hpp"
#endif

using namespace std::chrono_literals;
using rebound::CallbackState;
using rebound::JobRecord;
using rebound::JobStatus;
using rebound::JobStore;
using rebound::Lease;
using TimePoint = std::chrono::system_clock::time_point;

namespace {

std::size_t env_number(const char* name, std::size_t otherwise) {
  const char* v = std::getenv(name);
  return v && *v ? static_cast<std::size_t>(std::strtoull(v, nullptr, 10)) : otherwise;
}

// A store under test, and how to start it again on what it keeps (null: it keeps nothing).
struct Subject {
  std::string name;
  std::unique_ptr<JobStore> store;
  std::function<std::unique_ptr<JobStore>()> reopen;  ///< null: not restarted
};

// The part of a record every store must agree on.
std::string view(const std::optional<JobRecord>& r) {
  if (!r) return "absent";
  std::ostringstream out;
  out << "id=" << r->job.id << " created=" << r->job.created_at.time_since_epoch() / 1ms
      << " events=" << static_cast<int>(r->job.webhook_events)
      << " status=" << rebound::to_string(r->status) << " input=" << r->job.input.dump()
      << " url=" << r->job.callback_url << " tenant=" << r->job.tenant
      << " priority=" << r->job.priority << " model=" << r->job.model.name << "/"
      << r->job.model.version
      << " started=" << (r->started_at == TimePoint{} ? 0 : r->started_at.time_since_epoch() / 1ms)
      << " callback=" << rebound::to_string(r->callback.state)
      << " attempts=" << r->callback.attempts;
  if (r->callback.state == CallbackState::pending) {
    out << " next=" << r->callback.next_attempt_at.time_since_epoch() / 1ms
        << " delivery_attempts=" << r->callback.delivery_attempts
        << " delivery_started=" << r->callback.delivery_started_at.time_since_epoch() / 1ms;
  }
  if (r->callback.state == CallbackState::failed) out << " last_error=" << r->callback.last_error;
  if (rebound::is_final(r->status)) {
    out << " result=" << r->outcome.result.dump()
        << " finished=" << r->outcome.finished_at.time_since_epoch() / 1ms;
    if (r->outcome.error)
      out << " error=" << r->outcome.error->code << ":" << r->outcome.error->message;
  }
  out << " log=[";
  for (const auto& a : r->attempt_log)
    out << a.at.time_since_epoch() / 1ms << "/" << a.http_status << "/" << a.error << " ";
  out << "]";
  return out.str();
}

std::string keys_of(std::vector<JobRecord> claimed) {
  std::set<std::string> keys;
  for (const auto& r : claimed)
    keys.insert(rebound::key_of(r.job));
  std::string out;
  for (const auto& k : keys)
    out += k + " ";
  return out;
}

class Run {
 public:
  Run(std::vector<Subject>& subjects, unsigned seed) : subjects_(subjects), random_(seed) {
    // The real time, to the millisecond: stores that prune by the wall clock keep what it stamps.
    now_ = TimePoint(std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::system_clock::now().time_since_epoch()));
    for (const char* tenant : {"", "acme"}) {
      for (int i = 0; i < 5; ++i)
        jobs_.push_back({"j" + std::to_string(i), tenant});
    }
  }

  // One random step on every store; false (with the steps that led there) at the first
  // disagreement.
  bool step(std::size_t n) {
    std::string what;
    std::vector<std::string> answers;
    // Every time a step stamps (now, a lease's end, a callback's next attempt) is one no earlier
    // step used: the order of claims among work that became claimable at the same moment is not
    // part of the contract, so no two things do.
    now_ = fresh(now_ + 1ms);
    const int pick = number(0, 99);
    const JobRefs& job = jobs_[number(0, static_cast<int>(jobs_.size()) - 1)];
    const std::string key = rebound::job_key(job.tenant, job.id);
    // Each lease given has a holder of its own, as a JobQueue's claims do ("server/n"); the calls
    // that need one (renewals, acknowledgements) name one of the last few given, so that some
    // are late (the lease ran out or was taken over) and most are not.
    const std::string holder = next_holder();
    const std::string recent = recent_holder();
    const int lease_ms = number(10000, 30000);
    const Lease lease{holder, fresh(now_ + std::chrono::milliseconds(lease_ms))};
    if (pick < 20) {
      // (Each draw in a statement of its own: the order of a call's arguments is unspecified.)
      const int n_input = number(0, 1);
      const bool with_url = number(0, 3) > 0;
      rebound::Job j = rebound::make_job(job.id, nlohmann::json{{"n", n_input}},
                                         with_url ? "http://cb.test/" + job.id : "");
      j.tenant = job.tenant;
      const int priorities[] = {0, 4, 5, 9};
      j.priority = priorities[number(0, 3)];
      j.webhook_events = static_cast<std::uint8_t>(number(1, 3));  // started, completed, both
      j.created_at = now_;
      // None (an older server's job), or a name and a version: a resubmission under another
      // version is the same request, under another name a conflict.
      const rebound::ModelRef models[] = {{}, {"iris", "1"}, {"iris", "2"}, {"resnet", "1"}};
      j.model = models[number(0, 3)];
      const bool claimed = number(0, 1) == 1;
      what = "put " + key + (claimed ? " claimed by " + holder : "");
      for (auto& s : subjects_) {
        const auto out = s.store->put(j, claimed ? std::optional<Lease>(lease) : std::nullopt);
        answers.push_back(std::to_string(static_cast<int>(out)));
      }
    } else if (pick < 32) {
      // More than there are jobs: which of several claimable ones a smaller claim takes first is
      // the contract suite's to test (the memory store orders a job whose lease was lengthened
      // by the end it had when last filed); here every store must find the same ones claimable.
      const std::size_t max = 16;
      // A small claim, then the rest with the same lease: the union is all that was claimable,
      // the same in every store; of the small one, how many and of which priorities are
      // compared (which of equal standing come first is not).
      const std::size_t small = static_cast<std::size_t>(number(1, 3));
      what = "claim_jobs " + std::to_string(small) + " then all by " + holder;
      for (auto& s : subjects_) {
        auto first = s.store->claim_jobs(small, lease, now_);
        auto rest = s.store->claim_jobs(max, lease, now_);
        std::string priorities;
        for (const auto& r : first)
          priorities += std::to_string(r.job.priority);
        std::sort(priorities.begin(), priorities.end());
        first.insert(first.end(), rest.begin(), rest.end());
        answers.push_back(keys_of(first) + "| first " + priorities);
      }
      spread(answers, holder);
    } else if (pick < 40) {
      const Lease renewed{recent, lease.until};
      what = "renew " + key + " by " + recent;
      for (auto& s : subjects_)
        answers.push_back(s.store->renew(key, renewed, now_) ? "renewed" : "refused");
    } else if (pick < 46) {
      what = "mark_running " + key;
      for (auto& s : subjects_)
        s.store->mark_running(key, now_);
    } else if (pick < 58) {
      const bool ok = number(0, 2) > 0;
      const rebound::JobOutcome outcome =
          ok ? rebound::JobOutcome{JobStatus::succeeded, {{"r", number(0, 9)}}, std::nullopt, now_}
             : rebound::JobOutcome{JobStatus::failed, nullptr,
                                   rebound::ErrorInfo{"model_error", "no"}, now_};
      // A JobQueue claims the callback as it acknowledges (a lease of its own) only for a job
      // whose end is called back, and only sometimes (when it can send it at once).
      const auto before = subjects_.front().store->get(key);
      const bool deliver = before && before->job.wants_completion_callback() && number(0, 1) == 1;
      what = "finish_job " + key + " by " + recent + (deliver ? " delivering" : "");
      for (auto& s : subjects_) {
        const bool out = s.store->finish_job(
            key, recent, outcome, deliver ? std::optional<Lease>(lease) : std::nullopt, now_);
        answers.push_back(out ? "acknowledged" : "refused");
      }
    } else if (pick < 62) {
      what = "cancel " + key;
      const rebound::JobOutcome outcome{JobStatus::cancelled, nullptr,
                                        rebound::ErrorInfo{"cancelled", "by the test"}, now_};
      for (auto& s : subjects_)
        answers.push_back(std::to_string(static_cast<int>(s.store->cancel(key, outcome, now_))));
    } else if (pick < 72) {
      // More than there are jobs: which of several claimable ones a smaller claim takes first is
      // the contract suite's to test (the memory store orders a job whose lease was lengthened
      // by the end it had when last filed); here every store must find the same ones claimable.
      const std::size_t max = 16;
      what = "claim_callbacks " + std::to_string(max) + " by " + holder;
      for (auto& s : subjects_)
        answers.push_back(keys_of(s.store->claim_callbacks(max, lease, now_)));
      spread(answers, holder);
    } else if (pick < 84) {
      // The caller's next state of the callback, from what the reference holds.
      const auto before = subjects_.front().store->get(key);
      rebound::CallbackInfo after;
      after.attempts = (before ? before->callback.attempts : 0) + 1;
      const int verdict = number(0, 2);
      after.state = verdict == 0   ? CallbackState::delivered
                    : verdict == 1 ? CallbackState::pending
                                   : CallbackState::failed;
      if (after.state != CallbackState::delivered) after.last_error = "HTTP 503";
      after.next_attempt_at = fresh(now_ + std::chrono::milliseconds(number(1, 20000)));
      after.delivery_attempts = after.attempts;
      after.delivery_started_at = now_;
      const rebound::CallbackAttempt attempt{now_, verdict == 0 ? 200 : 503, after.last_error, 5ms,
                                             ""};
      const bool deferral = number(0, 5) == 0;  // sends nothing: no attempt joins the log
      what = "record_attempt " + key + " by " + recent + " -> " +
             std::string(rebound::to_string(after.state)) + (deferral ? " (a deferral)" : "");
      for (auto& s : subjects_) {
        const bool out = s.store->record_attempt(
            key, recent, after, now_,
            deferral ? std::nullopt : std::optional<rebound::CallbackAttempt>(attempt));
        answers.push_back(out ? "recorded" : "refused");
      }
    } else if (pick < 89) {
      what = "redeliver " + key + " to " + holder;
      for (auto& s : subjects_)
        answers.push_back(std::to_string(static_cast<int>(s.store->redeliver(key, lease, now_))));
    } else if (pick < 97) {
      // Time passes: within a lease mostly, past one sometimes; now and then the clock steps
      // back a little (an NTP correction).
      const int ms = number(0, 9) == 0 ? -number(1, 5000) : number(1, 45000);
      what = "clock " + std::to_string(ms) + " ms";
      now_ += std::chrono::milliseconds(ms);
    } else {
      // A shared store (Redis, PostgreSQL) keeps its leases over a restart. SQLite's live in its
      // one process: at open it releases them, and what they held is due at its creation time
      // again, so its claims then take another order than memory's (by when each lease ended); its
      // restarts are tested on their own (test_sqlite_job_store.cpp, crash_recovery.py).
      what = "restart the shared stores' clients (Redis forgets its scripts)";
      for (auto& s : subjects_) {
        if (!s.reopen) continue;
        s.store.reset();
        s.store = s.reopen();
      }
    }
    history_.push_back(std::to_string(n) + ": " + what +
                       (answers.empty() ? std::string() : " -> " + answers[0]));
    if (history_.size() > 80) history_.pop_front();
    for (std::size_t i = 1; i < answers.size(); ++i) {
      if (answers[i] != answers[0]) {
        std::string records;
        for (const auto& j : jobs_) {
          const std::string k = rebound::job_key(j.tenant, j.id);
          records += "  " + k + ": " + view(before_[k]) + "\n";
        }
        report(subjects_[i].name + " answered '" + answers[i] + "', " + subjects_[0].name + " '" +
               answers[0] + "'\nthe records before the step (" + subjects_[0].name + "):\n" +
               records);
        return false;
      }
    }
    for (const auto& j : jobs_) {
      const std::string k = rebound::job_key(j.tenant, j.id);
      before_[k] = subjects_[0].store->get(k);
      auto position = [&k](JobStore& store) {
        const auto p = store.queue_position(k);
        return p ? " position=" + std::to_string(*p) : std::string(" position=none");
      };
      const std::string expected = view(before_[k]) + position(*subjects_[0].store);
      for (std::size_t i = 1; i < subjects_.size(); ++i) {
        const std::string got = view(subjects_[i].store->get(k)) + position(*subjects_[i].store);
        if (got != expected) {
          report(k + " in " + subjects_[i].name + ": " + got + "\n  in " + subjects_[0].name +
                 ": " + expected);
          return false;
        }
      }
    }
    return true;
  }

 private:
  struct JobRefs {
    std::string id;
    std::string tenant;
  };

  int number(int low, int high) { return std::uniform_int_distribution<int>(low, high)(random_); }

  // The work one claim took shares its lease's end: each is renewed to an end of its own (all
  // stores alike), so that no two become claimable again at the same moment. (When the stores
  // claimed different work, the step fails on that first.)
  void spread(const std::vector<std::string>& answers, const std::string& holder) {
    if (std::any_of(answers.begin(), answers.end(), [&](const auto& a) { return a != answers[0]; }))
      return;
    std::istringstream keys(answers[0].substr(0, answers[0].find('|')));
    for (std::string key; keys >> key;) {
      const Lease own{holder, fresh(now_ + std::chrono::milliseconds(number(10000, 30000)))};
      for (auto& s : subjects_)
        CHECK_MESSAGE(s.store->renew(key, own, now_), s.name << " refused its own claim's renewal");
    }
  }

  std::string next_holder() {
    given_.push_back("s" + std::to_string(number(1, 2)) + "/" + std::to_string(++holders_given_));
    if (given_.size() > 6) given_.pop_front();
    return given_.back();
  }
  std::string recent_holder() {
    return given_[static_cast<std::size_t>(number(0, static_cast<int>(given_.size()) - 1))];
  }

  // `t`, or the first millisecond after it that no step has used yet.
  TimePoint fresh(TimePoint t) {
    while (!used_.insert(t).second)
      t += 1ms;
    return t;
  }

  void report(const std::string& difference) const {
    std::string steps;
    for (const auto& h : history_)
      steps += "  " + h + "\n";
    FAIL_CHECK("the stores disagree: " << difference << "\nthe last steps:\n" << steps);
  }

  std::vector<Subject>& subjects_;
  std::mt19937 random_;
  TimePoint now_;
  std::vector<JobRefs> jobs_;
  std::deque<std::string> given_;  // the holders of the last leases given
  std::size_t holders_given_ = 0;
  std::deque<std::string> history_;
  std::set<TimePoint> used_;
  std::map<std::string, std::optional<JobRecord>> before_;  // the reference's, after each step
};

}  // namespace

TEST_CASE("stores: one random sequence of calls - every store answers and keeps what memory does") {
  const std::size_t steps = env_number("REBOUND_DIFF_STEPS", 600);
  const unsigned first_seed = static_cast<unsigned>(env_number("REBOUND_DIFF_SEED", 1));
  for (unsigned seed = first_seed; seed < first_seed + 3; ++seed) {
    CAPTURE(seed);
    rebound::test::TempDir dir;
    const std::string path = dir.file("jobs.db");
    std::vector<Subject> subjects;
    subjects.push_back({"memory", std::make_unique<rebound::MemoryJobStore>(), nullptr});
    subjects.push_back({"sqlite", std::make_unique<rebound::SqliteJobStore>(path), nullptr});
#ifdef REBOUND_TEST_REDIS
    rebound::test::RedisServer redis;
    const auto options = rebound::parse_redis_uri(redis.uri());
    auto unbatched = options;
    unbatched.batch_writes = false;
    unbatched.key_prefix = "{unbatched}";
    // Its restart: the store's client starts again on a Redis that forgot its scripts.
    subjects.push_back(
        {"redis", std::make_unique<rebound::RedisJobStore>(options), [options, &redis] {
           REQUIRE(redis.ask("SCRIPT FLUSH").rfind("+OK", 0) == 0);
           return std::make_unique<rebound::RedisJobStore>(options);
         }});
    subjects.push_back(
        {"redis unbatched", std::make_unique<rebound::RedisJobStore>(unbatched),
         [unbatched] { return std::make_unique<rebound::RedisJobStore>(unbatched); }});
#endif
#ifdef REBOUND_TEST_POSTGRES
    // Its restart: a new store (its pool, its writer) on the same schema.
    const auto pg = rebound::parse_postgres_uri(
        rebound::test::shared_postgres().uri(rebound::test::PostgresServer::fresh_schema()));
    subjects.push_back({"postgres", std::make_unique<rebound::PostgresJobStore>(pg),
                        [pg] { return std::make_unique<rebound::PostgresJobStore>(pg); }});
#endif
    Run run(subjects, seed);
    for (std::size_t n = 0; n < steps; ++n) {
      if (!run.step(n)) break;
    }
  }
}
