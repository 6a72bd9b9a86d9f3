// A store's test hook (src/store/*_testing.hpp) set for one scope: cleared however the test ends.
#pragma once

#include <utility>

namespace rebound::test {

template <class Setter>
struct HookSetter;
template <class Hook>
struct HookSetter<void (*)(Hook)> {
  using hook_type = Hook;
};

// `using PruneHook = ScopedHook<rebound::detail::set_sqlite_prune_batch_hook>;`, then
// `const PruneHook hook([&](bool) { ... });` sets it until the scope ends.
template <auto Set>
class ScopedHook {
 public:
  explicit ScopedHook(typename HookSetter<decltype(Set)>::hook_type hook) { Set(std::move(hook)); }
  ~ScopedHook() { Set({}); }
  ScopedHook(const ScopedHook&) = delete;
  ScopedHook& operator=(const ScopedHook&) = delete;
};

}  // namespace rebound::test
