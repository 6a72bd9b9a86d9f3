"""What the Python tests of rebound-server share: failing with a message (and killing the servers
they started), checks, and files written into a temporary tree."""
import http.client
import http.server
import json
import os
import queue
import sys
import threading

children = []  # the processes a test started: killed when it fails


def fail(message):
    print("FAIL:", message, flush=True)
    for child in children:
        if child.poll() is None:
            child.kill()
    sys.exit(1)


def check(condition, message):
    if not condition:
        fail(message)


def write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def request(port, method, path, body=None, headers=None, raw=None, timeout=30):
    """One request to 127.0.0.1:port: `body` sent as JSON (or `raw` as it is). Returns (status,
    the answer parsed as JSON, or its bytes when it is not JSON, or None when empty; response)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    h = dict(headers or {})
    data = raw if raw is not None else (None if body is None else json.dumps(body))
    if data is not None:
        h.setdefault("Content-Type", "application/json")
    conn.request(method, path, data, h)
    resp = conn.getresponse()
    out = resp.read()
    conn.close()
    try:
        parsed = json.loads(out) if out else None
    except ValueError:
        parsed = out
    return resp.status, parsed, resp


def start_receiver():
    """A callback receiver on loopback that answers 200 and keeps each body: (queue of the parsed
    bodies, its URL)."""
    bodies = queue.Queue()

    class Receiver(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self):
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            bodies.put(json.loads(body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return bodies, f"http://127.0.0.1:{server.server_address[1]}/hook"
