// OriginGate: per-origin limits, circuit breakers and pauses in front of any transport. Decisions
// are made under one lock; the inner transport and the handlers are called outside it.
#include "rebound/delivery/origin_gate.hpp"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <exception>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>
#include <unordered_map>
#include <utility>

#include "common/callback_url.hpp"
#include "common/read_clock.hpp"
#include "common/unsent.hpp"
#include "rebound/error.hpp"

namespace rebound {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Failures that say the receiver is unwell; the others say nothing of it.
bool receiver_failure(const CallbackResponse& r) {
  if (r.local) return false;
  switch (r.error) {
    case TransportError::none:
      return r.status >= 500;
    case TransportError::timeout:
    case TransportError::connect_failed:
    case TransportError::io:
    case TransportError::tls:
    case TransportError::resolve_failed:
      return true;
    default:
      return false;
  }
}

bool says_nothing(const CallbackResponse& r) {
  return r.local || r.error == TransportError::cancelled || r.error == TransportError::deferred ||
         r.error == TransportError::refused_address || r.error == TransportError::invalid_url;
}

}  // namespace

struct OriginGate::State : std::enable_shared_from_this<OriginGate::State> {
  struct Pending {
    CallbackRequest request;
    CallbackResponseHandler on_done;
  };

  // One receiver origin as one tenant sends to it: each tenant has its own breaker and limits
  // there, so that no tenant can open another's circuit or take its places.
  struct Origin {
    std::string origin;
    std::string tenant;
    std::deque<Pending> waiting;
    std::size_t in_flight = 0;
    std::size_t failures = 0;
    std::size_t deferred = 0;
    CircuitState state = CircuitState::closed;
    bool probe_out = false;
    bool listed_ready = false;
    Clock::time_point open_until{};
    Clock::time_point horizon{};  // the time handed to the last request deferred
    milliseconds latency{0};      // a moving average of its attempts' durations
    bool has_latency = false;
  };

  // What a decision made under the lock leaves to do outside it.
  struct Send {
    std::string key;
    Pending pending;
    bool probe = false;
  };
  struct Answer {
    CallbackResponseHandler on_done;
    CallbackResponse response;
  };
  struct Change {
    std::string origin;
    CircuitState state;
    std::size_t failures;
  };
  struct Actions {
    std::vector<Send> sends;
    // The answer of the attempt that ended (finished): given after the circuit changes and before
    // the other answers.
    std::optional<Answer> ended;
    std::vector<Answer> answers;
    std::vector<Change> changes;
  };

  // The options' clock, or steady_clock's where a user clock throws: a throw here would end a
  // request half-way (its place taken, its handler never called).
  Clock::time_point now() const noexcept { return detail::read_clock<Clock>(options.clock); }

  std::shared_ptr<CallbackTransport> inner;
  OriginGateOptions options;

  mutable std::mutex mutex;
  std::unordered_map<std::string, Origin> origins;  // by key_of(origin, tenant)
  // Attempts answered by each (origin, tenant), kept after an idle origin is forgotten so that
  // the console can show its success rate: at most max_tallies, the least recently answered of
  // the forgotten origins dropped first (one still delivered to, waiting, open or failing keeps
  // its counts: a hung origin answers least often, and is the one an operator looks at). Two
  // lists make the choice without a look at every tally: the forgotten origins' by their last
  // answer, and those in use by their last answer or their return (tracked again); the first of
  // the forgotten goes, else the first of those in use.
  struct Tally {
    std::string origin, tenant;
    std::size_t delivered = 0, failed = 0;
    std::uint64_t last = 0;               // when it last answered, as tally_sequence counted
    bool in_use = true;                   // its origin tracked in `origins`
    std::list<std::string>::iterator at;  // in used_tallies or forgotten_tallies
  };
  static constexpr std::size_t max_tallies = 1024;
  std::uint64_t tally_sequence = 0;
  std::unordered_map<std::string, Tally> tallies;  // by key_of(origin, tenant)
  std::list<std::string> used_tallies, forgotten_tallies;

  void tally(const std::string& key, const Origin& o, const CallbackResponse& r) {
    auto it = tallies.find(key);
    if (it == tallies.end()) {
      if (tallies.size() >= max_tallies) {
        auto& from = forgotten_tallies.empty() ? used_tallies : forgotten_tallies;
        tallies.erase(from.front());
        from.pop_front();
      }
      Tally fresh;
      fresh.origin = o.origin;
      fresh.tenant = o.tenant;
      it = tallies.emplace(key, std::move(fresh)).first;
      it->second.at = used_tallies.insert(used_tallies.end(), key);
    } else if (it->second.in_use) {
      used_tallies.splice(used_tallies.end(), used_tallies, it->second.at);
    }
    const bool ok = r.error == TransportError::none && r.status >= 200 && r.status < 300;
    ++(ok ? it->second.delivered : it->second.failed);
    it->second.last = ++tally_sequence;
  }

