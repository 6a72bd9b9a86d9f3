// One policy for a failing store, through a real server: submissions 503 store_unavailable, /ping
// 503 while it fails, one log line with the reason, and nothing accepted lost. With the failing
// fake at the JobStore interface, and with the real cases: the SQLite file deleted or replaced,
// and a full disk (a small tmpfs).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>

#include "rebound/store/sqlite_job_store.hpp"
#include "support/failing_store.hpp"
#include "support/held_model.hpp"
#include "support/log_lines.hpp"
#include "support/server_harness.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using json = nlohmann::json;
using rebound::test::check_error;
using rebound::test::eventually;
using rebound::test::HarnessOptions;
using rebound::test::HeldModel;

namespace {

using rebound::test::LogLines;

struct Server : rebound::test::ServerHarness {
  Server(std::unique_ptr<HeldModel> m, const HarnessOptions& o)
      : ServerHarness(std::move(m), o), model(static_cast<HeldModel*>(model_ptr)) {}
  ~Server() { model->open(); }
  int ping() const {
    auto res = client().Get("/ping");
    REQUIRE(res);
    return res->status;
  }
  // Submits a job; an empty `url`: poll only.
  httplib::Result job(const std::string& id, const std::string& url, json input = 1) const {
    json body = {{"id", id}, {"input", std::move(input)}};
    if (!url.empty()) body["callback_url"] = url;
    return submit(body);
  }
  HeldModel* model;
};

}  // namespace

TEST_CASE("a failing store: 503 store_unavailable - /ping 503 - one log line - then it recovers") {
  auto control = std::make_shared<rebound::test::FailingStore::Switch>();
  LogLines log;
  HarnessOptions o;
  o.logger = log.logger();
  o.store_retry_interval = 20ms;
  o.make_store = [control] { return std::make_unique<rebound::test::FailingStore>(control); };
  Server h(std::make_unique<HeldModel>(), o);
  rebound::test::Receiver receiver;
  REQUIRE(h.job("before", receiver.url())->status == 202);
  REQUIRE(h.model->wait_started(1));

  control->fail();
  auto refused = h.job("during", receiver.url());
  check_error(refused, 503, "store_unavailable");
  CHECK(refused->get_header_value("Retry-After") == "5");
  check_error(h.client().Get("/v1/inferences/before"), 503, "store_unavailable");
  check_error(h.client().Post("/v1/inferences/before/redeliver", "", "application/json"), 503,
              "store_unavailable");
  check_error(h.client().Get("/v1/inferences?callback_state=failed"), 503, "store_unavailable");
  check_error(h.client().Delete("/v1/inferences/before"), 503, "store_unavailable");
  // From C++ the same calls answer the same code (no exception).
  CHECK(h.service->cancel("before") == rebound::errc::store_unavailable);
  CHECK(h.service->redeliver("before") == rebound::errc::store_unavailable);
  auto ping = h.client().Get("/ping");
  check_error(ping, 503, "store_unavailable");
  CHECK(json::parse(ping->body)["error"]["message"].get<std::string>().find("told to fail") !=
        std::string::npos);

  // The accepted job finishes while the store fails: its outcome is kept and written later.
  h.model->open();
  CHECK(eventually([&] { return control->calls_failed >= 8; }));  // retried, again and again
  CHECK(h.job("still-during", receiver.url())->status == 503);
  const auto failed_lines = log.of("store_failed");
  REQUIRE(failed_lines.size() == 1);  // one line for the whole spell
  CHECK(failed_lines[0]["level"] == "error");
  CHECK(failed_lines[0]["error"] == "the fake store was told to fail");
  CHECK(failed_lines[0]["during"].is_string());

  control->heal();
  CHECK(h.ping() == 200);
  const json before = h.wait_callback_final("before");
  CHECK(before["status"] == "succeeded");
  CHECK(before["result"] == json{{"echo", 1}});
  CHECK(before["callback"]["state"] == "delivered");
  REQUIRE(h.job("after", receiver.url())->status == 202);
  CHECK(h.wait_callback_final("after")["callback"]["state"] == "delivered");
  CHECK(log.of("store_recovered").size() == 1);
  CHECK(h.poll("during").contains("error"));  // never accepted: 404's error body
  auto metrics = h.client().Get("/metrics")->body;
  CHECK(metrics.find("rebound_submissions_refused_total{reason=\"store_unavailable\"} 2") !=
        std::string::npos);
}

