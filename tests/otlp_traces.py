#!/usr/bin/env python3
"""rebound-server's OpenTelemetry traces (--otlp-endpoint) against a strict OTLP/HTTP JSON sink on
loopback: every export is checked for the shape the OTLP specification gives (ids, kinds, times,
attribute values, status), the sink refuses the first exports (503 with Retry-After: 0, then 429
with Retry-After: 1) and the spans still arrive, and each job's trace is whole: the submission
(`send echo`, PRODUCER; the child of the caller's traceparent, or a root), the run (`process
echo`, CONSUMER) and each callback attempt (`POST`, CLIENT) under it, each attempt's span id being
the parent id in the traceparent its receiver got, a retried attempt with its resend count. A
second server whose collector refuses everything counts its dropped spans in /metrics.

The sink itself is checked against the official OpenTelemetry JS exporter's output (when node
and the node tools are given), so that it is not wrong in the same way as rebound's exporter.

    otlp_traces.py REBOUND_SERVER [NODE NODE_TOOLS_DIR]
"""
import atexit
import http.client
import http.server
import json
import os
import re
import subprocess
import sys
import threading
import time

server_bin = sys.argv[1]
node, node_tools = (sys.argv[2], sys.argv[3]) if len(sys.argv) > 3 else (None, None)
children = []
HEX32, HEX16 = re.compile(r"[0-9a-f]{32}"), re.compile(r"[0-9a-f]{16}")


def fail(message):
    print("FAIL:", message, flush=True)
    for p in children:
        if p.poll() is None:
            p.kill()
    if threading.current_thread() is not threading.main_thread():
        os._exit(1)  # (the sink's checks run on its threads)
    sys.exit(1)


@atexit.register
def end_children():
    for p in children:
        if p.poll() is None:
            p.kill()


def check(ok, message):
    if not ok:
        fail(message)


def check_value(value, where):
    check(isinstance(value, dict) and len(value) == 1, f"{where}: an AnyValue has one field: {value}")
    (kind, v), = value.items()
    if kind == "stringValue":
        check(isinstance(v, str), f"{where}: stringValue {v!r}")
    elif kind == "intValue":
        check(isinstance(v, int) or (isinstance(v, str) and re.fullmatch(r"-?[0-9]+", v)),
              f"{where}: intValue {v!r}")
    elif kind == "doubleValue":
        check(isinstance(v, (int, float)), f"{where}: doubleValue {v!r}")
    elif kind == "boolValue":
        check(isinstance(v, bool), f"{where}: boolValue {v!r}")
    else:
        fail(f"{where}: an AnyValue kind this sink does not expect: {kind}")


def check_attributes(attributes, where):
    check(isinstance(attributes, list), f"{where}: attributes is a list")
    keys = set()
    for a in attributes:
        check(isinstance(a, dict) and set(a) == {"key", "value"} and isinstance(a["key"], str),
              f"{where}: a KeyValue: {a}")
        check(a["key"] not in keys, f"{where}: attribute {a['key']} twice")
        keys.add(a["key"])
        check_value(a["value"], f"{where}.{a['key']}")
    return {a["key"]: list(a["value"].values())[0] for a in attributes}


def nanos(v, where):
    check(isinstance(v, int) or (isinstance(v, str) and v.isdigit()), f"{where}: {v!r}")
    return int(v)


SPAN_FIELDS = {"traceId", "spanId", "parentSpanId", "name", "kind", "startTimeUnixNano",
               "endTimeUnixNano", "attributes", "status", "traceState", "flags", "events", "links",
               "droppedAttributesCount", "droppedEventsCount", "droppedLinksCount"}


