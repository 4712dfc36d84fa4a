#!/usr/bin/env python3
"""Extracts the code blocks the doc test runs from a Markdown file.

Every fenced block whose info string starts with `sql` or `sh` runs, in the
order of the file, unless a marker line `<!-- illustrative -->` stands right
before its fence (blank lines and other marker lines aside). The role that
runs a block is named the same way, `<!-- role: NAME -->` (a database role
such as postgres, app, relay or monitoring; the page's text says it too).
Writes one file per block into OUTDIR, named NNN.sql or NNN.sh, and prints
their names with the line each block starts at and its role (`-` when the
block names none), tab-separated.
"""
import os
import re
import sys

FENCE = re.compile(r"^(\s*)(`{3,}|~{3,})\s*([A-Za-z0-9_+-]*)")
MARK = "<!-- illustrative -->"
ROLE = re.compile(r"^<!--\s*role:\s*([A-Za-z_][A-Za-z0-9_]*)\s*-->$")


def blocks(lines):
    i = 0
    marks = []  # the marker lines right before the next fence
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            text = lines[i].strip()
            if text.startswith("<!--"):
                marks.append(text)
            elif text:
                marks = []
            i += 1
            continue
        indent, fence, lang = m.group(1), m.group(2), m.group(3).lower()
        start = i + 1
        j = start
        while j < len(lines) and not lines[j].strip().startswith(fence):
            j += 1
        body = [l[len(indent):] if l.startswith(indent) else l for l in lines[start:j]]
        roles = [r.group(1) for r in map(ROLE.match, marks) if r]
        yield lang, start, body, MARK in marks, roles[-1] if roles else "-"
        marks = []
        i = j + 1


def main():
    path, outdir = sys.argv[1], sys.argv[2]
    os.makedirs(outdir, exist_ok=True)
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    n = 0
    for lang, start, body, illustrative, role in blocks(lines):
        if illustrative or lang not in ("sql", "sh"):
            continue
        n += 1
        name = os.path.join(outdir, f"{n:03d}.{lang}")
        with open(name, "w", encoding="utf-8") as out:
            out.write("\n".join(body) + "\n")
        print(f"{name}\t{start}\t{role}")


if __name__ == "__main__":
    main()
