#!/usr/bin/env python3
"""Checks that a fenced block in a doc is the committed file it shows, so the two cannot drift.
Usage: docs_block_matches.py DOC.md FENCE_LANGUAGE FILE [MAX_CODE_LINES]
With MAX_CODE_LINES, the block may hold at most that many lines of code (not blank, not only a
// comment): the README's tour stays short."""
import sys

doc, language, path = sys.argv[1:4]
max_code = int(sys.argv[4]) if len(sys.argv) > 4 else None
text = open(doc, encoding="utf-8").read()
fence = "```" + language + "\n"
start = text.find(fence)
if start < 0:
    sys.exit(f"{doc}: no ```{language} block")
start += len(fence)
end = text.find("```\n", start)
shown, actual = text[start:end], open(path, encoding="utf-8").read()
if shown != actual:
    sys.exit(f"{doc}: its ```{language} block differs from {path}; copy the file into the doc")
if max_code is not None:
    code = [l for l in shown.splitlines() if l.strip() and not l.strip().startswith("//")]
    if len(code) > max_code:
        sys.exit(f"{doc}: its ```{language} block has {len(code)} lines of code, more than {max_code}")
print(f"{doc} shows {path} as committed")
