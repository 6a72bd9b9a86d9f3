#!/usr/bin/env python3
"""Checks that a fenced block in a doc is the committed file it shows, so the two cannot drift.
Usage: docs_block_matches.py DOC.md FENCE_LANGUAGE FILE"""
import sys

doc, language, path = sys.argv[1:4]
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
print(f"{doc} shows {path} as committed")
