#!/usr/bin/env python3
"""Validates the OpenAPI document the server serves (docs/openapi.json, embedded at build time)
against the OpenAPI 3 schema with the validator given. Usage: openapi_valid.py DOC VALIDATOR OUT.json"""
import json
import subprocess
import sys

path, validator, out = sys.argv[1:4]
document = json.load(open(path, encoding="utf-8"))
assert document["openapi"].startswith("3."), document["openapi"]
with open(out, "w", encoding="utf-8") as f:
    json.dump(document, f)
result = subprocess.run([validator, out], capture_output=True, text=True, timeout=60)
print(result.stdout, result.stderr)
if result.returncode != 0 or '"valid": true' not in result.stdout:
    sys.exit("docs/openapi.json is not a valid OpenAPI 3 document")
print("docs/openapi.json is valid OpenAPI", document["openapi"])