  // An origin tracked again, or forgotten: its tally (if any) moves between the lists. A forgotten
  // one takes its place by its last answer (usually the end: most are forgotten as they answer;
  // one idle for its failures, swept later, goes further in).
  void tally_in_use(const std::string& key, bool in_use) {
    auto it = tallies.find(key);
    if (it == tallies.end() || it->second.in_use == in_use) return;
    it->second.in_use = in_use;
    if (in_use) {
      used_tallies.splice(used_tallies.end(), forgotten_tallies, it->second.at);
      return;
    }
    auto before = forgotten_tallies.end();
    while (before != forgotten_tallies.begin() &&
           tallies.at(*std::prev(before)).last > it->second.last)
      --before;
    forgotten_tallies.splice(before, used_tallies, it->second.at);
  }
  std::set<std::string> paused_origins;  // paused by hand, for every tenant
  // Origins waiting only for the total limit, by tenant (CallbackRequest::tenant): the tenants
  // take turns for each place that frees, and within a tenant its origins do, so that a tenant
  // with many busy origins gets no more of the freed places than one with a single origin. A
  // tenant is in ready_turn exactly when its queue in ready_of is not empty.
  std::map<std::string, std::deque<std::string>> ready_of;
  std::deque<std::string> ready_turn;

  // Each tenant's part of the total (CallbackRequest::tenant). A tenant is busy while it has
  // requests in flight or waiting here; for tenant_share_window after that it still holds a
  // reservation (the most it had in flight while busy, at least one), so that a tenant whose
  // callbacks come one at a time finds its places free when the next one comes. A busy tenant
  // may have in flight at most an equal part of what the others' reservations leave; a tenant
  // alone has it all.
  struct TenantBooks {
    std::size_t in_flight = 0;
    std::size_t waiting = 0;
    std::size_t peak = 0;         // the most in flight since it last became busy
    std::size_t reservation = 0;  // counted in `reserved` while idle within the window
    Clock::time_point idle_since{};
    bool expiry_queued = false;
  };
  std::unordered_map<std::string, TenantBooks> tenant_books;
  std::size_t busy_tenants = 0;
  std::size_t reserved = 0;  // the sum of the idle tenants' reservations
  bool shares_grew = false;  // a tenant went idle or a reservation ended: others may start more
  std::deque<std::pair<Clock::time_point, std::string>> expiries;  // one per idle tenant at most
  std::size_t total_in_flight = 0;
  std::size_t total_waiting = 0;
  bool stopped = false;

  static constexpr std::size_t max_tracked_origins = 10000;
  static constexpr milliseconds unknown_latency{1000};

  static std::string key_of(const std::string& origin, const std::string& tenant) {
    return tenant.empty() ? origin : origin + '\x1f' + tenant;
  }

  // --- under the lock

  bool paused(const Origin& o) const { return paused_origins.count(o.origin) > 0; }

  static bool busy(const TenantBooks& b) { return b.in_flight > 0 || b.waiting > 0; }

  // Moves `tenant`'s counts by the deltas given, and its books between busy and idle.
  void count(const std::string& tenant, long in_flight, long waiting, Clock::time_point now) {
    auto [it, added] = tenant_books.try_emplace(tenant);
    TenantBooks& b = it->second;
    const bool was_busy = !added && busy(b);
    b.in_flight = static_cast<std::size_t>(static_cast<long>(b.in_flight) + in_flight);
    b.waiting = static_cast<std::size_t>(static_cast<long>(b.waiting) + waiting);
    const bool is_busy = busy(b);
    if (is_busy && !was_busy) {
      ++busy_tenants;
      reserved -= b.reservation;
      b.reservation = 0;
      b.peak = 0;
    } else if (!is_busy && was_busy) {
      --busy_tenants;
      shares_grew = true;
      b.idle_since = now;
      if (options.tenant_share_window.count() > 0) {
        // At most half the total: a tenant that had it all reserves no more than half of it.
        b.reservation =
            std::clamp<std::size_t>(b.peak, 1, std::max<std::size_t>(1, options.max_total / 2));
        reserved += b.reservation;
        if (!b.expiry_queued) {
          b.expiry_queued = true;
          expiries.emplace_back(now + options.tenant_share_window, tenant);
        }
      } else {
        tenant_books.erase(it);
        return;
      }
    }
    b.peak = std::max(b.peak, b.in_flight);
  }

