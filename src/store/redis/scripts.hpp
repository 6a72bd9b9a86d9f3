// The Redis store's scripts: which there are, and the text Redis is given for each. The Lua lives
// in src/store/redis/*.lua, embedded at build time (cmake/embed_files.cmake). Internal to
// rebound::redis; not installed.
#pragma once

#include <array>
#include <cctype>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "common/embedded_files.hpp"

namespace rebound::detail::redis {

// The Lua scripts live in src/store/redis/*.lua, embedded at build time (redis_scripts(), by file
// name) and joined by script_text: prelude.lua first, then the script, or for a batch the
// scripts it runs as functions of OPS followed by dispatch.lua.

enum Script : std::size_t {
  kScriptPut,
  kScriptClaim,
  kScriptRenew,
  kScriptMarkRunning,
  kScriptFinish,
  kScriptRecordAttempt,
  kScriptRedeliver,
  kScriptComplete,
  kScriptUpdateCallback,
  kScriptList,
  kScriptQueuePosition,
  kScriptCancel,
  kScriptPage,
  kScriptStats,
  kScriptServers,
  kScriptPaused,
  kScriptIndex,
  kScriptTenants,
  kScriptModels,
  kScriptWaiting,
  // dispatch.lua over kScriptPut only (which is refused at maxmemory), and over the other writes
  // that many callers make at once.
  kScriptBatchPut,
  kScriptBatch,
  kScriptCount,
};

constexpr std::size_t kStandaloneCount = kScriptBatchPut;

// Each Script's file in src/store/redis, without ".lua".
constexpr std::array<const char*, kStandaloneCount> kScriptNames = {
    "put",       "claim",    "renew",           "mark_running", "finish",         "record_attempt",
    "redeliver", "complete", "update_callback", "list",         "queue_position", "cancel",
    "page",      "stats",    "servers",         "paused",       "index",          "tenants",
    "models",    "waiting"};

// The text of src/store/redis/<name>.lua, as embedded at build time.
inline std::string_view lua(std::string_view name) {
  for (const detail::EmbeddedFile& f : detail::redis_scripts()) {
    if (f.name.size() == name.size() + 4 && f.name.substr(0, name.size()) == name &&
        f.name.substr(name.size()) == ".lua") {
      return {f.data, f.size};
    }
  }
  throw std::logic_error("no Redis script " + std::string(name) + ".lua was embedded");
}

// The scripts that answer what is stored and write nothing a crash could not lose (a listing's
// cleanup of entries whose job expired; a server's heartbeat): with `replicas`, not waited for, so
// reads go on while a master has fewer replicas than asked.
inline bool reads_only(std::size_t which) {
  return which == kScriptList || which == kScriptQueuePosition || which == kScriptPage ||
         which == kScriptStats || which == kScriptServers || which == kScriptWaiting;
}

// True when `script` reads no argument by its position alone (ARGV[<digit>]): in a batch, its
// arguments start at ARGV[O + 2]. (Comments included, which say positions as O + n too.)
inline bool reads_in_place(std::string_view script) {
  for (auto at = script.find("ARGV["); at != std::string_view::npos;
       at = script.find("ARGV[", at + 5)) {
    if (at + 5 < script.size() && std::isdigit(static_cast<unsigned char>(script[at + 5]))) {
      return false;
    }
  }
  return true;
}

// The scripts that kScriptBatchPut (`puts`) or kScriptBatch run. Each reads its arguments as
// ARGV[O + n] (prelude.lua): reads_in_place checks it, in script_text.
inline std::vector<Script> batched_scripts(bool puts) {
  if (puts) return {kScriptPut};
  return {kScriptMarkRunning, kScriptFinish, kScriptRecordAttempt, kScriptRenew};
}

// What SCRIPT LOAD is given for `which`. `allow_oom` (Redis 7): every script but a put is marked
// to run at maxmemory, so the work already accepted can finish and free memory.
inline std::string script_text(std::size_t which, bool allow_oom) {
  const bool puts = which == kScriptPut || which == kScriptBatchPut;
  std::string text = allow_oom && !puts ? "#!lua flags=allow-oom\n" : "";
  text += lua("prelude");
  if (which < kStandaloneCount) {
    text += "local O = 0\n";
    return text += lua(kScriptNames[which]);
  }
  text += "local OPS = {}\n";
  for (const Script op : batched_scripts(puts)) {
    if (!reads_in_place(lua(kScriptNames[op]))) {
      throw std::logic_error("a batched Redis script reads ARGV[n] without O");
    }
    text += "OPS['" + std::to_string(op) + "'] = function(ARGV, O)\n";
    text += lua(kScriptNames[op]);
    text += "\nend\n";
  }
  return text += lua("dispatch");
}

}  // namespace rebound::detail::redis