TEST_CASE("sqlite: a deleted or replaced database file is noticed - submissions and /ping 503") {
  rebound::test::TempDir dir;
  const std::string path = dir.file("jobs.db");
  LogLines log;
  HarnessOptions o;
  o.logger = log.logger();
  o.make_store = [path] { return std::make_unique<rebound::SqliteJobStore>(path); };
  Server h(std::make_unique<HeldModel>(), o);
  h.model->open();
  rebound::test::Receiver receiver;
  REQUIRE(h.job("kept", receiver.url())->status == 202);
  h.wait_callback_final("kept");
  CHECK(h.ping() == 200);

  std::filesystem::remove(path);
  auto ping = h.client().Get("/ping");
  check_error(ping, 503, "store_unavailable");
  CHECK(json::parse(ping->body)["error"]["message"].get<std::string>().find("deleted") !=
        std::string::npos);
  check_error(h.job("lost-otherwise", receiver.url()), 503, "store_unavailable");
  CHECK(h.poll("kept")["status"] == "succeeded");  // what the open file holds still answers
  // The refused job's transaction was rolled back, not left open for reads to see.
  check_error(h.client().Get("/v1/inferences/lost-otherwise"), 404, "not_found");

  // A file put back at the path is another file: the store still refuses to write.
  std::ofstream(path) << "";
  ping = h.client().Get("/ping");
  check_error(ping, 503, "store_unavailable");
  CHECK(json::parse(ping->body)["error"]["message"].get<std::string>().find("replaced") !=
        std::string::npos);
  check_error(h.job("lost-otherwise-2", receiver.url()), 503, "store_unavailable");
  CHECK(log.of("store_failed").size() == 1);
}

namespace {
// A harness on a SQLite store at `path` that retries every 20 ms, logging into `log`.
HarnessOptions retrying_sqlite(const std::string& path, LogLines& log) {
  HarnessOptions o;
  o.logger = log.logger();
  o.store_retry_interval = 20ms;
  o.make_store = [path] {
    rebound::SqliteJobStoreOptions so;
    so.retry_interval = 20ms;
    return std::make_unique<rebound::SqliteJobStore>(path, so);
  };
  return o;
}
}  // namespace

TEST_CASE("sqlite: a deleted or replaced write-ahead log is noticed and rebuilt - one log line") {
  rebound::test::TempDir dir;
  const std::string path = dir.file("jobs.db");
  const std::string wal = path + "-wal";
  LogLines log;
  const HarnessOptions o = retrying_sqlite(path, log);
  {
    Server h(std::make_unique<HeldModel>(), o);
    h.model->open();
    rebound::test::Receiver receiver;
    REQUIRE(h.job("before", receiver.url())->status == 202);
    h.wait_callback_final("before");
    REQUIRE(std::filesystem::exists(wal));
    // Exclusive locking keeps the WAL index in memory: there is no -shm file to lose.
    CHECK_FALSE(std::filesystem::exists(path + "-shm"));

    // Deleted while the server is idle: noticed within seconds without a write, the log rebuilt.
    std::filesystem::remove(wal);
    CHECK(eventually([&] { return log.of("store_recovered").size() == 1; }));
    REQUIRE(log.of("store_failed").size() == 1);
    const std::string why = log.of("store_failed")[0]["error"];
    CHECK(why.find("the write-ahead log " + wal + " was deleted") != std::string::npos);
    CHECK(std::filesystem::exists(wal));
    CHECK(h.ping() == 200);
    REQUIRE(h.job("after-delete", receiver.url())->status == 202);
    h.wait_callback_final("after-delete");

    // Replaced by another file: the same, and the stranger is not used as the log.
    std::filesystem::remove(wal);
    std::ofstream(wal) << "not a log";
    CHECK(eventually([&] { return log.of("store_recovered").size() == 2; }));
    REQUIRE(log.of("store_failed").size() == 2);
    CHECK(log.of("store_failed")[1]["error"].get<std::string>().find("was replaced") !=
          std::string::npos);
    REQUIRE(h.job("after-replace", receiver.url())->status == 202);
    h.wait_callback_final("after-replace");
  }
  // Everything committed is in the file, also what the deleted log held when it went.
  rebound::SqliteJobStore reopened(path);
  for (const char* id : {"before", "after-delete", "after-replace"}) {
    CAPTURE(id);
    auto record = reopened.get(id);
    REQUIRE(record.has_value());
    CHECK(record->callback.state == rebound::CallbackState::delivered);
  }
}