  // Idle tenants whose window has passed give their reservation back and are forgotten.
  void expire(Clock::time_point now) {
    while (!expiries.empty() && expiries.front().first <= now) {
      const std::string tenant = std::move(expiries.front().second);
      expiries.pop_front();
      auto it = tenant_books.find(tenant);
      if (it == tenant_books.end()) continue;
      TenantBooks& b = it->second;
      b.expiry_queued = false;
      if (busy(b)) continue;  // busy again: queued again when it next goes idle
      const auto ends = b.idle_since + options.tenant_share_window;
      if (ends > now) {  // idle again since: its window runs from then
        b.expiry_queued = true;
        expiries.emplace_back(ends, tenant);
        continue;
      }
      reserved -= b.reservation;
      tenant_books.erase(it);
      shares_grew = true;
    }
  }

  // The most `tenant` may have in flight now: the total when no other tenant is busy or
  // reserving, else an equal part, among the busy tenants and itself, of what the others'
  // reservations leave (they leave at least half the total, however many tenants reserve).
  std::size_t share_of(const TenantBooks* books) const {
    std::size_t others_busy = busy_tenants, others_reserved = reserved;
    if (books) {
      if (busy(*books)) --others_busy;
      others_reserved -= books->reservation;
    }
    if (others_busy == 0 && others_reserved == 0) return options.max_total;
    const std::size_t left = options.max_total - std::min(options.max_total / 2, others_reserved);
    return std::max<std::size_t>(1, (left + others_busy) / (others_busy + 1));
  }

  bool over_share(const std::string& tenant) const {
    if (tenant_books.size() < 2 && reserved == 0) return false;  // one tenant (or none) counted
    auto it = tenant_books.find(tenant);
    if (it == tenant_books.end()) return false;  // nothing in flight: below any share
    return it->second.in_flight >= share_of(&it->second);
  }

  // An open circuit whose cool-down has passed lets its next request through as the probe.
  void refresh(Origin& o, Clock::time_point now) const {
    if (o.state == CircuitState::open && now >= o.open_until) {
      o.state = CircuitState::half_open;
      o.probe_out = false;
    }
  }

  bool evictable(const Origin& o, Clock::time_point now) const {
    return o.in_flight == 0 && o.waiting.empty() && !o.listed_ready &&
           (o.state != CircuitState::open || now >= o.open_until);
  }

  Origin& find_or_add(const std::string& key, const std::string& origin, const std::string& tenant,
                      Clock::time_point now) {
    if (origins.size() >= max_tracked_origins && origins.find(key) == origins.end()) {
      // Idle origins keep their failure counts (consecutive failures span a delivery's retries);
      // a submitter naming endless failing origins must not grow the map, so past the bound the
      // idle ones go.
      for (auto i = origins.begin(); i != origins.end();)
        if (evictable(i->second, now)) {
          tally_in_use(i->first, false);
          i = origins.erase(i);
        } else {
          ++i;
        }
    }
    Origin& o = origins[key];
    if (o.origin.empty()) {
      tally_in_use(key, true);
      o.origin = origin;
      o.tenant = tenant;
    }
    return o;
  }

  // The last eighth of the total is kept for origins that answer, while they have fewer than a
  // sixteenth of it in flight (8 of 128; at least one): one whose last attempt that said anything
  // of the receiver was no failure, one never measured for one request at a time, and a probe once
  // a circuit's cool-down has passed. A hung origin has its first request out and no answer, then
  // failures (its attempts' timeouts): however many hung origins fill the rest, a receiver that
  // answers still finds places, and one that answered once and then hangs holds few of them.
  std::size_t room_for(const Origin& o) const {
    const std::size_t kept = options.max_total / 8;
    const std::size_t each = std::max<std::size_t>(1, kept / 16);
    const bool answers = o.state == CircuitState::half_open ? true
                         : o.has_latency                    ? o.failures == 0 && o.in_flight < each
                                                            : o.in_flight == 0;
    return answers ? options.max_total : options.max_total - kept;
  }

  bool can_start(const Origin& o) const {
    if (paused(o) || total_in_flight >= room_for(o) || o.in_flight >= options.max_per_origin ||
        over_share(o.tenant)) {
      return false;
    }
    if (o.state == CircuitState::open) return false;
    if (o.state == CircuitState::half_open) return !o.probe_out;
    return true;
  }

