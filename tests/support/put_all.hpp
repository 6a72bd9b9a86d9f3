// Puts a list of jobs with one put_many, each required to be created: the setup of the store
// tests that need many jobs at once.
#pragma once

#include <doctest/doctest.h>

#include <optional>
#include <vector>

#include "rebound/store/job_store.hpp"

namespace rebound::test {

// Puts every one of `jobs` with one put_many (each under `lease`, if any), each created. On the
// test's own thread only (a failed REQUIRE throws).
inline void put_all(JobLeaseStore& store, const std::vector<Job>& jobs,
                    const std::optional<Lease>& lease = std::nullopt) {
  std::vector<PutRequest> puts;
  puts.reserve(jobs.size());
  for (const Job& job : jobs)
    puts.push_back({&job, lease});
  for (const PutOutcome outcome : store.put_many(puts))
    REQUIRE(outcome == PutOutcome::created);
}

}  // namespace rebound::test