def check_export(body):
    """The spans of one ExportTraceServiceRequest, each with its resource's attributes."""
    check(isinstance(body, dict) and set(body) == {"resourceSpans"}, f"top level: {list(body)}")
    out = []
    now = time.time_ns()
    for rs in body["resourceSpans"]:
        check(set(rs) <= {"resource", "scopeSpans", "schemaUrl"}, f"resourceSpans: {list(rs)}")
        resource = check_attributes(rs["resource"]["attributes"], "resource")
        for ss in rs["scopeSpans"]:
            check(isinstance(ss["scope"].get("name"), str) and ss["scope"]["name"], "scope.name")
            for s in ss["spans"]:
                where = f"span {s.get('name')}"
                check(set(s) <= SPAN_FIELDS, f"{where}: unknown fields {set(s) - SPAN_FIELDS}")
                check(HEX32.fullmatch(s["traceId"]) and s["traceId"] != "0" * 32,
                      f"{where}: traceId {s['traceId']!r}")
                check(HEX16.fullmatch(s["spanId"]) and s["spanId"] != "0" * 16,
                      f"{where}: spanId {s['spanId']!r}")
                if "parentSpanId" in s:
                    check(HEX16.fullmatch(s["parentSpanId"]) is not None,
                          f"{where}: parentSpanId {s['parentSpanId']!r}")
                check(isinstance(s["name"], str) and s["name"], f"{where}: name")
                check(s["kind"] in (1, 2, 3, 4, 5), f"{where}: kind {s['kind']!r}")
                start = nanos(s["startTimeUnixNano"], f"{where}: start")
                end = nanos(s["endTimeUnixNano"], f"{where}: end")
                check(now - 600 * 10**9 < start <= end <= now + 10**9, f"{where}: times")
                s["attrs"] = check_attributes(s.get("attributes", []), where)
                if "status" in s:
                    check(s["status"].get("code") in (0, 1, 2), f"{where}: status {s['status']}")
                s["resource"] = resource
                out.append(s)
    return out