  void start(const std::string& key, Origin& o, Pending pending, Clock::time_point now,
             Actions& acts, bool from_waiting = false) {
    ++o.in_flight;
    ++total_in_flight;
    count(o.tenant, 1, from_waiting ? -1 : 0, now);
    const bool probe = o.state == CircuitState::half_open;
    if (probe) o.probe_out = true;
    acts.sends.push_back({key, std::move(pending), probe});
  }

  milliseconds estimate(const Origin& o, const CallbackRequest& request) const {
    const milliseconds e = o.has_latency ? o.latency : unknown_latency;
    return std::clamp(e, milliseconds(1), std::max(milliseconds(1), request.timeout));
  }

  // When a request that cannot go now should come back, from `earliest` on: one after another,
  // as the origin's places would free up at the pace its recent attempts took, so that a backlog
  // comes back spread out, no faster than the limits let it through, never all at once.
  milliseconds pace(Origin& o, const CallbackRequest& request, Clock::time_point now,
                    Clock::time_point earliest) const {
    const auto step = std::max<Clock::duration>(
        std::chrono::microseconds(10),
        std::chrono::duration_cast<Clock::duration>(estimate(o, request)) /
            static_cast<long>(std::max<std::size_t>(1, options.max_per_origin)));
    const auto at = std::max(o.horizon, earliest);
    o.horizon = at + step;
    return std::chrono::ceil<milliseconds>(at - now);
  }

  // The answer to a request the origin cannot take now, and when it should come back: counted
  // as one deferral.
  CallbackResponse deferral(Origin& o, const CallbackRequest& request, Clock::time_point now) {
    milliseconds delay;
    const char* why;
    if (paused(o)) {
      delay = pace(o, request, now, now + options.paused_retry);
      why = "the origin is paused";
    } else if (o.state == CircuitState::open) {
      delay = pace(o, request, now, o.open_until);
      why = "the receiver's circuit is open";
    } else {
      delay = pace(o, request, now, now + estimate(o, request));
      why = o.state == CircuitState::half_open && o.probe_out
                ? "the receiver's circuit probe is out"
            : o.in_flight < options.max_per_origin && total_in_flight < room_for(o) &&
                    over_share(o.tenant)
                ? "the tenant has its share of the callback connections"
                : "the receiver is at its limits";
    }
    ++o.deferred;
    CallbackResponse r;
    r.error = TransportError::deferred;
    r.retry_in = std::max(milliseconds(1), delay);
    r.message = std::string(why) + " (" + o.origin + ")";
    return r;
  }

  // Defers `pending` for the reason the origin cannot take it now.
  void defer_for_now(Origin& o, Pending pending, Clock::time_point now, Actions& acts) {
    CallbackResponse r = deferral(o, pending.request, now);
    acts.answers.push_back({std::move(pending.on_done), std::move(r)});
  }

  void admit(const std::string& key, Origin& o, Pending pending, Clock::time_point now,
             Actions& acts) {
    refresh(o, now);
    if (can_start(o)) {
      if (o.waiting.empty()) return start(key, o, std::move(pending), now, acts);
      // Older requests wait here (a share that grew has not reached them yet): they go first.
      o.waiting.push_back(std::move(pending));
      ++total_waiting;
      count(o.tenant, 0, 1, now);
      return pump_origin(key, o, now, acts);
    }
    if (!paused(o) && o.state == CircuitState::closed &&
        (o.waiting.size() < options.max_waiting_per_origin || clears_quickly(o)) &&
        total_waiting < options.max_waiting) {
      o.waiting.push_back(std::move(pending));
      ++total_waiting;
      count(o.tenant, 0, 1, now);
      list_if_ready(key, o);
      return;
    }
    defer_for_now(o, std::move(pending), now, acts);
  }

  // Whether everything waiting for `o`, and one more, would be sent within quick_backlog at the
  // pace of its recent attempts (an origin not yet measured is not known to be quick).
  bool clears_quickly(const Origin& o) const {
    if (!o.has_latency) return false;
    const auto per_request = std::max(o.latency, milliseconds(1));
    return per_request * static_cast<long>(o.waiting.size() + 1) <=
           options.quick_backlog *
               static_cast<long>(std::max<std::size_t>(1, options.max_per_origin));
  }

