"""What the Python tests of rebound-server share: failing with a message (and killing the servers
they started), checks, and files written into a temporary tree."""
import os
import sys

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
