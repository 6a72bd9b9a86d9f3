// Built-in models and the Model interface's defaults.
#include <doctest/doctest.h>

#include <chrono>

#include "rebound/model.hpp"

using nlohmann::json;

TEST_CASE("the echo model returns its input unchanged") {
  rebound::EchoModel model;
  const json input = {{"x", {1, 2, 3}}, {"s", "text"}};
  auto p = model.predict(input);
  REQUIRE(p.ok());
  CHECK(p.output() == input);
  CHECK(model.name() == "echo");
  CHECK(model.ready());
}

TEST_CASE("predict_batch defaults to one predict per input - in order") {
  rebound::EchoModel model;
  auto out = model.predict_batch({json(1), json("two"), json(nullptr)});
  REQUIRE(out.size() == 3);
  CHECK(out[0].output() == 1);
  CHECK(out[1].output() == "two");
  CHECK(out[2].output().is_null());
}

TEST_CASE("the sleep model waits its time and answers OK - like the seed") {
  auto model = rebound::make_builtin_model("sleep:0.05");
  CHECK(model->name() == "sleep");
  const auto start = std::chrono::steady_clock::now();
  auto p = model->predict(nullptr);
  CHECK(std::chrono::steady_clock::now() - start >= std::chrono::milliseconds(50));
  REQUIRE(p.ok());
  CHECK(p.output() == "OK");
}

TEST_CASE("model specs are parsed strictly") {
  CHECK(rebound::make_builtin_model("echo")->name() == "echo");
  CHECK(dynamic_cast<rebound::SleepModel&>(*rebound::make_builtin_model("sleep:5")).duration() ==
        std::chrono::seconds(5));
  CHECK(dynamic_cast<rebound::SleepModel&>(*rebound::make_builtin_model("sleep:0")).duration() ==
        std::chrono::seconds(0));
  for (const char* bad : {"", "ech", "sleep:", "sleep:x", "sleep:-1", "sleep:1s", "sleep:1e9"}) {
    CAPTURE(bad);
    CHECK_THROWS_AS(rebound::make_builtin_model(bad), rebound::Error);
  }
  try {
    rebound::make_builtin_model("resnet");
  } catch (const rebound::Error& e) {
    CHECK(std::string(e.what()).find("echo or sleep:<seconds>") != std::string::npos);
  }
}

TEST_CASE("a failed prediction carries its code and message") {
  auto p = rebound::Prediction::failure("invalid_input", "input must be an array");
  CHECK_FALSE(p.ok());
  CHECK(p.error().code == "invalid_input");
  CHECK(p.error().message == "input must be an array");
}

TEST_CASE("model names: what a submission may ask for - never a path") {
  for (const char* good : {"iris", "echo", "a", "resnet-50", "bert_base.v2", "0"})
    CHECK(rebound::is_valid_model_name(good));
  CHECK(rebound::is_valid_model_name(std::string(64, 'm')));
  CHECK_FALSE(rebound::is_valid_model_name(std::string(65, 'm')));
  for (const char* bad : {"", ".", "..", "-x", "_x", ".x", "Iris", "a/b", "a%2e", "a b", "ä"})
    CHECK_FALSE(rebound::is_valid_model_name(bad));
  CHECK(rebound::is_valid_model_name(rebound::EchoModel().name()));
  CHECK(rebound::is_valid_model_name(rebound::SleepModel(std::chrono::milliseconds(1)).name()));
}