  void list_if_ready(const std::string& key, Origin& o) {
    if (!o.waiting.empty() && !o.listed_ready &&
        (total_in_flight >= room_for(o) || over_share(o.tenant)) &&
        o.in_flight < options.max_per_origin && o.state == CircuitState::closed && !paused(o)) {
      o.listed_ready = true;
      auto& queue = ready_of[o.tenant];
      if (queue.empty()) ready_turn.push_back(o.tenant);
      queue.push_back(key);
    }
  }

  Pending pop_waiting(Origin& o) {
    Pending p = std::move(o.waiting.front());
    o.waiting.pop_front();
    --total_waiting;
    return p;
  }

  // Starts what an origin may start now; lists it as ready when only the total limit or its
  // tenant's share holds it.
  void pump_origin(const std::string& key, Origin& o, Clock::time_point now, Actions& acts) {
    while (!o.waiting.empty() && can_start(o))
      start(key, o, pop_waiting(o), now, acts, true);
    list_if_ready(key, o);
  }

  // Total capacity freed: the tenants whose origins waited only for it take turns, one request
  // each, and within a tenant its origins, in the order they were listed, so that neither one busy
  // origin nor one tenant with many origins keeps the others waiting. A tenant at its share is
  // passed over until it is below it, and an origin that may not take the places kept for those
  // that answer (room_for) until the rest has room.
  void pump_ready(Clock::time_point now, Actions& acts) {
    std::size_t passed = 0;  // tenants passed over in a row
    // Origins looked at since the last start that could not start: at most 64 (each goes to the
    // back, and the next pump looks further on), so that a list of hung origins costs each answer
    // a bounded walk, not one of them all.
    std::size_t stuck = 0;
    while (!ready_turn.empty() && total_in_flight < options.max_total &&
           passed < ready_turn.size() && stuck < 64) {
      const std::string tenant = std::move(ready_turn.front());
      ready_turn.pop_front();
      auto queue = ready_of.find(tenant);
      if (queue == ready_of.end()) continue;
      if (over_share(tenant)) {
        ready_turn.push_back(tenant);
        ++passed;
        continue;
      }
      passed = 0;
      const std::string key = std::move(queue->second.front());
      queue->second.pop_front();
      // Its turn is over: its other origins wait behind the other tenants'.
      if (queue->second.empty()) {
        ready_of.erase(queue);
      } else {
        ready_turn.push_back(tenant);
      }
      auto it = origins.find(key);
      if (it == origins.end()) {
        ++stuck;
        continue;
      }
      Origin& o = it->second;
      o.listed_ready = false;
      if (!o.waiting.empty() && can_start(o)) {
        start(key, o, pop_waiting(o), now, acts, true);
        stuck = 0;
      } else {
        ++stuck;
      }
      if (!o.waiting.empty() && can_start(o)) {
        // More places than one (a share grew): it takes its next turn behind the others.
        o.listed_ready = true;
        auto& again = ready_of[o.tenant];
        if (again.empty()) ready_turn.push_back(o.tenant);
        again.push_back(key);
      } else {
        list_if_ready(key, o);
      }
    }
  }

  // A tenant went idle or a reservation ended: the tenants held to their share may start more.
  void pump_if_shares_grew(Clock::time_point now, Actions& acts) {
    if (!shares_grew || stopped) return;
    shares_grew = false;
    pump_ready(now, acts);
  }

  // Whatever waits in memory for `o` goes back to its caller, due when the origin may take it.
  void defer_waiting(Origin& o, Clock::time_point now, Actions& acts) {
    while (!o.waiting.empty()) {
      defer_for_now(o, pop_waiting(o), now, acts);
      count(o.tenant, 0, -1, now);
    }
  }

  void forget_if_idle(const std::string& key, Origin& o) {
    if (o.in_flight == 0 && o.waiting.empty() && o.failures == 0 &&
        o.state == CircuitState::closed && !o.listed_ready && !paused(o)) {
      tally_in_use(key, false);
      origins.erase(key);
    }
  }

  // --- outside the lock

  // One request handed to the inner transport: ended (finished) once, however it ends.
  struct Once {
    Once(std::shared_ptr<State> state, std::string key, bool probe, Clock::time_point sent_at,
         CallbackResponseHandler on_done)
        : state(std::move(state)),
          key(std::move(key)),
          probe(probe),
          sent_at(sent_at),
          on_done(std::move(on_done)) {}
    void end(CallbackResponse r) {
      if (ended.exchange(true)) return;
      // (Through a copy: a handler the run calls may destroy the gate and, with its transport,
      // the handler that holds this Once. `key` is not read after the run starts.)
      const std::shared_ptr<State> keep = state;
      keep->finished(key, probe, sent_at, std::move(r), std::move(on_done));
    }
    std::shared_ptr<State> state;
    std::string key;
    bool probe;
    Clock::time_point sent_at;
    CallbackResponseHandler on_done;
    std::atomic<bool> ended{false};
  };