class Sink(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, refuse=(), refuse_all=False, hang=False):
        self.lock = threading.Lock()
        self.spans, self.answers, self.answered_at = [], [], []
        self.hang = hang
        self.refuse = list(refuse)  # (status, retry_after) for the first exports
        self.refuse_all = refuse_all
        super().__init__(("127.0.0.1", 0), SinkHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class SinkHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def read_body(self):
        # A collector takes either framing: the official exporter sends chunked bodies.
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            body = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    self.rfile.readline()
                    return body
                body += self.rfile.read(size)
                self.rfile.readline()
        return self.rfile.read(int(self.headers["Content-Length"]))

    def do_POST(self):
        body = self.read_body()
        if self.server.hang:
            time.sleep(60)  # a collector that takes the request and never answers
            return
        check(self.path == "/v1/traces", f"exported to {self.path}")
        check(self.headers.get("Content-Type") == "application/json",
              f"Content-Type {self.headers.get('Content-Type')}")
        spans = check_export(json.loads(body))
        sink = self.server
        with sink.lock:
            if sink.refuse_all:
                status, retry_after = 400, None
            elif sink.refuse:
                status, retry_after = sink.refuse.pop(0)
            else:
                status, retry_after = 200, None
                sink.spans.extend(spans)
            sink.answers.append(status)
            sink.answered_at.append(time.monotonic())
        data = b"{}" if status == 200 else b'{"code":14,"message":"not now"}'
        self.send_response(status)
        if retry_after is not None:
            self.send_header("Retry-After", retry_after)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


class Receiver(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        self.lock = threading.Lock()
        self.calls = []  # (job id, traceparent, status answered)
        self.failed_once = set()
        super().__init__(("127.0.0.1", 0), ReceiverHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()


class ReceiverHandler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        job_id = json.loads(self.rfile.read(int(self.headers["Content-Length"])))["id"]
        with self.server.lock:
            status = 200
            if job_id == "retry-me" and job_id not in self.server.failed_once:
                self.server.failed_once.add(job_id)
                status = 503
            self.server.calls.append((job_id, self.headers.get("traceparent"), status))
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def start_server(sink, *extra, path=""):
    env = dict(os.environ, OTEL_SERVICE_NAME="trace-test")
    proc = subprocess.Popen(
        [server_bin, "serve", "--host", "127.0.0.1", "--port", "0", "--model", "echo", "--store",
         "memory", "--allow-private-callbacks", "--server-id", "traced-1", "--backoff-base",
         "0.05", "--backoff-cap", "0.1", "--otlp-endpoint",
         f"http://127.0.0.1:{sink.server_address[1]}{path}", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    children.append(proc)
    for line in proc.stdout:
        m = re.search(r"listening on 127\.0\.0\.1:(\d+)", line)
        if m:
            threading.Thread(target=lambda: [None for _ in proc.stdout], daemon=True).start()
            return proc, int(m.group(1))
    fail("rebound-server did not start")


def request(port, method, path, body=None, headers=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request(method, path, json.dumps(body) if body is not None else None,
                 {"Content-Type": "application/json", **(headers or {})})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, data


def wait_for(predicate, what, limit_s=30):
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    fail(f"timed out waiting for {what}")


def metric(port, name):
    text = request(port, "GET", "/metrics")[1].decode()
    m = re.search(rf"^{name} (\d+)", text, re.M)
    return int(m.group(1)) if m else None


if node:
    # The official exporter's output passes the sink's checks, and reads as it was sent.
    official = Sink()
    subprocess.run([node, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                       "otlp_official.mjs"), node_tools,
                    f"http://127.0.0.1:{official.server_address[1]}/v1/traces"],
                   check=True, timeout=60)
    by_name = {s["name"]: s for s in official.spans}
    check(set(by_name) == {"send echo", "process echo"}, f"official spans: {list(by_name)}")
    o_send, o_process = by_name["send echo"], by_name["process echo"]
    check(o_send["kind"] == 4 and o_process["kind"] == 5, "official kinds")
    check(o_process["parentSpanId"] == o_send["spanId"] and
          o_process["traceId"] == o_send["traceId"], "official parent")
    check(o_send["resource"]["service.name"] == "official", "official resource")
    check(int(o_send["attrs"]["count"]) == 3 and o_send["attrs"]["ratio"] == 1.5 and
          o_send["attrs"]["ok"] is True, f"official attribute values: {o_send['attrs']}")
    check(o_process["status"]["code"] == 2 and o_send["status"]["code"] == 1, "official status")
    print("the sink takes the official exporter's output", flush=True)

sink = Sink(refuse=[(503, "0"), (429, "1")])
receiver = Receiver()
hook = f"http://127.0.0.1:{receiver.server_address[1]}/hook"
proc, port = start_server(sink)

CALLER_TRACE, CALLER_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
jobs = {
    "a": ({"id": "a", "input": 1, "callback_url": hook},
          {"traceparent": f"00-{CALLER_TRACE}-{CALLER_SPAN}-01"}),
    "b": ({"id": "b", "input": 2, "callback_url": hook}, {}),
    "retry-me": ({"id": "retry-me", "input": 3, "callback_url": hook}, {}),
    "noback": ({"id": "noback", "input": 4}, {}),
    "unsampled": ({"id": "unsampled", "input": 5, "callback_url": hook},
                  {"traceparent": f"00-{'5' * 32}-{'6' * 16}-00"}),
}
for body, headers in jobs.values():
    status, data = request(port, "POST", "/v1/inferences", body, headers)
    check(status == 202, f"submission: {status} {data}")
wait_for(lambda: {c[0] for c in receiver.calls if c[2] == 200} >= {"a", "b", "retry-me",
                                                                    "unsampled"}, "the callbacks")


def spans_of(job_id):
    with sink.lock:
        return [s for s in sink.spans if s["attrs"].get("messaging.message.id") == job_id]


# Each job: send + process, and one POST per attempt (retry-me: two).
expected = {"a": 3, "b": 3, "retry-me": 4, "noback": 2}
wait_for(lambda: all(len(spans_of(j)) >= n for j, n in expected.items()), "every job's spans", 40)
check(sink.answers[:2] == [503, 429] and 200 in sink.answers,
      f"the refused exports were sent again: {sink.answers}")
check(sink.answered_at[2] - sink.answered_at[1] >= 0.9,
      "the export after '429 Retry-After: 1' waited for it")
check(not spans_of("unsampled"), "a trace the caller did not sample was exported")
unsampled_tp = [c[1] for c in receiver.calls if c[0] == "unsampled"][0]
check(unsampled_tp.startswith("00-" + "5" * 32) and unsampled_tp.endswith("-00"),
      f"the unsampled job's callback keeps its trace and flags: {unsampled_tp}")

for job_id, n in expected.items():
    spans = spans_of(job_id)
    check(len(spans) == n, f"{job_id}: {len(spans)} spans, {[s['name'] for s in spans]}")
    send = [s for s in spans if s["kind"] == 4]
    process = [s for s in spans if s["kind"] == 5]
    posts = sorted((s for s in spans if s["kind"] == 3), key=lambda s: int(s["startTimeUnixNano"]))
    check(len(send) == 1 and send[0]["name"] == "send echo", f"{job_id}: the send span")
    check(len(process) == 1 and process[0]["name"] == "process echo", f"{job_id}: process span")
    send, process = send[0], process[0]
    check(len({s["traceId"] for s in spans}) == 1, f"{job_id}: one trace")
    check(process["parentSpanId"] == send["spanId"], f"{job_id}: process under send")
    check(process["status"]["code"] == 1, f"{job_id}: the run succeeded: {process['status']}")
    check(int(process["attrs"]["rebound.queue_wait_ms"]) >= 0, "queue wait")
    check(int(send["startTimeUnixNano"]) <= int(process["startTimeUnixNano"]) and
          all(int(process["startTimeUnixNano"]) <= int(p["startTimeUnixNano"]) for p in posts),
          f"{job_id}: send, then process, then the attempts")
    for s in (send, process):
        check(s["attrs"]["messaging.system"] == "rebound" and
              s["attrs"]["messaging.destination.name"] == "echo" and
              s["attrs"].get("rebound.model.version") == "1" and
              s["attrs"]["messaging.operation.type"] in ("send", "process"),
              f"{job_id}: messaging attributes {s['attrs']}")
        check(s["resource"]["service.name"] == "trace-test" and
              s["resource"]["service.instance.id"] == "traced-1", f"resource {s['resource']}")
    got = [c for c in receiver.calls if c[0] == job_id]
    check(len(got) == len(posts), f"{job_id}: {len(got)} callbacks, {len(posts)} POST spans")
    for (_, traceparent, status), post in zip(got, posts):
        check(post["name"] == "POST" and post["parentSpanId"] == send["spanId"],
              f"{job_id}: the attempt's span under the send span")
        check(traceparent == f"00-{post['traceId']}-{post['spanId']}-01",
              f"{job_id}: the receiver's traceparent {traceparent} names the attempt's span")
        check(int(post["attrs"]["http.response.status_code"]) == status,
              f"{job_id}: the attempt's status {post['attrs']}")
        check(post["status"]["code"] == (1 if status == 200 else 2), f"{job_id}: span status")

a_send = [s for s in spans_of("a") if s["kind"] == 4][0]
check(a_send["traceId"] == CALLER_TRACE and a_send["parentSpanId"] == CALLER_SPAN,
      "the submission's span continues the caller's traceparent")
b_send = [s for s in spans_of("b") if s["kind"] == 4][0]
check("parentSpanId" not in b_send, "a submission without a traceparent starts a trace")
retry_posts = sorted((s for s in spans_of("retry-me") if s["kind"] == 3),
                     key=lambda s: int(s["startTimeUnixNano"]))
check("http.request.resend_count" not in retry_posts[0]["attrs"] and
      int(retry_posts[1]["attrs"]["http.request.resend_count"]) == 1,
      f"the retry's resend count: {[p['attrs'] for p in retry_posts]}")
check(retry_posts[0]["attrs"]["error.type"] == "503", "the failed attempt's error.type")

wait_for(lambda: (metric(port, "rebound_trace_spans_exported_total") or 0) >=
         sum(expected.values()), "rebound_trace_spans_exported_total")
check(metric(port, "rebound_trace_spans_dropped_total") == 0, "nothing dropped")

# A collector that refuses everything (given as the full traces URL): the spans are dropped, and
# counted.
refusing = Sink(refuse_all=True)
proc2, port2 = start_server(refusing, path="/v1/traces")
check(request(port2, "POST", "/v1/inferences", {"id": "x", "input": 1})[0] == 202, "submit")
wait_for(lambda: (metric(port2, "rebound_trace_spans_dropped_total") or 0) >= 2,
         "the refused spans counted as dropped")
check(metric(port2, "rebound_trace_spans_exported_total") == 0, "nothing exported")

# A collector that never answers: jobs go on, and a shutdown waits for it 5 s at most.
hung = Sink(hang=True)
proc3, port3 = start_server(hung)
for n in range(20):
    check(request(port3, "POST", "/v1/inferences", {"id": f"h{n}", "input": n})[0] == 202, "submit")
wait_for(lambda: json.loads(request(port3, "GET", "/v1/inferences/h19")[1])["status"] ==
         "succeeded", "jobs beside a hung collector")
stopped_at = time.monotonic()
proc3.terminate()
proc3.wait(timeout=60)
took = time.monotonic() - stopped_at
check(took < 15, f"a shutdown beside a hung collector took {took:.1f} s")
print(f"a shutdown beside a hung collector: {took:.1f} s", flush=True)

for p in children:
    p.terminate()
    p.wait(timeout=30)
print("otlp traces: ok")
