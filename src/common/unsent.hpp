// Internal: the answer for a callback attempt that could not be sent because something on this
// side threw (a CallbackTransport's send, or building its request). CallbackSender and OriginGate
// both end such an attempt with it, so it reads and counts the same whichever caught the throw.
#pragma once

#include <string>

#include "rebound/delivery/callback_transport.hpp"

namespace rebound::detail {

/// An `io` failure with `message` "the attempt could not be sent: <what>", marked `local`: it is
/// this side's failure, says nothing of the receiver's health, and no breaker counts it. The
/// sender still counts it as an attempt and retries it as a broken connection.
inline CallbackResponse unsent_response(const char* what) {
  CallbackResponse r;
  r.error = TransportError::io;
  r.message = std::string("the attempt could not be sent: ") + what;
  r.local = true;
  return r;
}

}  // namespace rebound::detail