namespace {
// A tmpfs of `size` mounted on a fresh folder, for the length of a test; empty when mounting is
// not allowed here.
struct SmallDisk {
  rebound::test::TempDir dir;
  bool mounted = false;
  explicit SmallDisk(const char* size) {
    const std::string options = std::string("size=") + size;
    mounted = ::mount("tmpfs", dir.path.c_str(), "tmpfs", 0, options.c_str()) == 0;
    if (!mounted) MESSAGE("cannot mount a tmpfs here (" << std::strerror(errno) << ")");
  }
  ~SmallDisk() {
    if (mounted) ::umount2(dir.path.c_str(), MNT_DETACH);
  }
  // Remounts it with `flags` (MS_RDONLY: read-only; 0: writable again).
  bool remount(unsigned long flags) const {
    return ::mount("tmpfs", dir.path.c_str(), "tmpfs", MS_REMOUNT | flags, nullptr) == 0;
  }
  // Fills what is left of the disk with one file, to the last byte.
  void fill(const std::string& name) const {
    const int fd = ::open(dir.file(name).c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    REQUIRE(fd >= 0);
    const std::string block(64 * 1024, 'f');
    for (std::size_t size = block.size(); size > 0; size /= 2) {
      while (::write(fd, block.data(), size) == static_cast<ssize_t>(size)) {
      }
    }
    ::close(fd);
  }
};
}  // namespace

TEST_CASE("sqlite on a full disk: 503 until space returns - then the accepted job is recorded") {
  SmallDisk disk("4m");
  REQUIRE_MESSAGE(disk.mounted, "the full-disk test needs root to mount a tmpfs");
  const std::string path = disk.dir.file("jobs.db");
  LogLines log;
  const HarnessOptions o = retrying_sqlite(path, log);
  {
    Server h(std::make_unique<HeldModel>(), o);
    rebound::test::Receiver receiver;
    REQUIRE(h.job("accepted", receiver.url())->status == 202);
    REQUIRE(h.model->wait_started(1));

    disk.fill("filler");
    const std::string big(256 * 1024, 'x');
    auto refused = h.job("refused", receiver.url(), big);
    check_error(refused, 503, "store_unavailable");
    REQUIRE(log.of("store_failed").size() >= 1);  // (logged before the put's 503 was sent)
    CHECK(log.of("store_failed").at(0)["error"].get<std::string>().find("full") !=
          std::string::npos);
    // /ping says so, with the reason, unless a small write has found room in the pages the
    // store's files hold (the write-ahead log the refused put began) and committed meanwhile:
    // then the spell has ended, and said so in the log.
    auto ping = h.client().Get("/ping");
    REQUIRE(ping);
    if (ping->status == 200) {
      CHECK(log.of("store_recovered").size() >= 1);
    } else {
      check_error(ping, 503, "store_unavailable");
      CHECK(json::parse(ping->body)["error"]["message"].get<std::string>().find("full") !=
            std::string::npos);
    }

    // The accepted job runs and is called back while its bookkeeping waits for the disk.
    h.model->open();
    REQUIRE(receiver.wait_for(1));

    std::filesystem::remove(disk.dir.file("filler"));
    CHECK(eventually([&] { return h.ping() == 200; }));
    // One line where each failing spell starts, one where it ends, none for each failed call (the
    // writes were tried every 20 ms while the disk was full). As above, the store may work again
    // for a moment while the disk is full, and the next write that needs a page starts another
    // spell (seen under ThreadSanitizer: two spells): so the lines are counted once /ping said
    // 200 (which logs the last spell's end before it answers; a failure told late, after the
    // store worked again, has its end logged by the pump's next look, within 250 ms).
    CHECK(eventually(
        [&] { return log.of("store_recovered").size() == log.of("store_failed").size(); }));
    const std::size_t spells = log.of("store_failed").size();
    CHECK(spells >= 1);
    // A spell starts with a write that fails after one that committed, and a failed write is
    // retried until it commits (or answered 503, a put), so each write starts at most one: the
    // refused put, the job's running mark (if not committed yet), its finish, its attempt record
    // (and a lease renewal, but the first comes 10 s after the start, the lease's third).
    CHECK(spells <= 4);
    const json accepted = h.wait_callback_final("accepted");
    CHECK(accepted["status"] == "succeeded");
    CHECK(accepted["callback"]["state"] == "delivered");
    REQUIRE(h.job("after", receiver.url(), big)->status == 202);
    h.wait_callback_final("after");
  }
  // And it is on disk, not only in memory.
  rebound::SqliteJobStore reopened(path);
  auto record = reopened.get("accepted");
  REQUIRE(record.has_value());
  CHECK(record->status == rebound::JobStatus::succeeded);
  CHECK(record->callback.state == rebound::CallbackState::delivered);
  CHECK_FALSE(reopened.get("refused").has_value());
}

TEST_CASE("sqlite on a read-only disk refuses to start - and says which file and why") {
  SmallDisk disk("8m");
  REQUIRE_MESSAGE(disk.mounted, "the read-only test needs root to mount a tmpfs");
  const std::string path = disk.dir.file("jobs.db");
  {
    rebound::SqliteJobStore store(path);
    store.put(rebound::Job{"kept", "", 1, std::chrono::system_clock::now()});
  }
  // (A disk cannot be made read-only under a store that has its files open for writing: Linux
  // refuses the remount. A disk that fails its writes is the full-disk case above.)
  REQUIRE(disk.remount(MS_RDONLY));
  try {
    rebound::SqliteJobStore refused(path);
    FAIL("a store on a read-only disk started");
  } catch (const rebound::Error& e) {
    CAPTURE(e.what());
    CHECK(std::string(e.what()).find(path) != std::string::npos);
    CHECK(std::string(e.what()).find("read-only") != std::string::npos);
  }
  REQUIRE(disk.remount(0));
  rebound::SqliteJobStore reopened(path);
  CHECK(reopened.get("kept"));
}

TEST_CASE("a memory store over its byte budget answers 503 queue_full") {
  HarnessOptions o;
  o.make_store = [] {
    rebound::MemoryJobStoreOptions so;
    so.max_bytes = 4u << 20;
    return std::make_unique<rebound::MemoryJobStore>(so);
  };
  Server h(std::make_unique<HeldModel>(), o);
  const std::string mib(1u << 20, 'x');
  int accepted = 0;
  for (int i = 0; i < 8; ++i) {
    auto res = h.job("big-" + std::to_string(i), "", mib);
    REQUIRE(res);
    if (res->status == 202) ++accepted;
  }
  CHECK(accepted == 3);
  check_error(h.job("one-more", "", mib), 503, "queue_full");
}
