// A program that links rebound::rebound and names nothing of rebound::http but includes
// job_queue.hpp: its JobQueues still deliver callbacks with libcurl by default, also one built
// during static initialisation, and also when the libraries are shared and linked --as-needed.
#include <iostream>

#include "rebound/job_queue.hpp"

namespace {
// Built before main, in this translation unit's static initialisation.
const bool early =
    rebound::JobQueue(std::make_unique<rebound::EchoModel>()).operations().delivers_callbacks();
}  // namespace

int main() {
  const bool later =
      rebound::JobQueue(std::make_unique<rebound::EchoModel>()).operations().delivers_callbacks();
  std::cout << "default transport: before main " << early << ", in main " << later << std::endl;
  return early && later ? 0 : 1;
}
