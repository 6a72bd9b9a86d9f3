// JobQueue from a C++20 coroutine: the one C++20 translation unit of the tests (the library stays
// C++17). async_submit, async_wait and async_invoke with boost::asio::use_awaitable; a refusal
// arrives as an exception in the coroutine.
#include <doctest/doctest.h>

#include <utility>  // before Boost 1.74's awaitable.hpp, which uses std::exchange

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>

#include "rebound/errc.hpp"
#include "rebound/job_queue.hpp"

#if defined(BOOST_ASIO_HAS_CO_AWAIT)

namespace {

rebound::Job job(std::string id, nlohmann::json input) {
  rebound::Job j;
  j.id = std::move(id);
  j.input = std::move(input);
  return j;
}

boost::asio::awaitable<std::string> walk(rebound::JobQueue& queue) {
  const rebound::JobRecord first =
      co_await queue.async_submit(job("c1", "hello"), boost::asio::use_awaitable);
  const rebound::JobRecord again = co_await queue.async_wait("c1", boost::asio::use_awaitable);
  const rebound::Prediction p = co_await queue.async_invoke(7, boost::asio::use_awaitable);
  std::string refused;
  try {
    co_await queue.async_submit(job("c1", "other"), boost::asio::use_awaitable);
  } catch (const boost::system::system_error& e) {
    refused = e.code() == rebound::errc::id_conflict ? "id_conflict" : e.code().message();
  }
  co_return first.outcome.result.get<std::string>() + " " +
      again.outcome.result.get<std::string>() + " " + p.output().dump() + " " + refused;
}

// A tenant's job, waited for through a braced JobRef temporary inside co_await: GCC 12
// miscompiles a braced *aggregate* temporary there (a Job{...}); a JobRef, which has
// constructors, must not be one of them.
boost::asio::awaitable<std::string> tenant_walk(rebound::JobQueue& queue) {
  rebound::Job acme = job("t1", "acme's");
  acme.tenant = "acme";
  co_await queue.async_submit(acme, boost::asio::use_awaitable);
  const rebound::JobRecord waited =
      co_await queue.async_wait({"t1", "acme"}, boost::asio::use_awaitable);
  std::string unknown;
  try {
    co_await queue.async_wait({"t1", "globex"}, boost::asio::use_awaitable);
  } catch (const boost::system::system_error& e) {
    unknown = e.code() == rebound::errc::not_found ? "not_found" : e.code().message();
  }
  co_return waited.job.tenant + " " + waited.outcome.result.get<std::string>() + " " + unknown;
}

}  // namespace

TEST_CASE("job queue coroutine: a tenant's job waited for through a braced JobRef") {
  rebound::JobQueue queue(std::make_unique<rebound::EchoModel>());
  auto result =
      boost::asio::co_spawn(queue.get_executor(), tenant_walk(queue), boost::asio::use_future);
  CHECK(result.get() == "acme acme's not_found");
}

TEST_CASE("job queue: use_awaitable from a C++20 coroutine") {
  rebound::JobQueue queue(std::make_unique<rebound::EchoModel>());
  auto result = boost::asio::co_spawn(queue.get_executor(), walk(queue), boost::asio::use_future);
  CHECK(result.get() == "hello hello 7 id_conflict");
}

#else
TEST_CASE("job queue coroutine: a tenant's job waited for through a braced JobRef" *
          doctest::skip()) {}
TEST_CASE("job queue: use_awaitable from a C++20 coroutine" * doctest::skip()) {}
#endif