  // run(acts) on a copy of `state`: a handler the run calls may destroy the gate, and with it the
  // member that `state` was copied from.
  static void run_kept(std::shared_ptr<State> state, Actions& acts) noexcept { state->run(acts); }

  // Runs `acts` on this thread. A run reached from inside another on the same thread (a request
  // ended within its own send: a transport that answers at once, or one that throws) is queued for
  // the outermost run to do next instead of nesting, so that a backlog that ends that way, one
  // request after another, takes no more stack than one. A run that throws (only an allocation
  // that failed can) does not drop the runs queued behind it: each is still done (its answers
  // given, its sends made). The throw goes no further: the caller may be any gate's, on any
  // request's thread, and its own request may have been started (CallbackTransport's contract
  // has a `send` that throws start nothing).
  void run(Actions& acts) noexcept {
    // (A vector: it allocates nothing until a run is queued, which the usual send never does.)
    using Queued = std::vector<std::pair<std::shared_ptr<State>, Actions>>;
    thread_local Queued* outermost = nullptr;
    if (outermost) {
      try {
        outermost->emplace_back(shared_from_this(), std::move(acts));
        return;
      } catch (...) {
        // No room to queue it: done here, nested, rather than lost.
      }
      try {
        run_now(acts);
      } catch (...) {
      }
      return;
    }
    Queued queued;
    outermost = &queued;
    struct Unset {
      ~Unset() { outermost = nullptr; }
    } unset;
    try {
      run_now(acts);
    } catch (...) {
    }
    for (std::size_t i = 0; i < queued.size(); ++i) {  // (in order; runs may queue more)
      try {
        auto next = std::move(queued[i]);
        next.first->run_now(next.second);
      } catch (...) {
      }
    }
  }

  void run_now(Actions& acts) {
    for (const Change& c : acts.changes) {
      try {
        if (options.on_circuit) options.on_circuit(c.origin, c.state, c.failures);
      } catch (...) {
        // A listener's trouble is not the delivery's.
      }
    }
    if (acts.ended) answer(acts.ended->on_done, std::move(acts.ended->response));
    for (Answer& a : acts.answers)
      answer(a.on_done, std::move(a.response));
    if (acts.sends.empty()) return;
    std::shared_ptr<CallbackTransport> to;
    {
      std::lock_guard<std::mutex> lock(mutex);
      to = inner;
    }
    for (Send& s : acts.sends) {
      if (!to) {
        CallbackResponse r;
        r.error = TransportError::cancelled;
        r.message = "the transport shut down";
        try {
          finished(s.key, s.probe, now(), std::move(r), std::move(s.pending.on_done));
        } catch (...) {
          // (An allocation that failed: the sends after it in this run are still made.)
        }
        continue;
      }
      // Kept apart from the handler the transport is given: a transport that throws (it should
      // not) has dropped that handler, and the request is still ended here, once, as a failed
      // attempt. Else its place at the origin stayed taken for good, a probe's circuit stayed
      // half-open, and the requests still to send in this loop were never sent nor answered.
      std::shared_ptr<Once> once;
      try {
        once = std::make_shared<Once>(shared_from_this(), std::move(s.key), s.probe, now(),
                                      std::move(s.pending.on_done));
        to->send(std::move(s.pending.request),
                 [once](CallbackResponse r) { once->end(std::move(r)); });
      } catch (const std::exception& e) {
        unsent_quietly(s, once, e.what());
      } catch (...) {
        unsent_quietly(s, once, "unknown error");
      }
    }
  }

  // unsent, whose own throw (an allocation that failed) does not keep the sends after it in this
  // run from being made.
  void unsent_quietly(Send& s, const std::shared_ptr<Once>& once, const char* what) noexcept {
    try {
      unsent(s, once, what);
    } catch (...) {
    }
  }

  // Ends a request that was not sent because something threw: through its Once, or (the Once
  // could not be made) from `s`, from which nothing was moved then.
  void unsent(Send& s, const std::shared_ptr<Once>& once, const char* what) {
    CallbackResponse r = detail::unsent_response(what);  // (local: no breaker counts it)
    if (once) return once->end(std::move(r));
    finished(s.key, s.probe, Clock::time_point(), std::move(r), std::move(s.pending.on_done));
  }

