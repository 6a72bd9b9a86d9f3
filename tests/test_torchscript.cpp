// The Iris TorchScript model: loading, validation, and serving it through the real server
// (/ping, /invocations, async jobs with callbacks, bad input, dynamic batching, accuracy).
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "rebound/torch/torchscript_model.hpp"
#include "support/receiver.hpp"
#include "support/server_harness.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using nlohmann::json;
using rebound::TorchScriptModel;
using rebound::test::check_error;
using rebound::test::TempDir;

namespace {

const std::string iris_dir = REBOUND_IRIS_DIR;

struct Row {
  json features;
  std::string label;
};

// The 150 rows of iris.csv (header: count, features, class names; rows: 4 numbers, class index).
std::vector<Row> iris_rows() {
  std::ifstream file(iris_dir + "/iris.csv");
  REQUIRE(file);
  std::string line;
  std::getline(file, line);
  std::vector<std::string> names;
  {
    std::stringstream header(line);
    std::string cell;
    for (int i = 0; std::getline(header, cell, ','); ++i) {
      if (i >= 2) names.push_back(cell);
    }
  }
  std::vector<Row> rows;
  while (std::getline(file, line)) {
    std::stringstream ss(line);
    std::string cell;
    json features = json::array();
    for (int i = 0; i < 4 && std::getline(ss, cell, ','); ++i)
      features.push_back(std::stod(cell));
    std::getline(ss, cell, ',');
    rows.push_back({features, names.at(std::stoul(cell))});
  }
  return rows;
}

}  // namespace

TEST_CASE("the Iris model loads with its config") {
  TorchScriptModel model(iris_dir);
  CHECK(model.name() == "iris");
  CHECK(model.config().labels == std::vector<std::string>{"setosa", "versicolor", "virginica"});
  CHECK(model.config().input_shape == std::vector<std::int64_t>{4});
  CHECK(model.batching().max_batch_size == 32);
  CHECK(model.batching().max_queue_delay == 2ms);
  CHECK(model.ready());
}

TEST_CASE("one sample gets scores and a label - several get one prediction each") {
  TorchScriptModel model(iris_dir);
  auto p = model.predict({5.1, 3.5, 1.4, 0.2});
  REQUIRE(p.ok());
  CHECK(p.output()["label"] == "setosa");
  REQUIRE(p.output()["scores"].size() == 3);
  double sum = 0;
  for (const auto& s : p.output()["scores"])
    sum += s.get<double>();
  CHECK(sum == doctest::Approx(1.0).epsilon(1e-4));

  auto several = model.predict({{5.1, 3.5, 1.4, 0.2}, {6.3, 3.3, 6.0, 2.5}});
  REQUIRE(several.ok());
  REQUIRE(several.output()["predictions"].size() == 2);
  CHECK(several.output()["predictions"][0]["label"] == "setosa");
  CHECK(several.output()["predictions"][1]["label"] == "virginica");
}

TEST_CASE("bad inputs are refused with a reason and never reach libtorch") {
  TorchScriptModel model(iris_dir);
  for (const char* text :
       {R"("abc")", "null", "{}", "[]", "[1, 2, 3]", "[1, 2, 3, 4, 5]", R"([1, "x", 3, 4])",
        "[[1, 2, 3, 4], [1, 2]]", "[[[1, 2, 3, 4]]]", "[1, [2], 3, 4]", "[true, 1, 2, 3]"}) {
    CAPTURE(text);
    const json input = json::parse(text);
    auto why = model.validate(input);
    REQUIRE(why.has_value());
    CHECK(why->code == "invalid_input");
    auto p = model.predict(input);
    REQUIRE_FALSE(p.ok());
    CHECK(p.error().code == "invalid_input");
  }
  CHECK(model.validate(json::parse("[1, 2, 3, 4]")) == std::nullopt);
  CHECK(model.validate(json::parse("[[1, 2, 3, 4]]")) == std::nullopt);
  CHECK(model.validate(json::parse("[1, 2, 3, 4]")) == std::nullopt);
  CHECK(model.validate({1, 2, 3}).value().message.find("expected [4] or [n, 4]") !=
        std::string::npos);
}

