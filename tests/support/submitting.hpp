// What JobQueue::submit answered, as one word a test compares and doctest prints: "accepted" (a
// new job), "duplicate", or the refusal's rebound::errc name ("queue_full", "invalid_job").
#pragma once

#include <future>
#include <string>
#include <utility>
#include <vector>

#include <boost/asio/bind_executor.hpp>
#include <boost/asio/system_executor.hpp>
#include <boost/system/error_code.hpp>

#include "rebound/job_queue.hpp"

namespace rebound::test {

inline std::string outcome_of(const Submitted& s) {
  if (s.error) {
    return s.error.category() == error_category() ? to_string(static_cast<errc>(s.error.value()))
                                                  : s.error.message();
  }
  return s.duplicate ? "duplicate" : "accepted";
}

inline std::vector<std::string> outcomes_of(const std::vector<Submitted>& all) {
  std::vector<std::string> out;
  out.reserve(all.size());
  for (const Submitted& s : all)
    out.push_back(outcome_of(s));
  return out;
}

/// Submits `job` (JobQueue::submit with a handler) and waits for the answer; `full`, when given,
/// gets the whole Submitted. The handler runs on the system executor, so that a queue on an io
/// context nobody runs answers too.
inline std::string submitted(JobQueue& queue, Job job, Submitted* full = nullptr) {
  std::promise<Submitted> answer;
  queue.submit(std::move(job),
               boost::asio::bind_executor(boost::asio::system_executor(),
                                          [&answer](boost::system::error_code ec, Submitted s) {
                                            s.error = ec;
                                            answer.set_value(std::move(s));
                                          }));
  Submitted s = answer.get_future().get();
  if (full) *full = s;
  return outcome_of(s);
}

}  // namespace rebound::test