  static void answer(CallbackResponseHandler& on_done, CallbackResponse response) {
    try {
      if (on_done) on_done(std::move(response));
    } catch (...) {
      // The handler's owner decides what its failures mean.
    }
  }

  // An attempt ended: the origin's books and breaker, the answer, then whatever may start now.
  void finished(const std::string& key, bool probe, Clock::time_point sent_at,
                CallbackResponse response, CallbackResponseHandler on_done) {
    Actions acts;
    {
      std::lock_guard<std::mutex> lock(mutex);
      const auto now = this->now();
      expire(now);
      --total_in_flight;
      auto it = origins.find(key);
      if (it != origins.end()) {
        Origin& o = it->second;
        --o.in_flight;
        count(o.tenant, -1, 0, now);
        if (probe) o.probe_out = false;
        if (!says_nothing(response)) {
          tally(key, o, response);
          const auto took = std::chrono::duration_cast<milliseconds>(now - sent_at);
          o.latency = o.has_latency ? (o.latency * 7 + took) / 8 : took;
          o.has_latency = true;
          if (receiver_failure(response)) {
            ++o.failures;
            if (options.breaker_failures > 0 &&
                (probe ||
                 (o.state == CircuitState::closed && o.failures >= options.breaker_failures))) {
              if (o.state == CircuitState::closed)
                acts.changes.push_back({o.origin, CircuitState::open, o.failures});
              o.state = CircuitState::open;
              o.open_until = now + options.breaker_cooldown;
              o.probe_out = false;
              defer_waiting(o, now, acts);
            }
          } else {
            if (o.state != CircuitState::closed)
              acts.changes.push_back({o.origin, CircuitState::closed, o.failures});
            o.failures = 0;
            o.deferred = 0;
            o.state = CircuitState::closed;
          }
        }
      }
      // Origins listed as waiting for the total limit first, in turn; then this one's own.
      shares_grew = false;
      if (!stopped) pump_ready(now, acts);
      it = origins.find(key);
      if (it != origins.end()) {
        if (!stopped) pump_origin(key, it->second, now, acts);
        forget_if_idle(key, it->second);
      }
    }
    // (Answered by the run: a send, pause or resume its handler makes waits until it returns.)
    acts.ended.emplace(Answer{std::move(on_done), std::move(response)});
    run(acts);
  }
};

OriginGate::OriginGate(std::unique_ptr<CallbackTransport> inner, OriginGateOptions options)
    : state_(std::make_shared<State>()) {
  if (!inner) throw Error("OriginGate: a transport is required");
  if (options.max_per_origin == 0 || options.max_total == 0)
    throw Error("OriginGate: the connection limits must be at least 1");
  if (options.breaker_cooldown.count() < 0 || options.paused_retry.count() <= 0)
    throw Error("OriginGate: the cool-down and the paused retry must be positive");
  if (!options.clock) throw Error("OriginGate: a clock is required");
  state_->inner = std::move(inner);
  state_->options = std::move(options);
}

OriginGate::~OriginGate() {
  State::Actions acts;
  std::shared_ptr<CallbackTransport> inner;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->stopped = true;
    for (auto& [key, o] : state_->origins) {
      while (!o.waiting.empty()) {
        State::Pending p = state_->pop_waiting(o);
        CallbackResponse r;
        r.error = TransportError::cancelled;
        r.message = "the transport shut down";
        acts.answers.push_back({std::move(p.on_done), std::move(r)});
      }
    }
    state_->ready_of.clear();
    state_->ready_turn.clear();
    inner = std::move(state_->inner);
  }
  for (auto& a : acts.answers)
    State::answer(a.on_done, std::move(a.response));
  // What is in flight ends through the inner transport's own shutdown, with the handlers above.
  inner.reset();
}

void OriginGate::send(CallbackRequest request, CallbackResponseHandler on_done) {
  const std::string origin = origin_of(request.url);
  State::Actions acts;
  if (origin.empty()) {
    // Not an http(s) URL: the inner transport says what is wrong with it.
    std::shared_ptr<CallbackTransport> to;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      to = state_->inner;
    }
    if (to) return to->send(std::move(request), std::move(on_done));
  }
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->stopped) {
      CallbackResponse r;
      r.error = TransportError::cancelled;
      r.message = "the transport shut down";
      acts.answers.push_back({std::move(on_done), std::move(r)});
    } else {
      const auto now = state_->now();
      state_->expire(now);
      const std::string key = State::key_of(origin, request.tenant);
      State::Origin& o = state_->find_or_add(key, origin, request.tenant, now);
      state_->admit(key, o, {std::move(request), std::move(on_done)}, now, acts);
      state_->pump_if_shares_grew(now, acts);
    }
  }
  State::run_kept(state_, acts);
}

