// Admission (detail): the room a job handed back to the store wanted wakes the pump once it is
// free, whichever way it was handed back (a claim that needed a free slot, or a parked job taken
// back), so that the job is claimed at once and not at the pump's next poll (a second by
// default; tests/test_job_queue.cpp shows that wait end to end for the first way).
#include <doctest/doctest.h>

#include <chrono>
#include <memory>

#include "pipeline/admission.hpp"
#include "pipeline/model_readiness.hpp"
#include "pipeline/model_table.hpp"
#include "rebound/model.hpp"

namespace {

using rebound::detail::Admission;

// Counts the pump's wake-ups for room (slot_freed); nothing else is asked of it here.
class Events final : public rebound::detail::PipelineEvents {
 public:
  std::shared_ptr<const void> keep_alive() const override { return alive_; }
  void slot_freed() override { ++freed; }
  void wake_pump(TimePoint) override {}
  void lease_lost(const std::string&, const std::string&) override {}
  void sweep(rebound::detail::WorkQueue<rebound::detail::WorkItem>&) override {}
  void pump_polled() override {}
  void finals_due() override {}
  bool awaited(const std::string&) const override { return false; }
  void job_final(const std::string&, const rebound::JobRecord&) override {}
  void job_answered(const std::string&, rebound::JobRecord) override {}
  int freed = 0;

 private:
  std::shared_ptr<const void> alive_ = std::make_shared<int>(0);
};

struct Fixture {
  rebound::detail::ModelTable models{
      rebound::ModelRepository(std::make_unique<rebound::EchoModel>()), rebound::Logger{},
      [] { return std::chrono::system_clock::now(); }};
  rebound::detail::ModelReadiness readiness{models, rebound::Logger{}, [] {}};
  Events events;
  // 10 slots (none of them ever all taken here), 100 bytes of work.
  Admission admission{10, readiness, events, 10, 100};
};

}  // namespace

TEST_CASE("admission: a parked job taken back without room wakes the pump when its room frees") {
  Fixture f;
  Admission& a = f.admission;
  // A job accepted beyond the prefetch: its slot parked, its bytes freed.
  REQUIRE(a.take_slot({}, 10));
  a.park(10, 0);
  REQUIRE(a.parked() == 1);
  // Work of 60 bytes runs; the parked job of 60 is claimed back: it does not fit beside it.
  REQUIRE(a.take_slot({}, 60));
  const int before = f.events.freed;
  CHECK(a.unpark(60) == Admission::Unpark::no_room);
  CHECK(a.parked() == 1);
  CHECK(f.events.freed == before);
  // The running work ends: its 60 bytes free the room the parked job wanted, and the pump is
  // woken for it (no slot was full and the bytes were never over their limit: nothing else
  // would wake it before its next poll).
  a.release({}, 60);
  CHECK(f.events.freed == before + 1);
  CHECK(a.unpark(60) == Admission::Unpark::taken);
  CHECK(a.parked() == 0);
  // Told once: the next release wakes nothing more.
  a.release({}, 60);
  CHECK(f.events.freed == before + 1);
}

TEST_CASE("admission: room a parked job wanted that a smaller charge frees wakes the pump") {
  Fixture f;
  Admission& a = f.admission;
  REQUIRE(a.take_slot({}, 10));
  a.park(10, 0);
  REQUIRE(a.take_slot({}, 70));  // a job's input in memory
  CHECK(a.unpark(50) == Admission::Unpark::no_room);
  const int before = f.events.freed;
  a.charge(70, 60);  // not yet room for 50
  CHECK(f.events.freed == before);
  a.charge(60, 20);  // its callback's body, smaller than its input: room for 50
  CHECK(f.events.freed == before + 1);
  CHECK(a.unpark(50) == Admission::Unpark::taken);
}
