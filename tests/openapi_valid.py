#!/usr/bin/env python3
"""Extracts the OpenAPI document the server serves (src/http/openapi.json.inc) and validates it against
the OpenAPI 3 schema with the validator given. Usage: openapi_valid.py INC VALIDATOR OUT.json"""
import json
import subprocess
import sys

inc, validator, out = sys.argv[1:4]
text = open(inc, encoding="utf-8").read()
document = json.loads(text[text.index('R"json(') + 7:text.rindex(')json"')])
assert document["openapi"].startswith("3."), document["openapi"]
with open(out, "w", encoding="utf-8") as f:
    json.dump(document, f)
result = subprocess.run([validator, out], capture_output=True, text=True, timeout=60)
print(result.stdout, result.stderr)
if result.returncode != 0 or '"valid": true' not in result.stdout:
    sys.exit("src/http/openapi.json.inc is not a valid OpenAPI 3 document")
print("src/http/openapi.json.inc is valid OpenAPI", document["openapi"])
