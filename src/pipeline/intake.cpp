// The intake: a submission's way from the caller to the queue (common/job_rules.hpp's rules, the
// model's validation, admission, the store's put with this queue's claim, the work queue), for one
// job (submit_async_to) and for many with one store write (submit_all_to).
#include "intake.hpp"

#include <algorithm>
#include <cassert>
#include <limits>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/job_rules.hpp"
#include "rebound/tenant.hpp"

namespace rebound::detail {

std::optional<ErrorInfo> validate(const Model& model, const nlohmann::json& input) {
  try {
    return model.validate(input);
  } catch (const std::exception& e) {
    return ErrorInfo{"invalid_input", std::string("could not be validated: ") + e.what()};
  } catch (...) {
    return ErrorInfo{"invalid_input", "could not be validated"};
  }
}

// The model a job names, filled in (ModelRef): an empty name is the repository's default model,
// an empty version the version that model's route picks for `tenant` and `id`. A name or a
// version the queue does not serve, or not now, is refused (model_not_found,
// version_unavailable). The chosen version is the answer (held while the caller uses it).
std::shared_ptr<Model> choose_model(Pipeline& core, ModelRef& ref, std::string_view tenant,
                                    std::string_view id, Submitted& refusal) {
  if (core.default_model) {  // a queue built on one Model: the default, chosen once
    if (ref.empty() || ref == core.default_ref) {
      ref = core.default_ref;
      return std::shared_ptr<Model>(std::shared_ptr<Model>(), core.default_model);  // (no count)
    }
  }
  ModelTable::Choice chosen = core.models.choose(ref, tenant, id);
  if (!chosen.model) {
    refusal = refused(chosen.error);
    refusal.reason = std::move(chosen.reason);
    refusal.field = chosen.field;
  }
  return std::move(chosen.model);
}

namespace {

// Taken, and not the same request again: it goes to the store.
bool goes_on(const Submitted& s) {
  return !s.error && !s.duplicate;
}

// A submission on its way in: what `prepare` decided before the store's put.
struct Pending {
  Submitted verdict;             // anything but a new job: answered before the put
  Claim claim;                   // the slot, freed on every way out but the queue
  bool park = false;             // stored unclaimed, for the pump to claim later
  std::string holder;            // the lease it is stored with, unless parked
  std::shared_ptr<Model> model;  // its version, held until the job is queued (WorkItem::model)
};

// What the jobs of one call before this one were given (submit_many): they count as queued for
// the prefetch window, and a parked one parks the jobs behind it that are not more urgent.
struct Admitted {
  std::size_t held = 0;
  int parked_floor = std::numeric_limits<int>::max();
};

// What is refused before admission (and outside its lock): a job that breaks a rule
// (common/job_rules.hpp: the same rules, and sentences, as over HTTP), a model or version not
// served (the job's ModelRef is filled in here), a callback nobody can send, an input the model
// refuses. Taken: none of them.
Submitted check(Pipeline& core, Job& job, bool rules_checked, std::shared_ptr<Model>& held) {
  // A caller that says it checked them (rebound::Server's parser) did, with the same guard.
  assert(!rules_checked || !check_job(job, core.guard));
  if (auto broken = rules_checked ? std::nullopt : check_job(job, core.guard)) {
    Submitted s = refused(errc::invalid_job);
    s.reason = ErrorInfo{"invalid_field", std::move(broken->message)};
    s.field = std::move(broken->field);
    return s;
  }
  Submitted refusal;
  std::shared_ptr<Model> model = choose_model(core, job.model, job.tenant, job.id, refusal);
  if (!model) return refusal;
  if (!job.callback_url.empty() && !core.delivers_callbacks) return refused(errc::no_transport);
  if (auto invalid = validate(*model, job.input)) {
    Submitted s = refused(errc::invalid_input);
    s.reason = std::move(*invalid);
    s.field = "input";
    return s;
  }
  held = std::move(model);  // until the job is queued (an unload of its version waits for it)
  return taken();
}

// Before the put (under admission.enter(), after `check`): the job admitted, its defaults set,
// and whether this queue holds it at once. `waited`: a waiter (async_submit) wants its end.
// `look_up`: a job refused for room is looked for in the store, to answer a resubmission as a
// duplicate.
Pending prepare(Pipeline& core, const WorkQueue<WorkItem>& queue, Job& job, bool waited,
                Admitted& before, StoreAccess::News& news, bool look_up = true) {
  Pending p;
  const std::string id = key_of(job);
  const std::string_view tenant = job.tenant;  // its slots count to its share; its turn
  const std::size_t bytes = work_bytes(job);
  // A tenant past its rate is refused before anything else is looked at: its token is one job's
  // (a batch takes one a job), and a job refused for room (queue_full, tenant_quota) gives it
  // back; one the store then refuses or answers as a duplicate keeps it spent.
  if (!core.rates.take(tenant, core.clock())) {
    p.verdict = refused(errc::tenant_rate);
    return p;
  }
  const boost::system::error_code admitted = core.admission.admit(tenant, bytes);
  if (admitted) core.rates.give_back(tenant);
  // (Not while the store is failing: the look-up would wait for it on the caller's thread, an
  // HTTP thread that /ping needs, for every submission refused.)
  if (look_up && (admitted == errc::queue_full || admitted == errc::tenant_quota) &&
      !core.store.failing()) {
    // A resubmission of a stored job is still answered as a duplicate when the queue is full.
    std::optional<JobRecord> existing;
    try {
      existing = core.store.call(
          "get", id, [&](const JobReadStore& s) { return s.get(id); }, &news);
    } catch (const StoreUnavailable&) {
      p.verdict = refused(errc::store_unavailable);
      return p;
    }
    if (existing) {
      p.verdict = existing->job.same_request_as(job) ? taken(true) : refused(errc::id_conflict);
      return p;
    }
  }
  if (admitted) {
    p.verdict = refused(admitted);
    return p;
  }
  p.claim = Claim::slot(core.admission, tenant, bytes);
  if (job.created_at == std::chrono::system_clock::time_point{}) job.created_at = core.clock();
  // The accepting server claims the job as it stores it: no claim round trip on the way in.
  // With a prefetch, a job beyond it (or behind jobs parked already, first come first served)
  // waits in the store on a parked slot instead, claimed by the pump as the queue drains. A
  // job with a waiter (async_submit) is held at once, so that its end cannot pass unseen.
  // A job more urgent than every job parked, and than some job in memory, is held at once
  // (up to twice the prefetch), so that priorities still come first.
  const std::size_t prefetch = core.pump.prefetch();
  if (prefetch > 0 && !waited) {
    const std::size_t depth = queue.depth() + before.held + core.admission.arriving();
    const int floor = std::min(core.admission.parked() > 0 ? core.admission.parked_floor()
                                                           : std::numeric_limits<int>::max(),
                               before.parked_floor);
    const bool behind_parked = job.priority >= floor;
    const bool window_full =
        depth >= prefetch && !(depth < 2 * prefetch && job.priority < queue.least_urgent_level());
    p.park = behind_parked || window_full;
  }
  if (p.park) {
    before.parked_floor = std::min(before.parked_floor, job.priority);
  } else {
    ++before.held;
    p.holder = core.leases.next_holder();
  }
  return p;
}

// After the put: the job parked in the store or queued here with its claim; `done` (for
// async_submit) registered for the job's end before the job can run, so no end is missed.
Submitted settle(Pipeline& core, WorkQueue<WorkItem>& queue, Job& job, Pending& p,
                 PutOutcome outcome, Completion<JobRecord>* done) {
  switch (outcome) {
    case PutOutcome::created:
      break;
    case PutOutcome::duplicate:
      return taken(true);
    case PutOutcome::full:
      return refused(errc::queue_full);
    case PutOutcome::conflict:
      return refused(errc::id_conflict);
  }
  if (p.park) {
    p.claim.park(job.priority);
    // The queue may have drained since it was read.
    if (queue.depth() <= core.pump.prefetch() / 2) core.pump.wake(core.clock());
    return taken();
  }
  const std::string id = key_of(job);
  // Never closed here (closing follows admission.close(), which waits for `enter()`), but a
  // handler is answered whatever happens.
  if (done && core.async_waiters.add(id, *done, false) != AsyncWaiters::Added::added) {
    (*done)(errc::shutting_down, JobRecord{});
  }
  // Cannot be full (admission bounds it) nor closed (shutdown waits for `enter()`).
  p.claim.take_lease(core.leases, id, p.holder);
  const int priority = job.priority;
  const std::string tenant = job.tenant;  // its turn
  queue.try_push(WorkItem{std::move(job), nullptr, std::move(p.claim),
                          std::chrono::steady_clock::now(), std::move(p.model)},
                 priority, tenant);
  return taken();
}

}  // namespace

// A submission: validated, admitted, stored with this queue's claim, and queued, answered
// through `done` with the store's asynchronous put (JobStore::async_put): the admission entry and
// the job's slot travel with the put until the store answers. `done` runs on the caller's thread
// when the store answers at once, else on the queue's executor. `waiter` (async_submit) is
// registered for the job's end before the job can run.
void submit_async_to(Pipeline& core, WorkQueue<WorkItem>& queue, Job job,
                     FrontDoor::SubmitAnswer done, bool rules_checked,
                     std::shared_ptr<Completion<JobRecord>> waiter) {
  const std::string id = key_of(job);
  const bool has_callback = !job.callback_url.empty();
  auto trace = std::make_shared<std::optional<SubmissionTrace>>();
  auto answer = [&core, id, has_callback, trace](const FrontDoor::SubmitAnswer& to,
                                                 const Submitted& verdict) {
    core.observe_submission(verdict, id, has_callback, trace.get());
    to(verdict);
  };
  std::shared_ptr<Model> version;  // held until the job is queued
  if (Submitted checked = check(core, job, rules_checked, version); checked.error)
    return answer(done, checked);
  *trace = core.begin_trace(job);
  struct Underway {
    Job job;
    Pending pending;
    Admission::Entry entered;
  };
  auto underway = std::make_shared<Underway>();
  underway->entered = core.admission.enter();
  Admitted before;
  StoreAccess::News news;
  // A store whose reads wait looks a job refused for room up on the pump's thread
  // (read_on_pump), not on this one (an HTTP thread, the io thread).
  underway->pending =
      prepare(core, queue, job, waiter != nullptr, before, news, !core.reads_on_pump);
  underway->pending.model = std::move(version);
  core.store.tell(news);
  if (!goes_on(underway->pending.verdict)) {
    const Submitted verdict = underway->pending.verdict;
    underway.reset();  // the entry ends before the answer
    const bool without_room =
        verdict.error == errc::queue_full || verdict.error == errc::tenant_quota;
    if (!without_room || !core.reads_on_pump || core.store.failing()) return answer(done, verdict);
    const std::size_t bytes = work_bytes(job);
    if (!core.take_look_up(bytes)) return answer(done, verdict);
    // A resubmission of a stored job is still answered as a duplicate when the queue is full
    // (as prepare's look-up does; not while the store is failing, when each refusal would wait
    // for it, nor past the look-ups' bounds). Answered on the pump's thread (outside its locks).
    return core.read_on_pump(id, [&core, bytes, answer, done = std::move(done), verdict,
                                  job = std::move(job)](boost::system::error_code ec,
                                                        const std::optional<JobRecord>& existing) {
      core.end_look_up(bytes);
      if (ec) return answer(done, refused(ec));
      if (!existing) return answer(done, verdict);
      answer(done, existing->job.same_request_as(job) ? taken(true) : refused(errc::id_conflict));
    });
  }
  underway->job = std::move(job);
  const Pending& p = underway->pending;
  const bool held = !p.park;
  if (held) core.admission.arriving_began();
  const std::optional<Lease> claim =
      p.park ? std::nullopt : std::optional<Lease>(core.leases.from_now(p.holder));
  const Job& stored = underway->job;
  core.store.put(
      stored, claim,
      [&core, &queue, held, underway = std::move(underway), answer, done = std::move(done),
       waiter = std::move(waiter)](std::exception_ptr error, PutOutcome outcome) mutable {
        const Submitted verdict =
            error ? refused(errc::store_unavailable)
                  : settle(core, queue, underway->job, underway->pending, outcome, waiter.get());
        if (held) core.admission.arriving_ended();
        // The slot (unless queued) ends here, the entry once the handler has run: a queue that
        // shuts down waits for the entries (admission.close), so the pipeline stands until then.
        Admission::Entry entered = std::move(underway->entered);
        underway.reset();
        answer(done, verdict);
      });
}

// Many submissions with one store call (JobStore::put_many): each job as submit_async_to would take
// it, in order. A job whose id came earlier in the call (in a job that passed `check`) is not
// admitted again: it is a duplicate (or `conflict`, another request) when that job was taken,
// and answers as that job did when it was refused for room or by the store.
// Every job takes its slot before the store answers, so a duplicate or a conflict holds one until
// then: the jobs refused for room meanwhile are tried once more (a second store call) when some
// came back.
std::vector<Submitted> submit_all_to(Pipeline& core, WorkQueue<WorkItem>& queue,
                                     std::vector<Job>& jobs, bool rules_checked) {
  constexpr std::size_t none = std::numeric_limits<std::size_t>::max();
  const std::size_t n = jobs.size();
  std::vector<Submitted> statuses(n);
  std::vector<std::string> ids;
  std::vector<bool> callbacks;
  std::vector<std::size_t> first(n, none);  // for a repeated id: its first job
  std::vector<std::optional<SubmissionTrace>> traces(n);
  std::vector<std::shared_ptr<Model>> held(n);  // each job's version, until it is queued
  std::vector<bool> same_as_first(n, false);
  std::unordered_map<std::string_view, std::size_t> seen;
  ids.reserve(n);
  callbacks.reserve(n);
  for (const Job& job : jobs) {
    ids.push_back(key_of(job));
    callbacks.push_back(!job.callback_url.empty());
  }
  std::vector<std::size_t> round;  // the jobs to admit
  for (std::size_t i = 0; i < n; ++i) {
    // Outside the admission lock: the model's validation may take its time. Every job is
    // checked, as its own submission would be; an id counts as taken from its first job that
    // passes.
    statuses[i] = check(core, jobs[i], rules_checked, held[i]);
    if (statuses[i].error) continue;
    traces[i] = core.begin_trace(jobs[i]);
    if (auto [it, added] = seen.emplace(ids[i], i); !added) {
      first[i] = it->second;
      same_as_first[i] = jobs[i].same_request_as(jobs[it->second]);
      continue;
    }
    round.push_back(i);
  }
  StoreAccess::News news;
  {
    auto entered = core.admission.enter();
    for (int pass = 0; pass < 2 && !round.empty(); ++pass) {
      Admitted before;  // what this round holds: what earlier rounds pushed, the queue counts
      std::vector<Pending> pending;
      pending.reserve(round.size());
      std::vector<std::size_t> put_of;        // the round's jobs that go to the store
      std::vector<std::size_t> without_room;  // refused by admission, not stored
      bool failing = false;  // a store read failed: the rest of the round is not tried
      for (std::size_t i : round) {
        if (failing) {
          statuses[i] = refused(errc::store_unavailable);
          continue;
        }
        pending.push_back(prepare(core, queue, jobs[i], false, before, news, pass == 0));
        pending.back().model = held[i];
        const Submitted& verdict = pending.back().verdict;
        statuses[i] = verdict;
        if (verdict.error == errc::queue_full || verdict.error == errc::tenant_quota)
          without_room.push_back(i);
        if (goes_on(verdict)) put_of.push_back(pending.size() - 1);
        failing = verdict.error == errc::store_unavailable;
      }
      if (failing) {
        for (std::size_t k : put_of)
          statuses[round[k]] = refused(errc::store_unavailable);
        break;
      }
      if (put_of.empty()) break;
      // The leases start now, as the store is called, not as the first job was admitted.
      std::vector<PutRequest> puts;
      puts.reserve(put_of.size());
      for (std::size_t k : put_of) {
        const Pending& p = pending[k];
        puts.push_back(
            {&jobs[round[k]],
             p.park ? std::nullopt : std::optional<Lease>(core.leases.from_now(p.holder))});
      }
      std::vector<PutOutcome> outcomes;
      try {
        outcomes = core.store.call(
            "put", ids[round[put_of.front()]], [&](JobLeaseStore& s) { return s.put_many(puts); },
            &news);
        if (outcomes.size() != puts.size())
          throw StoreUnavailable("the job store answered put_many with the wrong count");
      } catch (const StoreUnavailable&) {
        // Some may be stored, as with a put whose answer was lost: their leases run out, and a
        // claim takes them then; a resubmission is answered as a duplicate.
        for (std::size_t k : put_of)
          statuses[round[k]] = refused(errc::store_unavailable);
        break;
      }
      bool freed = false;  // a slot taken in this round for a job the store had already
      for (std::size_t m = 0; m < put_of.size(); ++m) {
        const std::size_t i = round[put_of[m]];
        statuses[i] = settle(core, queue, jobs[i], pending[put_of[m]], outcomes[m], nullptr);
        freed =
            freed || outcomes[m] == PutOutcome::duplicate || outcomes[m] == PutOutcome::conflict;
      }
      if (!freed) break;
      round = std::move(without_room);
    }
  }
  // A repeated id is answered from its first job: taken, it makes the same request a duplicate
  // and another a conflict; refused for room or by the store, it refuses them alike. A first job
  // that conflicted with a stored one says nothing of another request under its id, which may be
  // the stored one: those are told apart by the stored job (one read an id).
  struct Stored {
    bool read = false;  // false: the store failed to answer
    std::optional<JobRecord> record;
  };
  std::unordered_map<std::string_view, Stored> stored;
  for (std::size_t i = 0; i < n; ++i) {
    if (first[i] == none) continue;
    const Submitted earlier = statuses[first[i]];
    if (earlier.error == errc::id_conflict && !same_as_first[i]) {
      auto [at, added] = stored.try_emplace(ids[i]);
      if (added) {
        try {
          at->second.record = core.store.call(
              "get", ids[i], [&](const JobReadStore& s) { return s.get(ids[i]); }, &news);
          at->second.read = true;
        } catch (const StoreUnavailable&) {
          // (Left unread: its copies are store_unavailable, below.)
        }
      }
      // (Gone since the first job's put: as the first job was told, a conflict.)
      const Stored& found = at->second;
      statuses[i] = !found.read ? refused(errc::store_unavailable)
                    : found.record && jobs[i].same_request_as(found.record->job)
                        ? taken(true)
                        : refused(errc::id_conflict);
      continue;
    }
    const bool was_taken = !earlier.error;
    statuses[i] = same_as_first[i] ? (was_taken ? taken(true) : earlier)
                                   : (was_taken ? refused(errc::id_conflict) : earlier);
  }
  core.store.tell(news);
  for (std::size_t i = 0; i < n; ++i)
    core.observe_submission(statuses[i], ids[i], callbacks[i], &traces[i]);
  return statuses;
}

}  // namespace rebound::detail
