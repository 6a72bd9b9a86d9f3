// Links the installed rebound and uses its public API without any other include path.
#include <rebound/backoff.hpp>
#include <rebound/model.hpp>
#include <rebound/version.hpp>
#include <rebound/webhook_signature.hpp>

#include <iostream>

int main() {
  rebound::EchoModel model;
  const auto p = model.predict({{"x", 1}});
  const auto sig =
      rebound::sign_webhook("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                            "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, R"({"test": 2432232314})");
  const bool ok = p.ok() && p.output()["x"] == 1 &&
                  sig == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=" &&
                  rebound::backoff::default_policy()->next_delay({}).has_value();
  std::cout << "rebound " << rebound::version << (ok ? " ok" : " BROKEN") << std::endl;
  return ok ? 0 : 1;
}