std::optional<CallbackResponse> OriginGate::defer_now(const std::string& url,
                                                      const std::string& tenant,
                                                      std::chrono::milliseconds timeout) {
  const std::string origin = origin_of(url);
  if (origin.empty()) return std::nullopt;
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (state_->stopped) return std::nullopt;
  const bool paused = state_->paused_origins.count(origin) > 0;
  const std::string key = State::key_of(origin, tenant);
  auto it = state_->origins.find(key);
  if (!paused && it == state_->origins.end()) return std::nullopt;  // healthy and idle
  const auto now = state_->now();
  State::Origin& o =
      it != state_->origins.end() ? it->second : state_->find_or_add(key, origin, tenant, now);
  state_->refresh(o, now);
  const bool held = paused || o.state == CircuitState::open ||
                    (o.state == CircuitState::half_open && o.probe_out);
  if (!held) return std::nullopt;
  CallbackRequest request;
  request.timeout = timeout;  // all the pace needs of it
  return state_->deferral(o, request, now);
}

std::vector<EndpointStatus> OriginGate::endpoints() const {
  std::vector<EndpointStatus> out;
  std::lock_guard<std::mutex> lock(state_->mutex);
  const auto now = state_->now();
  out.reserve(state_->origins.size());
  std::set<std::string> listed;
  for (const auto& [key, o] : state_->origins) {
    CircuitState shown = o.state;
    if (shown == CircuitState::open && now >= o.open_until) shown = CircuitState::half_open;
    out.push_back({o.origin, shown, o.failures, o.in_flight, o.waiting.size(), state_->paused(o),
                   o.deferred, o.tenant});
    if (auto t = state_->tallies.find(key); t != state_->tallies.end()) {
      out.back().delivered = t->second.delivered;
      out.back().failed = t->second.failed;
    }
    listed.insert(o.origin);
  }
  // Origins idle now (forgotten by the gate) that were sent to: closed, with their counts.
  for (const auto& [key, t] : state_->tallies) {
    if (state_->origins.count(key)) continue;
    const bool paused = state_->paused_origins.count(t.origin) > 0;
    out.push_back({t.origin, CircuitState::closed, 0, 0, 0, paused, 0, t.tenant});
    out.back().delivered = t.delivered;
    out.back().failed = t.failed;
    listed.insert(t.origin);
  }
  for (const auto& origin : state_->paused_origins) {
    if (!listed.count(origin)) out.push_back({origin, CircuitState::closed, 0, 0, 0, true, 0, {}});
  }
  std::sort(out.begin(), out.end(), [](const EndpointStatus& a, const EndpointStatus& b) {
    return std::tie(a.origin, a.tenant) < std::tie(b.origin, b.tenant);
  });
  return out;
}

std::string OriginGate::origin_of(const std::string& url) {
  auto parsed = detail::parse_callback_url(url);
  if (!parsed.url) return {};
  return parsed.url->origin();
}

std::string OriginGate::pause(const std::string& origin) {
  const std::string key = origin_of(origin);
  if (key.empty()) throw Error("OriginGate::pause: not an http(s) URL or origin: " + origin);
  State::Actions acts;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->paused_origins.insert(key);
    const auto now = state_->now();
    for (auto& [k, o] : state_->origins)
      if (o.origin == key) state_->defer_waiting(o, now, acts);
    state_->pump_if_shares_grew(now, acts);
  }
  State::run_kept(state_, acts);
  return key;
}

bool OriginGate::resume(const std::string& origin) {
  const std::string key = origin_of(origin);
  if (key.empty()) return false;
  State::Actions acts;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    if (state_->paused_origins.erase(key) == 0) return false;
    const auto now = state_->now();
    state_->expire(now);
    std::vector<std::string> keys;
    for (auto& [k, o] : state_->origins) {
      if (o.origin != key) continue;
      o.deferred = 0;
      state_->pump_origin(k, o, now, acts);
      keys.push_back(k);
    }
    for (const auto& k : keys) {
      auto it = state_->origins.find(k);
      if (it != state_->origins.end()) state_->forget_if_idle(k, it->second);
    }
    state_->pump_if_shares_grew(now, acts);
  }
  State::run_kept(state_, acts);
  return true;
}

std::vector<std::string> OriginGate::paused() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return std::vector<std::string>(state_->paused_origins.begin(), state_->paused_origins.end());
}

}  // namespace rebound
