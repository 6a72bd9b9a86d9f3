#!/usr/bin/env python3
"""The Python client (clients/python) against real rebound-servers and a real receiver on
loopback: installed into a virtual environment from the checkout with no network, then submit,
wait, run, cancel, batches, dead letters and redelivery, errors as exceptions, retries through a
proxy that answers 503 and one that drops the connection after the server accepted (never a
second job), a wait that times out without cancelling, the asyncio client, the webhook verifier
on the callbacks the server signed (v1 and v1a, tampering, an old timestamp, a rotated secret, a
key fetched when unknown), and a FastAPI receiver (uvicorn) with the verifying dependency.

    python_client.py REBOUND_SERVER            (creates the venv, installs, runs itself in it)
"""
import asyncio
import atexit
import base64
import http.client
import http.server
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SECRET = "whsec_" + base64.b64encode(b"rebound python client test key!!").decode()
OLD_SECRET = "whsec_" + base64.b64encode(b"the key that was rotated out....").decode()
SIGNING_KEY = "whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A="
PUBLIC_KEY = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo="
API_KEY = "k-python"
children = []


def fail(message):
    print("FAIL:", message, flush=True)
    for p in children:
        if p.poll() is None:
            p.kill()
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


if os.environ.get("REBOUND_CLIENT_TEST_VENV") is None:
    # Installed as a user would: a venv on the system's packages, pip with no index.
    # (From a copy: pip builds in the source folder, which stays as checked out.)
    with tempfile.TemporaryDirectory() as venv:
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        source = os.path.join(venv, "source")
        shutil.copytree(os.path.join(ROOT, "clients", "python"), source,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        subprocess.run([py, "-m", "pip", "install", "--quiet", "--no-build-isolation", "--no-index",
                        source], check=True)
        env = dict(os.environ, REBOUND_CLIENT_TEST_VENV=venv)
        sys.exit(subprocess.run([py, os.path.abspath(__file__), *sys.argv[1:]], env=env,
                                cwd=tempfile.gettempdir()).returncode)

import rebound_client  # noqa: E402  (the installed package, not the checkout)
from rebound_client import (AlreadyFinished, AsyncClient, CallbackNotFailed, Client,  # noqa: E402
                            Conflict, Forbidden, IdConflict, InvalidField, NotFound,
                            PreconditionFailed, QueueFull, Unauthorized, WaitTimeout,
                            WebhookVerificationError, WebhookVerifier)

check(os.environ["REBOUND_CLIENT_TEST_VENV"] in rebound_client.__file__,
      f"rebound_client imported from {rebound_client.__file__}, not the venv")
server_bin = sys.argv[1]
node, node_tools = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else (None, None)


def official_verdict(headers, body):
    """What the official Standard Webhooks library (JavaScript) makes of a callback."""
    script = (
        "const {Webhook} = require(require('path').join(process.argv[1], "
        "'node_modules/standardwebhooks'));"
        "const [secret, headers, body] = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "try { new Webhook(secret).verify(Buffer.from(body, 'base64'), headers);"
        " console.log('ok'); } catch (e) { console.log('refused'); }")
    out = subprocess.run([node, "-e", script, node_tools], input=json.dumps(
        [SECRET, headers, base64.b64encode(body).decode()]), capture_output=True, text=True,
        timeout=30)
    return out.stdout.strip()


class Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []  # (path, headers, raw body)
        super().__init__(("127.0.0.1", 0), ReceiverHandler)

    def bodies(self, job_id):
        with self.lock:
            return [c for c in self.calls if json.loads(c[2]).get("id") == job_id]


class ReceiverHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.calls.append(
                (self.path, {k.lower(): v for k, v in self.headers.items()}, body))
        self.send_response(500 if self.path == "/fail" else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


class Proxy(http.server.ThreadingHTTPServer):
    """Forwards to the server, except: the first `busy` requests are answered 503 queue_full
    with `Retry-After: retry_after`; the first `drops` requests of `drop_method` are forwarded
    (the server acts on them) and then their connection is closed without an answer (with
    `gateway`, answered 504 gateway_timeout instead, as nginx answers an upstream that went
    quiet); with `html`, every request is answered 200 with an HTML page; with `hang`, never
    answered."""
    daemon_threads = True

    def __init__(self, port, busy=0, drops=0, drop_method="POST", retry_after="0", html=False,
                 hang=False, gateway=False, busy_status=503):
        self.busy_status = busy_status  # 502: a gateway that could not reach the server
        self.port, self.busy, self.drops, self.drop_method = port, busy, drops, drop_method
        self.retry_after, self.html, self.hang, self.gateway = retry_after, html, hang, gateway
        self.lock = threading.Lock()
        self.seen = 0
        self.requests = []  # (method, path with query, If-Match)
        super().__init__(("127.0.0.1", 0), ProxyHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class ProxyHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def handle_one(self, method):
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        proxy = self.server
        with proxy.lock:
            proxy.seen += 1
            proxy.requests.append((method, self.path, self.headers.get("If-Match")))
            busy = proxy.busy > 0
            proxy.busy -= busy
            drop = not busy and method == proxy.drop_method and proxy.drops > 0
            proxy.drops -= drop
        if proxy.hang:
            time.sleep(30)
            return
        if proxy.html:
            return self.answer(200, b"<html><body>Welcome to nginx!</body></html>", "text/html")
        if busy and proxy.busy_status == 502:
            return self.answer(
                502, b'{"error":{"code":"bad_gateway","message":"no upstream (the test proxy)"}}')
        if busy:
            return self.answer(
                503, b'{"error":{"code":"queue_full","message":"busy (the test proxy)"}}',
                retry_after=proxy.retry_after)
        conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=30)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
        conn.request(method, self.path, body if body else None, headers)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        if drop and proxy.gateway:
            return self.answer(
                504, b'{"error":{"code":"gateway_timeout","message":"the upstream went quiet"}}')
        if drop:
            self.close_connection = True
            self.connection.shutdown(2)  # the server took it; the client never hears so
            return
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "connection", "transfer-encoding"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def answer(self, status, data, content_type="application/json", retry_after=None):
        """The proxy's own answer, not the server's."""
        self.send_response(status)
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.handle_one("GET")

    def do_POST(self):
        self.handle_one("POST")

    def do_DELETE(self):
        self.handle_one("DELETE")

    def do_PUT(self):
        self.handle_one("PUT")

    def log_message(self, *args):
        pass


@atexit.register
def end_children():
    for p in children:
        if p.poll() is None:
            p.kill()


def start_server(model, *extra):
    proc = subprocess.Popen(
        [server_bin, "serve", "--host", "127.0.0.1", "--port", "0", "--model", model,
         "--store", "memory", "--allow-private-callbacks", "--api-key", "acme:" + API_KEY,
         "--signing-secret", SECRET, "--signing-secret", OLD_SECRET, "--signing-key", SIGNING_KEY,
         "--max-tries", "1", "--log-level", "warn", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    children.append(proc)
    for line in proc.stdout:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, int(m.group(1))
    fail(f"rebound-server ({model}) did not start")


def http_get(port, path, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    conn.request("GET", path, headers={"Authorization": "Bearer " + API_KEY, **(headers or {})})
    body = conn.getresponse().read().decode()
    conn.close()
    return body


def accepted_total(port):
    text = http_get(port, "/metrics")
    return int(re.search(r"^rebound_jobs_accepted_total (\d+)", text, re.M).group(1))


def wait_for(predicate, what, limit_s=20):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    fail(f"timed out waiting for {what}")


receiver = Receiver()
threading.Thread(target=receiver.serve_forever, daemon=True).start()
hook = f"http://127.0.0.1:{receiver.server_address[1]}"
echo, echo_port = start_server("echo")
slow, slow_port = start_server("sleep:2", "--workers", "1")
base = f"http://127.0.0.1:{echo_port}"

with Client(base, api_key=API_KEY, timeout=10) as c:
    # Submit and wait; run; a callback the verifier accepts.
    job = c.submit({"x": 1}, id="p-1", callback_url=hook + "/ok")
    check(job.id == "p-1" and job.status == "queued", f"submit answered {job}")
    done = c.wait("p-1", timeout=10)
    check(done.status == "succeeded" and done.result == {"x": 1}, f"wait answered {done}")
    ran = c.run([5.1, 3.5], timeout=10)
    check(ran.done and ran.result == [5.1, 3.5] and re.fullmatch(r"[0-9a-f]{32}", ran.id),
          f"run answered {ran}")
    check(c.get("p-1").callback["url"] == hook + "/ok", "the poll answer's callback")

    # The models the server serves: its --model as a repository of one model.
    models = c.models()
    check(len(models) == 1 and models[0].name == "echo" and models[0].default_version == "1"
          and models[0].split == [], f"models: {models}")
    version = models[0].versions[0] if models and models[0].versions else None
    check(version is not None and version.version == "1" and version.state == "ready"
          and re.fullmatch(r"sha256:[0-9a-f]{64}", version.digest or "") is not None
          and isinstance(version.queued, int) and version.loaded_at, f"its version: {version}")
    check(c.model("echo").versions[0].digest == version.digest, "one model, by name")
    try:
        c.model("resnet")
        fail("a model the server does not have")
    except NotFound as e:
        check(e.code == "model_not_found", f"an unknown model: {e}")
    try:
        c.model("../v1/inferences")
        fail("a model name that is a path")
    except ValueError as e:
        check("model name" in str(e), f"a model name that is a path: {e}")
    # Every job says the model and version it runs on; a submission may name them.
    check(done.model == {"name": "echo", "version": "1"}, f"the job's model: {done.model}")
    pinned = c.submit(2, id="p-pinned", model="echo", version="1")
    check(c.wait(pinned.id, timeout=10).model == {"name": "echo", "version": "1"},
          "a job pinned to its model's version")
    try:
        c.submit(3, id="p-resnet", model="resnet")
        fail("a job for a model the server does not have")
    except NotFound as e:
        check(e.code == "model_not_found", f"a job for an unknown model: {e}")

    # Errors are exceptions with the server's code.
    try:
        c.submit({"x": 2}, id="p-1")
        fail("a conflicting resubmission was accepted")
    except IdConflict as e:
        check(e.status == 409 and e.code == "id_conflict", f"conflict: {e}")
    check(c.submit({"x": 1}, id="p-1", callback_url=hook + "/ok").id == "p-1",
          "an identical resubmission is not an error")
    for call, kind in ((lambda: c.get("nope"), NotFound),
                       (lambda: c.submit(1, id="bad id!"), InvalidField),
                       (lambda: c.cancel("p-1"), AlreadyFinished),
                       (lambda: c.redeliver("p-1"), CallbackNotFailed)):
        try:
            call()
            fail(f"expected {kind.__name__}")
        except kind:
            pass
    try:
        Client(base, api_key="wrong", max_retries=0).get("p-1")
        fail("a wrong key was accepted")
    except Unauthorized as e:
        check(e.code == "unauthorized", f"unauthorized: {e}")

    # Batches: each job on its own.
    results = c.submit_batch([{"id": "b-1", "input": 1}, {"id": "b-2", "input": 2, "priority": 42},
                              {"input": 3}])
    check([r.status for r in results] == [202, 422, 202], f"batch: {results}")
    check(isinstance(results[1].error, InvalidField) and results[1].error.field == "priority",
          f"batch refusal: {results[1].error}")
    check(c.wait("b-1", timeout=10).result == 1, "a batch job ran")

    # Dead letters, and their redelivery.
    for n in range(3):
        c.submit(n, id=f"dl-{n}", callback_url=hook + "/fail")
    wait_for(lambda: len(list(c.dead_letters(page_size=2))) == 3, "three dead letters")
    letters = [j.id for j in c.dead_letters(page_size=2)]
    check(sorted(letters) == ["dl-0", "dl-1", "dl-2"], f"dead letters: {letters}")
    check(all(j.callback["state"] == "failed" for j in c.dead_letters()), "dead letters' state")
    again = c.redeliver("dl-1")
    check(again.callback["state"] in ("pending", "failed") and again.callback["attempts"] >= 1,
          f"redeliver answered {again.callback}")
    wait_for(lambda: len(receiver.bodies("dl-1")) == 2, "the redelivered callback")
    wait_for(lambda: c.get("dl-1").callback["state"] == "failed", "dl-1 given up again")

    # Ids that are not ids never reach a URL ('#', '?' and '%' would name another job).
    for bad in ("victim#x", "victim?y", "victim%32", "..", ".", "a/b", "", "x" * 129):
        for call in (c.get, c.cancel, c.redeliver, lambda i: c.wait(i, timeout=1)):
            try:
                call(bad)
                fail(f"the id {bad!r} was sent")
            except ValueError:
                pass
    try:
        c.submit(1, id="")
        fail("an empty id was replaced or accepted")
    except InvalidField as e:
        check(e.field == "id", f"an empty id: {e}")

    # Verifying the callbacks the server signed.
    wait_for(lambda: receiver.bodies("p-1"), "p-1's callback")
    path, headers, body = receiver.bodies("p-1")[0]
    by_secret = WebhookVerifier(secrets=[SECRET])
    check(by_secret.verify(headers, body) == {"id": "p-1", "status": "succeeded",
                                               "model": {"name": "echo", "version": "1"},
                                               "result": {"x": 1}}, "v1 verification")
    check(WebhookVerifier(secrets=[OLD_SECRET]).verify(headers, body)["id"] == "p-1",
          "a secret being rotated out still verifies")
    check(WebhookVerifier(keys=c.webhook_keys()).verify(headers, body)["id"] == "p-1",
          "v1a verification with the served public key")
    check(c.webhook_keys() == [PUBLIC_KEY], f"webhook keys: {c.webhook_keys()}")
    check(c.webhook_secret() == SECRET, "the webhook secret")
    fetched = []
    lazy = WebhookVerifier(fetch_keys=lambda: fetched.append(1) or c.webhook_keys())
    check(lazy.verify(headers, body)["id"] == "p-1" and fetched == [1],
          "an unknown key is fetched, once")
    forged_v1a = dict(headers, **{"webhook-signature": "v1a," + base64.b64encode(
        b"\0" * 64).decode()})
    for _ in range(3):
        try:
            lazy.verify(forged_v1a, body)
            fail("a forged v1a signature verified")
        except WebhookVerificationError:
            pass
    check(fetched == [1], f"forged signatures made the verifier fetch keys {len(fetched)} times")
    try:
        by_secret.verify(headers, body, now=time.time() + 600)
        fail("a callback ten minutes old verified")
    except WebhookVerificationError:
        pass
    check(by_secret.verify(headers, body, now=time.time() + 200)["id"] == "p-1",
          "within the tolerance")
    for stamp in ("\u00b2", "1" + "0" * 400, "+" + headers["webhook-timestamp"]):
        try:
            by_secret.verify(dict(headers, **{"webhook-timestamp": stamp}), body)
            fail(f"the timestamp {stamp[:20]!r} verified")
        except WebhookVerificationError:
            pass
    many = dict(headers, **{"webhook-signature": " ".join(["v1,AAAA"] * 500)})
    try:
        by_secret.verify(many, body)
        fail("500 signatures verified")
    except WebhookVerificationError:
        pass
    v1a_only = dict(headers, **{"webhook-signature": " ".join(
        s for s in headers["webhook-signature"].split(" ") if s.startswith("v1a,"))})
    check(WebhookVerifier(keys=[PUBLIC_KEY]).verify(v1a_only, body)["id"] == "p-1", "v1a alone")
    for name, (h, b) in {
            "a changed body": (headers, body.replace(b"p-1", b"p-2")),
            "a changed id": (dict(headers, **{"webhook-id": "msg_other"}), body),
            "no signature": ({k: v for k, v in headers.items() if k != "webhook-signature"}, body),
    }.items():
        try:
            by_secret.verify(h, b)
            fail(f"{name} verified")
        except WebhookVerificationError:
            pass
    try:
        WebhookVerifier(secrets=["whsec_" + base64.b64encode(b"another").decode()]).verify(
            headers, body)
        fail("another secret verified")
    except WebhookVerificationError:
        pass
    if node:
        # The official library and ours agree, on the server's callback and on tampered ones.
        def ours(h, b):
            try:
                by_secret.verify(h, b)
                return "ok"
            except WebhookVerificationError:
                return "refused"
        cases = {
            "the server's callback": (headers, body),
            "a changed body": (headers, body.replace(b"p-1", b"p-2")),
            "a changed id": (dict(headers, **{"webhook-id": "msg_other"}), body),
            "a late timestamp": (dict(headers, **{"webhook-timestamp":
                                                  str(int(time.time()) - 600)}), body),
        }
        for name, (h, b) in cases.items():
            theirs = official_verdict(h, b)
            check(theirs == ours(h, b) and theirs == ("ok" if name.startswith("the") else
                                                       "refused"),
                  f"{name}: the official library says {theirs!r}, ours {ours(h, b)!r}")
        print("the official standardwebhooks library agrees with WebhookVerifier", flush=True)
    # A verifier with secrets only needs no 'cryptography': a v1a entry (the server's, or one a
    # forger adds to a bad v1) is passed over, and a bad callback is refused, not an ImportError.
    blocked = {name: sys.modules.get(name) for name in list(sys.modules)
               if name == "cryptography" or name.startswith("cryptography.")}
    for name in blocked:
        sys.modules[name] = None
    sys.modules["cryptography"] = None  # makes `import cryptography...` raise ImportError
    try:
        secret_only = WebhookVerifier(secrets=[SECRET])
        check(secret_only.verify(headers, body)["id"] == "p-1",
              "a secret-only verifier without 'cryptography' verifies the server's callback")
        forged = dict(headers, **{"webhook-signature": "v1," + base64.b64encode(
            b"\0" * 32).decode() + " v1a," + base64.b64encode(b"\0" * 64).decode()})
        try:
            secret_only.verify(forged, body)
            fail("a forged callback verified")
        except WebhookVerificationError:
            pass
        try:
            WebhookVerifier(fetch_keys=lambda: [])
            fail("fetch_keys without 'cryptography' was accepted")
        except ImportError:
            pass
    finally:
        for name in [n for n in sys.modules if n == "cryptography" or n.startswith("cryptography.")]:
            del sys.modules[name]
        sys.modules.update({n: m for n, m in blocked.items() if m is not None})
    try:
        WebhookVerifier(keys=[PUBLIC_KEY]).verify(
            {k: v for k, v in headers.items() if k != "webhook-signature"} |
            {"webhook-signature": "v1a," + base64.b64encode(b"\0" * 64).decode()}, body)
        fail("a forged v1a signature verified")
    except WebhookVerificationError:
        pass

# A FastAPI receiver with the verifying dependency: the server's callback reaches the route with
# its payload; a forged one is answered 400 before the route runs.
import uvicorn  # noqa: E402
from fastapi import Depends, FastAPI  # noqa: E402
from rebound_client.fastapi import verified_callback  # noqa: E402

app = FastAPI()
received = []


@app.post("/hook")
async def fastapi_hook(payload: dict = Depends(verified_callback(WebhookVerifier(
        secrets=[SECRET])))):
    received.append(payload)
    return {"ok": True}

with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    fastapi_port = s.getsockname()[1]
uv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=fastapi_port, log_level="warning"))
threading.Thread(target=uv.run, daemon=True).start()
wait_for(lambda: uv.started, "the FastAPI receiver")
with Client(base, api_key=API_KEY) as c:
    c.submit({"via": "fastapi"}, id="f-1", callback_url=f"http://127.0.0.1:{fastapi_port}/hook")
    wait_for(lambda: any(p.get("id") == "f-1" for p in received), "the FastAPI route's payload")
    wait_for(lambda: c.get("f-1").callback["state"] == "delivered", "delivered to FastAPI")
    check([p for p in received if p["id"] == "f-1"][0]["result"] == {"via": "fastapi"},
          "the verified payload")
forged_conn = http.client.HTTPConnection("127.0.0.1", fastapi_port, timeout=10)
forged_conn.request("POST", "/hook", body.replace(b"p-1", b"p-9"),
                    {k: v for k, v in headers.items() if k.startswith("webhook-")})
forged_status = forged_conn.getresponse().status
forged_conn.close()
check(forged_status == 400 and not any(p.get("id") == "p-9" for p in received),
      f"a forged callback to FastAPI: {forged_status}")
uv.should_exit = True

# Retries: 503 with Retry-After, then through; and a submission the server took whose answer
# was lost: sent again, answered as the same job, one job only.
busy = Proxy(echo_port, busy=3)
with Client(busy.url, api_key=API_KEY) as c:
    before = accepted_total(echo_port)
    check(c.run("through", id="r-1", timeout=10).result == "through", "run through a busy proxy")
    check(busy.seen >= 4, f"the busy proxy saw {busy.seen} requests")
    check(accepted_total(echo_port) == before + 1, "one job through the busy proxy")
busy.busy, busy.seen = 10, 0
with Client(busy.url, api_key=API_KEY, max_retries=2) as c:
    try:
        c.submit(1, id="r-2")
        fail("a submission through a proxy busy past the retries was accepted")
    except QueueFull as e:
        check(e.retry_after == 0, f"Retry-After: {e.retry_after}")
    check(busy.seen == 3, f"max_retries=2 sent {busy.seen} requests")
slow_busy = Proxy(echo_port, busy=1, retry_after="1")
with Client(slow_busy.url, api_key=API_KEY) as c:
    started = time.monotonic()
    c.submit(1, id="r-3")
    check(time.monotonic() - started >= 1.0, "Retry-After: 1 was not waited for")
with Client(Proxy(echo_port, html=True).url, api_key=API_KEY) as c:
    for call in (lambda: c.get("p-1"), lambda: c.webhook_keys(), lambda: c.webhook_secret(),
                 lambda: list(c.dead_letters()), lambda: c.submit_batch([{"input": 1}])):
        try:
            call()
            fail("an HTML page was taken for an answer")
        except rebound_client.ReboundError as e:
            check(e.code == "invalid_response", f"an HTML answer: {e.code}")
with Client(Proxy(echo_port, hang=True).url, api_key=API_KEY, timeout=30) as c:
    started = time.monotonic()
    try:
        c.wait("p-1", timeout=2)
        fail("a wait on a hung server answered")
    except WaitTimeout as e:
        took = time.monotonic() - started
        check(took < 3.0, f"a 2 s wait on a hung server took {took:.2f} s")
        # No poll was answered: the job's state is not known, and the error does not make one up.
        check(e.id == "p-1" and e.job is None, f"a hung wait's WaitTimeout: {e.id} {e.job}")
dropping = Proxy(echo_port, drops=1)
with Client(dropping.url, api_key=API_KEY) as c:
    before = accepted_total(echo_port)
    job = c.submit("once", callback_url=hook + "/ok")
    check(c.wait(job.id, timeout=10).result == "once", "the dropped submission's job")
    check(accepted_total(echo_port) == before + 1,
          f"a retried submission made {accepted_total(echo_port) - before} jobs")
    wait_for(lambda: len(receiver.bodies(job.id)) >= 1, "its callback")

# A wait that times out: never past its deadline, and the job goes on.
with Client(f"http://127.0.0.1:{slow_port}", api_key=API_KEY) as c:
    c.submit(None, id="s-1")
    started = time.monotonic()
    try:
        c.wait("s-1", timeout=1.5)
        fail("a 2 s job was final within a 1.5 s wait")
    except WaitTimeout as e:
        took = time.monotonic() - started
        check(1.5 <= took < 3.0, f"the wait took {took:.2f} s for a 1.5 s timeout")
        check(e.id == "s-1" and e.job is not None and e.job.id == "s-1" and not e.job.done,
              f"WaitTimeout's job: {e.job}")
    check(c.wait("s-1", timeout=10).status == "succeeded", "the timed-out job went on")
    c.submit(None, id="s-2")
    c.submit(None, id="s-3")
    cancelled = c.cancel("s-3")
    check(cancelled.status == "cancelled" and cancelled.error.code == "cancelled",
          f"cancel answered {cancelled}")
    # A cancellation the server did, whose answer was lost: the retry's already_finished is
    # that cancellation, not an error.
    c.submit(None, id="s-4")
with Client(Proxy(slow_port, drops=1, drop_method="DELETE").url, api_key=API_KEY) as c:
    cancelled = c.cancel("s-4")
    check(cancelled.status == "cancelled", f"a cancel whose answer was lost: {cancelled}")
    # The same behind a gateway that answered 504 after the server took the DELETE.
    c.submit(None, id="s-5")
with Client(Proxy(slow_port, drops=1, drop_method="DELETE", gateway=True).url,
            api_key=API_KEY) as c:
    try:
        cancelled = c.cancel("s-5")
        check(cancelled.status == "cancelled", f"a cancel answered 504 by a gateway: {cancelled}")
    except rebound_client.ReboundError as e:
        fail(f"a cancel the server did, answered 504 by a gateway, raised {e.code}")
# A 502 from a gateway that never reached the server, on a job that ended by itself: the retry's
# already_finished is the job's own end, raised, not a cancellation.
with Client(Proxy(echo_port, busy=1, busy_status=502).url, api_key=API_KEY) as c:
    try:
        c.cancel("p-1")
        fail("a cancel of a finished job, after a 502, answered as done")
    except rebound_client.AlreadyFinished:
        pass

# A server with as many waiters as it takes: wait() polls without waiting instead of failing.
full, full_port = start_server("sleep:2", "--workers", "1", "--max-waiters", "1")
with Client(f"http://127.0.0.1:{full_port}", api_key=API_KEY, max_retries=1) as c:
    c.submit(None, id="w-1")
    c.submit(None, id="w-2")

    def hold():  # the one waiter's place, taken until w-2 ends (about 4 s)
        while '"status":"succeeded"' not in http_get(full_port, "/v1/inferences/w-2",
                                                     {"Prefer": "wait=20"}):
            time.sleep(0.05)  # (the place was the probe's below: again)
    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    wait_for(lambda: "too_many_waiters" in http_get(full_port, "/v1/inferences/w-1",
                                                    {"Prefer": "wait=1"}),
             "the waiter's place taken")
    try:
        check(c.wait("w-1", timeout=10).status == "succeeded", "a wait on a full server")
    except rebound_client.ReboundError as e:
        fail(f"a wait on a server full of waiters raised {e.code}")
    holder.join(timeout=30)
full.kill()


# Changing the models (an operator key): a version loaded, canaried, promoted, the old one
# unloaded with its queued jobs rerouted; the refusals as typed errors.
OPS_KEY = "ops-key-0123456789"
repository = tempfile.mkdtemp(prefix="rebound-client-models-")


def add_version(v):
    os.makedirs(os.path.join(repository, "echo", v))
    with open(os.path.join(repository, "echo", v, "config.json"), "w") as f:
        f.write('{"backend": "echo"}')


add_version("1")  # (version 2 is shipped once the server runs)
proc = subprocess.Popen(
    [server_bin, "serve", "--host", "127.0.0.1", "--port", "0", "--model-repository", repository,
     "--store", "memory", "--api-key", "acme:" + API_KEY, "--operator-key", "ops:" + OPS_KEY,
     "--log-level", "warn"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
children.append(proc)
models_port = None
for line in proc.stdout:
    m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
    if m:
        threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
        models_port = int(m.group(1))
        break
check(models_port is not None, "the server of a model repository started")
models_base = f"http://127.0.0.1:{models_port}"


def version_state(c, version):
    return next((v.state for v in c.model("echo").versions if v.version == version), None)


with Client(models_base, api_key=OPS_KEY, timeout=10) as ops, \
        Client(models_base, api_key=API_KEY, timeout=10) as tenant:
    check(ops.model("echo").default_version == "1", "version 1 serves at the start")
    add_version("2")
    loaded = ops.load_version("echo", 2)
    check(loaded.name == "echo" and version_state(ops, "2") in ("loading", "ready"),
          f"load_version answered {loaded}")
    wait_for(lambda: version_state(ops, "2") == "ready", "version 2 ready")
    check(ops.load_version("echo", "2").name == "echo", "a load of a ready version again")
    add_version("3")
    ops.load_version("echo", 3)
    wait_for(lambda: version_state(ops, "3") == "ready", "version 3 ready")
    before = ops.model("echo").generation
    # Two canaries, in the order given (the server deals the percents out in it).
    two = ops.set_route("echo", 1, split={"3": 5, "2": 10}, if_generation=before)
    check(two.split == [{"version": "3", "percent": 5}, {"version": "2", "percent": 10}]
          and two.generation == before + 1, f"set_route answered {two}")
    canary = ops.set_route("echo", 1, split=[{"version": "2", "percent": 10}],
                           if_generation=two.generation)
    check(canary.default_version == "1" and canary.split == [{"version": "2", "percent": 10}]
          and canary.generation == before + 2, f"set_route answered {canary}")
    try:
        ops.set_route("echo", "2", if_generation=before)
        fail("a route set on a stale generation")
    except PreconditionFailed as e:
        check(e.status == 412 and e.code == "route_changed", f"a stale generation: {e}")
    # Promoted through a proxy that drops the answer: the resend is refused 412, and the client
    # finds its own change in the model (this route, one generation on) and answers it.
    lost_route = Proxy(models_port, drops=1, drop_method="PUT")
    with Client(lost_route.url, api_key=OPS_KEY, timeout=10) as via_lost:
        promoted = via_lost.set_route("echo", "2", if_generation=canary.generation)
    check(promoted.default_version == "2" and promoted.split == []
          and promoted.generation == canary.generation + 1, f"promoted: {promoted}")
    puts = [r for r in lost_route.requests if r[0] == "PUT"]
    check(len(puts) == 2 and all(r[2] == f'"{canary.generation}"' for r in puts),
          f"the route was sent twice with If-Match: {puts}")
    check(tenant.run({"v": 2}, timeout=10).model == {"name": "echo", "version": "2"},
          "a new job runs on the promoted version")
    try:
        ops.unload_version("echo", "2")
        fail("an unload of the routed version")
    except Conflict as e:
        check(e.code == "version_in_route", f"the routed version: {e}")
    recorder = Proxy(models_port)
    with Client(recorder.url, api_key=OPS_KEY, timeout=10) as via_recorder:
        unloaded = via_recorder.unload_version("echo", 1, queued="reroute")
    check(("DELETE", "/v1/models/echo/versions/1?queued=reroute", None) in recorder.requests,
          f"the unload's request: {recorder.requests}")
    check(next(v.state for v in unloaded.versions if v.version == "1") in ("draining", "unloaded"),
          f"unload_version answered {unloaded}")
    wait_for(lambda: version_state(ops, "1") == "unloaded", "version 1 unloaded")
    for what, call in (("load", lambda: tenant.load_version("echo", 1)),
                       ("unload", lambda: tenant.unload_version("echo", 3)),
                       ("route", lambda: tenant.set_route("echo", 2))):
        try:
            call()
            fail(f"a tenant's key may {what}")
        except Forbidden as e:
            check(e.code == "forbidden", f"a tenant's {what}: {e}")
    for bad in (lambda: ops.load_version("echo", "02"), lambda: ops.load_version("../x", 1),
                lambda: ops.unload_version("echo", 1, queued="later"),
                lambda: ops.set_route("echo", 2, if_generation=0),
                lambda: ops.set_route("echo", 2, if_generation=True),
                lambda: ops.set_route("echo", 2, if_generation=2 ** 64),
                lambda: ops.load_version("echo", -1), lambda: ops.load_version("echo", 2.0),
                lambda: ops.load_version("echo", 10 ** 18),
                lambda: ops.set_route("echo", 2, split={"02": 10}),
                lambda: ops.set_route("echo", 2, split={"1": 0}),
                lambda: ops.set_route("echo", 2, split="1")):
        try:
            bad()
            fail("a bad argument was sent")
        except ValueError:
            pass
    try:
        ops.load_version("echo", 4)
        fail("a version not in the repository")
    except NotFound as e:
        check(e.code == "model_not_found", f"a version not in the repository: {e}")


async def async_models():
    async with AsyncClient(models_base, api_key=OPS_KEY, timeout=10) as ops:
        with Client(models_base, api_key=OPS_KEY, timeout=10) as reader:
            await ops.load_version("echo", "1")
            wait_for(lambda: version_state(reader, "1") == "ready", "version 1 loaded again")
        routed = await ops.set_route("echo", "1")
        check(routed.default_version == "1", f"an async set_route: {routed}")
        after = await ops.unload_version("echo", "2")
        check(after.name == "echo", "an async unload_version")

asyncio.run(async_models())
shutil.rmtree(repository, ignore_errors=True)


# The asyncio client: the same calls.
async def async_calls():
    async with AsyncClient(base, api_key=API_KEY) as c:
        jobs = await asyncio.gather(*(c.run({"n": n}, timeout=10) for n in range(20)))
        check([j.result["n"] for j in jobs] == list(range(20)), "async runs")
        try:
            await c.get("nope")
            fail("async get of an unknown id")
        except NotFound:
            pass
        letters = [j.id async for j in c.dead_letters(page_size=1)]
        check([m.name for m in await c.models()] == ["echo"], "async models")
        check((await c.model("echo")).default_version == "1", "an async model by name")
        async with AsyncClient(Proxy(echo_port, busy=2).url, api_key=API_KEY) as through:
            check((await through.run("async through", timeout=10)).result == "async through",
                  "an async run through a busy proxy")
        check(sorted(letters) == ["dl-0", "dl-1", "dl-2"], f"async dead letters: {letters}")

asyncio.run(async_calls())

for p in children:
    p.terminate()
    p.wait(timeout=30)
print("python client: ok")