TEST_CASE("a batch mixing good and bad inputs answers each in its place") {
  TorchScriptModel model(iris_dir);
  auto out = model.predict_batch({json{5.1, 3.5, 1.4, 0.2}, json("bad"), json{6.3, 3.3, 6.0, 2.5},
                                  json{{5.9, 3.0, 4.2, 1.5}, {5.0, 3.4, 1.5, 0.2}}});
  REQUIRE(out.size() == 4);
  CHECK(out[0].output()["label"] == "setosa");
  CHECK_FALSE(out[1].ok());
  CHECK(out[2].output()["label"] == "virginica");
  CHECK(out[3].output()["predictions"][0]["label"] == "versicolor");
  CHECK(out[3].output()["predictions"][1]["label"] == "setosa");
}

TEST_CASE("loading refuses missing or broken artefacts with the path and the reason") {
  auto message = [](const std::string& dir) {
    try {
      TorchScriptModel m(dir);
    } catch (const rebound::Error& e) {
      return std::string(e.what());
    }
    return std::string("loaded");
  };
  CHECK(message("/nonexistent/model").find("does not exist") != std::string::npos);
  TempDir empty;
  CHECK(message(empty.path.string()).find("no model.pt") != std::string::npos);
  TempDir broken;
  broken.write("model.pt", "not a zip file");
  CHECK(message(broken.path.string()).find("cannot load") != std::string::npos);
  TempDir bad_config;
  std::filesystem::copy_file(iris_dir + "/model.pt", bad_config.path / "model.pt");
  bad_config.write("config.json", R"({"labels": "setosa"})");
  CHECK(message(bad_config.path.string()).find("config.json") != std::string::npos);
  bad_config.write("config.json", R"({"batching": {"max_batch_size": 0}})");
  CHECK(message(bad_config.path.string()).find("max_batch_size") != std::string::npos);
  bad_config.write("config.json", "{}");
  CHECK(message(bad_config.path.string()) == "loaded");  // every field is optional
}

TEST_CASE("a model that fails inside libtorch fails that batch - not the process") {
  TempDir dir;
  std::filesystem::copy_file(iris_dir + "/model.pt", dir.path / "model.pt");
  dir.write("config.json", R"({"input_shape": [3]})");  // the Iris net needs 4 features
  TorchScriptModel model(dir.path.string());
  auto p = model.predict({1.0, 2.0, 3.0});
  REQUIRE_FALSE(p.ok());
  CHECK(p.error().code == "model_error");  // libtorch's shape error stopped at the boundary
}

TEST_CASE("warm_up runs the module on zeros of its input shape - and says when it cannot") {
  TorchScriptModel iris(iris_dir);
  CHECK_NOTHROW(iris.warm_up());
  CHECK(iris.predict({5.1, 3.5, 1.4, 0.2}).ok());
  // The module is run indeed: a shape it refuses fails the warm-up, with the shape.
  TempDir dir;
  std::filesystem::copy_file(iris_dir + "/model.pt", dir.path / "model.pt");
  dir.write("config.json", R"({"input_shape": [3]})");
  TorchScriptModel wrong(dir.path.string());
  try {
    wrong.warm_up();
    FAIL("a warm-up batch the module refuses must throw");
  } catch (const rebound::Error& e) {
    CHECK(std::string(e.what()).find("warm-up batch of shape [1, 3]") != std::string::npos);
  }
  // Without an input shape there is nothing to run.
  TempDir any;
  std::filesystem::copy_file(iris_dir + "/model.pt", any.path / "model.pt");
  any.write("config.json", "{}");
  CHECK_NOTHROW(TorchScriptModel(any.path.string()).warm_up());
}

// ---- Through the real server ----

namespace {
struct IrisServer : rebound::test::ServerHarness {
  explicit IrisServer(rebound::test::HarnessOptions o = {})
      : ServerHarness(std::make_unique<TorchScriptModel>(iris_dir), o) {}
};
}  // namespace

TEST_CASE("/ping is an empty 200 once the model is loaded") {
  IrisServer s;
  auto res = s.client().Get("/ping");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->body.empty());
}

