#!/usr/bin/env python3
"""The SageMaker multi-model container contract (SAGEMAKER_MULTI_MODEL=true): nothing loaded at
start and /ping 200 all the same; POST /models loads a model from its url (inside the root) and
answers when it is ready, 409 for a name loaded already; GET /models (paged), GET /models/{name};
POST /models/{name}/invoke and /invocations with X-Amzn-SageMaker-Target-Model; DELETE
/models/{name} (404 when not loaded); urls outside the root refused.

Usage: sagemaker_multi_model.py <rebound-server> [<iris model dir>]   (about 5 s)
"""
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from testkit import check, children, fail, request, write  # noqa: E402

server_bin = sys.argv[1]
iris_dir = sys.argv[2] if len(sys.argv) > 2 else None


with tempfile.TemporaryDirectory() as tmp:
    root = os.path.join(tmp, "opt-ml-models")
    # What SageMaker unpacks: one directory a model, named by a hash.
    if iris_dir:
        shutil.copytree(iris_dir, os.path.join(root, "8a1f", "model"))
        sample, wanted = [6.3, 3.3, 6.0, 2.5], lambda out: out.get("label") == "virginica"
    else:
        write(os.path.join(root, "8a1f", "model", "config.json"), '{"backend": "echo"}')
        sample, wanted = [6.3, 3.3, 6.0, 2.5], lambda out: out == [6.3, 3.3, 6.0, 2.5]
    write(os.path.join(root, "77c0", "model", "config.json"), '{"backend": "echo"}')
    write(os.path.join(root, "bad", "model", "config.json"), '{"backend": "nothing-like-it"}')
    outside = os.path.join(tmp, "outside")
    write(os.path.join(outside, "config.json"), '{"backend": "echo"}')
    os.symlink(outside, os.path.join(root, "linked"))

    env = dict(os.environ, SAGEMAKER_MULTI_MODEL="true")
    proc = subprocess.Popen(
        [server_bin, "serve", "--host", "127.0.0.1", "--port", "0", "--store", "memory",
         "--model-repository", root, "--log-level", "warn"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    children.append(proc)
    port, seen = None, []
    for line in proc.stdout:
        seen.append(line)
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    check(port, f"the server did not start: {''.join(seen)}")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    check("multi-model" in "".join(seen), f"the start line does not say the mode: {seen}")

    # Nothing loaded, and healthy all the same.
    status, body, _ = request(port, "GET", "/ping")
    check(status == 200, f"/ping with no model: {status}")
    status, body, _ = request(port, "GET", "/models")
    check(status == 200 and body == {"models": []}, f"GET /models at start: {status} {body}")

    # Load: 200 once ready; the same name again: 409.
    iris_url = os.path.join(root, "8a1f", "model")
    status, body, _ = request(port, "POST", "/models", {"model_name": "iris", "url": iris_url})
    check(status == 200, f"POST /models: {status} {body}")
    status, body, _ = request(port, "POST", "/models", {"model_name": "iris", "url": iris_url})
    check(status == 409, f"the same name again: {status} {body}")
    status, body, _ = request(port, "POST", "/models",
                              {"model_name": "echo", "url": os.path.join(root, "77c0", "model")})
    check(status == 200, f"a second model: {status} {body}")

    # What SageMaker would never send, and an attacker might: refused, nothing read.
    for payload, why in (({"model_name": "x", "url": outside}, "a url outside the root"),
                         ({"model_name": "x", "url": os.path.join(root, "linked")},
                          "a link out of the root"),
                         ({"model_name": "x", "url": root + "/../outside"}, "a url with .."),
                         ({"model_name": "../x", "url": iris_url}, "a name with .."),
                         ({"model_name": "x"}, "no url"),
                         ({"url": iris_url}, "no name")):
        status, body, _ = request(port, "POST", "/models", payload)
        wanted_status = 422 if why in ("no url", "no name", "a name with ..") else 403
        check(status == wanted_status, f"{why}: {status} {body}")
    # A place outside the root answers alike whether it exists or not: nothing tells what is there.
    for probe in ("/etc", "/no/such/place", root + "-sibling"):
        status, body, _ = request(port, "POST", "/models", {"model_name": "x", "url": probe})
        check(status == 403, f"probing {probe}: {status} {body}")
    status, body, _ = request(port, "POST", "/models", raw="not json")
    check(status == 400, f"a body that is not JSON: {status} {body}")
    status, body, _ = request(port, "POST", "/models",
                              {"model_name": "missing", "url": os.path.join(root, "nope")})
    check(status == 404, f"a url that is not there: {status} {body}")
    status, body, _ = request(port, "POST", "/models",
                              {"model_name": "broken", "url": os.path.join(root, "bad", "model")})
    check(status == 500 and "nothing-like-it" in body["error"]["message"],
          f"a model that does not load: {status} {body}")

    # Two loads of one name at once: one loads it, the other is told it is loaded.
    results = []
    def load_twice(url):
        results.append(request(port, "POST", "/models", {"model_name": "twice", "url": url})[0])
    loaders = [threading.Thread(target=load_twice, args=(os.path.join(root, d, "model"),))
               for d in ("77c0", "8a1f")]
    for t in loaders:
        t.start()
    for t in loaders:
        t.join()
    check(sorted(results) == [200, 409], f"two loads of one name: {results}")
    status, body, _ = request(port, "DELETE", "/models/twice")
    check(status == 200, f"DELETE /models/twice: {status} {body}")

    # Listing, paged as SageMaker pages it.
    status, body, _ = request(port, "GET", "/models")
    check(status == 200 and sorted(m["modelName"] for m in body["models"]) == ["echo", "iris"],
          f"GET /models: {status} {body}")
    check({"modelName": "iris", "modelUrl": iris_url} in body["models"], f"{body}")
    status, body, _ = request(port, "GET", "/models?max_results=1")
    check(status == 200 and len(body["models"]) == 1 and body.get("nextPageToken"),
          f"the first page: {status} {body}")
    status, second, _ = request(port, "GET",
                                f"/models?max_results=1&next_page_token={body['nextPageToken']}")
    check(status == 200 and len(second["models"]) == 1 and "nextPageToken" not in second and
          second["models"][0]["modelName"] != body["models"][0]["modelName"],
          f"the second page: {status} {second}")
    status, body, _ = request(port, "GET", "/models/iris")
    check(status == 200 and body == {"modelName": "iris", "modelUrl": iris_url},
          f"GET /models/iris: {status} {body}")
    status, body, _ = request(port, "GET", "/models/nope")
    check(status == 404, f"GET an unknown model: {status} {body}")

    # Invocations: by path, and by the header SageMaker's front end sets.
    status, body, resp = request(port, "POST", "/models/iris/invoke", sample)
    check(status == 200 and wanted(body) and resp.getheader("Rebound-Model") == "iris/1",
          f"invoke iris: {status} {body}")
    status, body, _ = request(port, "POST", "/invocations", {"k": 1},
                              {"X-Amzn-SageMaker-Target-Model": "echo"})
    check(status == 200 and body == {"k": 1}, f"/invocations to echo: {status} {body}")
    status, body, _ = request(port, "POST", "/models/nope/invoke", sample)
    check(status == 404, f"invoke an unknown model: {status} {body}")

    # Unload: gone from the listing, its invocations refused; again: 404. Loaded again, it serves.
    status, body, _ = request(port, "DELETE", "/models/echo")
    check(status == 200, f"DELETE /models/echo: {status} {body}")
    status, body, _ = request(port, "GET", "/models")
    check([m["modelName"] for m in body["models"]] == ["iris"], f"after the unload: {body}")
    status, body, _ = request(port, "POST", "/models/echo/invoke", {"k": 2})
    check(status == 404, f"invoke an unloaded model: {status} {body}")
    status, body, _ = request(port, "POST", "/invocations", {"k": 2},
                              {"X-Amzn-SageMaker-Target-Model": "echo"})
    check(status == 404, f"/invocations to an unloaded model: {status} {body}")
    status, body, _ = request(port, "DELETE", "/models/echo")
    check(status == 404, f"DELETE it again: {status} {body}")
    status, body, _ = request(port, "POST", "/models",
                              {"model_name": "echo", "url": os.path.join(root, "77c0", "model")})
    check(status == 200, f"load it again: {status} {body}")
    status, body, _ = request(port, "POST", "/models/echo/invoke", {"k": 3})
    check(status == 200 and body == {"k": 3}, f"invoke it again: {status} {body}")
    status, body, _ = request(port, "GET", "/ping")
    check(status == 200, f"/ping: {status}")
    proc.terminate()
    proc.wait(timeout=30)
    check(proc.returncode == 0, f"exit status {proc.returncode}")

    # A memory budget (--model-memory-mib 5): models of 2 MiB of files each; the third does not
    # fit while the first two are loaded (each is its model's route: SageMaker unloads, on the
    # 507), and fits once one is gone.
    for name in ("m1", "m2", "m3"):
        write(os.path.join(root, name, "model", "config.json"), '{"backend": "echo"}')
        with open(os.path.join(root, name, "model", "weights.bin"), "wb") as f:
            f.write(b"\0" * (2 << 20))
    proc = subprocess.Popen(
        [server_bin, "serve", "--host", "127.0.0.1", "--port", "0", "--store", "memory",
         "--model-repository", root, "--log-level", "warn", "--model-memory-mib", "5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    children.append(proc)
    port = None
    for line in proc.stdout:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            port = int(m.group(1))
            break
    check(port, "the server with a budget did not start")
    threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
    for name in ("m1", "m2"):
        status, body, _ = request(port, "POST", "/models",
                                  {"model_name": name, "url": os.path.join(root, name, "model")})
        check(status == 200, f"load {name} within the budget: {status} {body}")
    status, body, _ = request(port, "POST", "/models",
                              {"model_name": "m3", "url": os.path.join(root, "m3", "model")})
    check(status == 507 and body["error"]["code"] == "insufficient_memory" and
          "budget" in body["error"]["message"], f"a load over the budget: {status} {body}")
    status, body, _ = request(port, "POST", "/models/m1/invoke", {"k": 1})
    check(status == 200, f"the models loaded serve on: {status} {body}")
    status, body, _ = request(port, "DELETE", "/models/m1")
    check(status == 200, f"SageMaker unloads one: {status} {body}")
    status, body, _ = request(port, "POST", "/models",
                              {"model_name": "m3", "url": os.path.join(root, "m3", "model")})
    check(status == 200, f"then it fits: {status} {body}")
    status, body, _ = request(port, "GET", "/v1/models/m3")
    check(status == 200 and body["versions"][0]["memory_bytes"] >= 2 << 20,
          f"what it holds: {status} {body}")
    proc.terminate()
    proc.wait(timeout=30)
print("ok: sagemaker_multi_model")
