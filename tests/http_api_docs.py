#!/usr/bin/env python3
"""docs/http-api.md, /openapi.json and the server's routing table say the same, and the doc's
curl examples work against a real server.

- Every ```sh block of the doc is run, in order, against rebound-server (echo model, memory store):
  each `curl` command must get the status on the `# NNN` line under it.
- The routes of the doc (its `## `METHOD /path`` headings), of /openapi.json, of the server's
  routing table (src/http/server.cpp) and of its `Allow` answers are the same.
- For each route, the statuses and error codes of the doc's table are those of /openapi.json
  (`x-error-codes` on each response), nothing more; 401 is in /openapi.json for every route but
  /ping, /openapi.json and /v1/webhook-keys (the doc says so once). The doc's "Answers every route can give" table is
  /openapi.json's `x-every-route-errors`.
- Every error code the server's source can answer with is documented.
Usage: http_api_docs.py REBOUND_SERVER SOURCE_DIR"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "support"))
from rawhttp import free_port, get, request  # noqa: E402

server_bin, source_dir = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
doc = open(os.path.join(source_dir, "docs", "http-api.md"), encoding="utf-8").read()
failures = []


def check(condition, message):
    if not condition:
        failures.append(message)
        print("FAIL:", message, flush=True)


def table_rows(text):
    """(status, codes) of each `| NNN | codes | when |` row."""
    rows = []
    for line in text.splitlines():
        m = re.match(r"^\|\s*(\d{3})\s*\|([^|]*)\|", line)
        if m:
            rows.append((m.group(1), set(re.findall(r"`([a-z_]+)`", m.group(2)))))
    return rows


# The doc, cut into route sections.
sections = {}
for m in re.finditer(r"^## `(GET|POST|PUT|DELETE) (/[^`?]*)`[^\n]*\n(.*?)(?=^## |\Z)", doc, re.S | re.M):
    sections[(m.group(1).lower(), m.group(2))] = m.group(3)
every_route = doc[doc.index("## Answers every route can give"):]
every_route = every_route[:every_route.index("\n## ", 1)]

port = free_port()
workdir = tempfile.mkdtemp(prefix="rebound-http-api-")
proc = subprocess.Popen([server_bin, "serve", "--host", "127.0.0.1", "--port", str(port),
                         "--model", "echo", "--store", "memory", "--log-level", "error",
                         # an API key, which every example sends (as the doc says to), and a
                         # secret for GET /v1/webhook-secret to hand out
                         "--api-key", "docs:docs-key",
                         # an operator key of the same name (so one tenant still), which the
                         # console's examples send as $OPS
                         "--operator-key", "docs:docs-ops",
                         "--signing-secret", "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
                         # the example's callback (example.com, unreachable here) stays pending
                         # for the redeliver example, however the retry delays are drawn
                         "--max-tries", "50"],
                        cwd=workdir, stdout=subprocess.DEVNULL)
try:
    deadline = time.monotonic() + 10
    while get(port, "/ping")[0] != 200:
        check(time.monotonic() < deadline, "the server did not start")
        if time.monotonic() > deadline:
            sys.exit(1)
        time.sleep(0.05)

    # 1. The curl examples: one at least per route, each getting the status the doc says.
    for (method, path), text in sections.items():
        check(re.search(r"```sh\n\s*curl ", text),
              f"{method.upper()} {path}: no curl example in its section")
    examples = 0
    for block in re.findall(r"```sh\n(.*?)```", doc, re.S):
        lines = block.replace("\\\n", " ").splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("curl "):
                continue
            expected = re.match(r"# (\d{3})", lines[i + 1]) if i + 1 < len(lines) else None
            check(expected is not None, f"no '# NNN' status under: {line}")
            if not expected:
                continue
            command = line.replace("localhost:8080", f"127.0.0.1:{port}")
            if "Authorization:" not in command:
                command += ' -H "Authorization: Bearer $KEY"'
            out = subprocess.run(["sh", "-c", command + " -o /dev/null -w '%{http_code}'"],
                                 capture_output=True, text=True, timeout=30,
                                 env=dict(os.environ, KEY="docs-key", OPS="docs-ops"))
            check(out.stdout.strip() == expected.group(1),
                  f"{line}: got {out.stdout.strip() or out.stderr.strip()}, "
                  f"the doc says {expected.group(1)}")
            examples += 1
            time.sleep(0.2)  # let the job of a submission finish before the poll that follows

    # 2. Routes.
    status, _, body = get(port, "/openapi.json")
    check(status == 200, "GET /openapi.json")
    api = json.loads(body)
    openapi_routes = {(m, p) for p, ops in api["paths"].items() for m in ops if m != "parameters"}
    check(set(sections) == openapi_routes,
          f"routes: the doc has {sorted(set(sections) - openapi_routes)} more, /openapi.json "
          f"has {sorted(openapi_routes - set(sections))} more")
    # The route table (Server::Impl::routes: method, path pattern, access, body, handler): every
    # route of it is in /openapi.json with its method, and nothing else is; the console's page
    # (/console, /console/{file...}) is static files, not the API.
    table = open(os.path.join(source_dir, "src", "http", "server.cpp"), encoding="utf-8").read()
    routes = {(m.lower(), p) for m, p in re.findall(
        r'\{"(GET|POST|DELETE|PUT|PATCH)", "(/[^"]*)", [a-z_ |]+, Body::', table)}
    check(len(routes) >= 20, f"only {len(routes)} routes found in the table: the pattern is stale")
    api_routes = {(m, p) for p, ops in api["paths"].items() for m in ops if m != "parameters"}
    table_routes = {(m, p) for m, p in routes if not p.startswith("/console")}
    check(table_routes == api_routes,
          f"the route table has {sorted(table_routes - api_routes)} more, /openapi.json has "
          f"{sorted(api_routes - table_routes)} more")
    for path, ops in api["paths"].items():
        concrete = path.replace("{id}", "1234")
        # (The console's routes and the models' changes are for an operator key.)
        key = ("docs-ops" if path.startswith(("/v1/console/", "/v1/models/{name}/", "/models"))
               else "docs-key")
        st, head, _ = request(port, f"OPTIONS {concrete} HTTP/1.1\r\nHost: x\r\n"
                                      f"Authorization: Bearer {key}\r\n\r\n".encode())
        allow = re.search(r"(?im)^Allow:\s*(.*)$", head)
        methods = {m.strip().lower() for m in allow.group(1).split(",")} if allow else set()
        check(st == 204 and methods - {"head"} == {m for m in ops if m != "parameters"},
              f"OPTIONS {path}: {st} Allow {sorted(methods)}")

    # 3. Statuses and error codes, route by route.
    for (method, path), text in sections.items():
        op = api["paths"].get(path, {}).get(method)
        if not op:
            continue
        rows = table_rows(text)
        check(rows, f"{method.upper()} {path}: no status table in the doc")
        doc_codes = {}
        for st, codes in rows:
            doc_codes.setdefault(st, set()).update(codes)
        responses = dict(op["responses"])
        if path in ("/ping", "/openapi.json", "/v1/webhook-keys"):
            check("401" not in responses, f"{path} must not answer 401")
        else:
            check("401" in responses and responses.pop("401")["x-error-codes"] == ["unauthorized"],
                  f"{method.upper()} {path}: 401 unauthorized missing from /openapi.json")
        check(set(doc_codes) == set(responses),
              f"{method.upper()} {path}: statuses {sorted(doc_codes)} in the doc, "
              f"{sorted(responses)} in /openapi.json")
        for st, response in responses.items():
            codes = set(response.get("x-error-codes", []))
            check(codes == doc_codes.get(st, codes),
                  f"{method.upper()} {path} {st}: codes {sorted(doc_codes.get(st, []))} in the "
                  f"doc, {sorted(codes)} in /openapi.json")
    doc_every = sorted((int(st), code) for st, codes in table_rows(every_route) for code in codes)
    api_every = sorted((e["status"], e["code"]) for e in api["x-every-route-errors"])
    check(doc_every == api_every, f"every route: {doc_every} in the doc, {api_every} in /openapi.json")

    # 4. Every code the source can answer with is documented.
    documented = set(re.findall(r"`([a-z]+(?:_[a-z]+)+|[a-z]+)`", doc))
    emitted = set()
    for top in (os.path.join(source_dir, "src"), os.path.join(source_dir, "include", "rebound")):
        for folder, _, files in os.walk(top):
            for name in files:
                if not name.endswith((".cpp", ".hpp")):
                    continue
                text = open(os.path.join(folder, name), encoding="utf-8").read()
                # an answer: {status, "code", ...}
                emitted |= set(re.findall(
                    r'\{\s*(?:\d{3}|status|http_status)\s*,\s*"([a-z_]+)"', text))
                # a job's or an invocation's error: Prediction::failure("code", ...), ErrorInfo{"code"
                emitted |= set(re.findall(r'(?:failure\(|ErrorInfo\{)\s*"([a-z_]+)"', text))
    check(len(emitted) >= 15, f"only {sorted(emitted)} found in the source: the pattern is stale")
    check(emitted <= documented, f"undocumented error codes: {sorted(emitted - documented)}")
finally:
    proc.kill()  # a drain would wait for the example's callback; nothing here needs one
    proc.wait()

if failures:
    print(f"{len(failures)} failure(s)")
    sys.exit(1)
print(f"docs/http-api.md, /openapi.json and the routing table agree; {examples} curl examples ran")