TEST_CASE("/invocations classifies the 150 Iris rows with at least 90% accuracy") {
  IrisServer s;
  const auto rows = iris_rows();
  REQUIRE(rows.size() == 150);
  std::atomic<int> correct{0}, answered{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 8; ++c) {
    clients.emplace_back([&, c] {
      auto client = s.client();
      for (std::size_t i = c; i < rows.size(); i += 8) {
        auto res = client.Post("/invocations", rows[i].features.dump(), "application/json");
        if (!res || res->status != 200) continue;
        ++answered;
        correct += json::parse(res->body)["label"] == rows[i].label;
      }
    });
  }
  for (auto& t : clients)
    t.join();
  CHECK(answered == 150);
  MESSAGE("accuracy: " << correct.load() << "/150");
  CHECK(correct >= 135);
}

TEST_CASE("/invocations echoes the SageMaker custom attributes and sends Content-Length") {
  IrisServer s;
  httplib::Headers headers{{"X-Amzn-SageMaker-Custom-Attributes", "trace=abc,tenant=7"}};
  auto res = s.client().Post("/invocations", headers, "[6.3, 3.3, 6.0, 2.5]", "application/json");
  REQUIRE(res);
  CHECK(res->status == 200);
  CHECK(res->get_header_value("X-Amzn-SageMaker-Custom-Attributes") == "trace=abc,tenant=7");
  CHECK(res->get_header_value("Content-Length") == std::to_string(res->body.size()));
  CHECK(json::parse(res->body)["label"] == "virginica");
}

TEST_CASE("/invocations refuses bad input with a 4xx") {
  IrisServer s;
  auto post = [&](const std::string& body) {
    return s.client().Post("/invocations", body, "application/json");
  };
  check_error(post("not json"), 400, "invalid_json");
  check_error(post("[1, 2, 3]"), 422, "invalid_input");
  check_error(post(R"(["a", "b", "c", "d"])"), 422, "invalid_input");
  check_error(post(R"({"instances": 1})"), 422, "invalid_input");
  check_error(post(std::string(6291456 + 1, '1')), 413, "payload_too_large");
  CHECK(post("[5.1, 3.5, 1.4, 0.2]")->status == 200);  // still serving
}

TEST_CASE("async jobs on the Iris model are called back with their label") {
  IrisServer s;
  rebound::test::Receiver receiver;
  const auto rows = iris_rows();
  for (int i : {0, 60, 120}) {
    REQUIRE(s.submit({{"id", "iris-" + std::to_string(i)},
                      {"callback_url", receiver.url()},
                      {"input", rows[i].features}})
                ->status == 202);
  }
  REQUIRE(receiver.wait_for(3));
  std::map<std::string, std::string> labels;
  for (const auto& r : receiver.received()) {
    const json body = json::parse(r.body);
    CHECK(body["status"] == "succeeded");
    labels[body["id"]] = body["result"]["label"];
  }
  CHECK(labels["iris-0"] == rows[0].label);
  CHECK(labels["iris-60"] == rows[60].label);
  CHECK(labels["iris-120"] == rows[120].label);
  check_error(s.submit({{"id", "bad"}, {"input", {1, 2}}}), 422, "invalid_input", "input");
}

TEST_CASE("concurrent requests are grouped into batches") {
  rebound::test::HarnessOptions o;
  o.workers = 1;
  o.max_batch_size = 16;
  o.max_queue_delay = 50ms;
  IrisServer s(o);
  constexpr int requests = 64;
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < requests; ++c) {
    clients.emplace_back([&] {
      auto res = s.client().Post("/invocations", "[5.9, 3.0, 4.2, 1.5]", "application/json");
      if (!res)
        MESSAGE("error " << httplib::to_string(res.error()));
      else if (res->status != 200)
        MESSAGE(res->status << res->body);
      ok += res && res->status == 200 && json::parse(res->body)["label"] == "versicolor";
    });
  }
  for (auto& t : clients)
    t.join();
  CHECK(ok == requests);
  MESSAGE("depth " << s.service->telemetry().queue_depth() << " in flight "
                   << s.service->telemetry().in_flight());
  const auto stats = s.service->telemetry().batch_stats();
  MESSAGE("batches: " << stats.batches << ", largest: " << stats.largest_batch);
  CHECK(stats.items == requests);
  CHECK(stats.largest_batch > 1);
  CHECK(stats.largest_batch <= 16);
  CHECK(stats.batches < requests);
}
