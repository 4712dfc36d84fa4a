#!/usr/bin/env bash
# Under src/pg a PostgreSQL error may longjmp over any frame, and a C++
# destructor in such a frame would be skipped (leaks, corrupted state):
# so no std::string, std::vector or std::unique_ptr object is declared
# there. A place where one is safe (no call that can raise a PostgreSQL
# error while it lives) says so with a comment "destructor-safe: why" on
# the declaration's line or the line above it. Temporaries built into a
# throw expression are no declarations and are not looked at.
set -u
cd "$(dirname "$0")/../.."
exec python3 - <<'PY'
import os, re, sys

TYPE = r'std::(?:string|vector\s*<[^;]*?>|unique_ptr\s*<[^;]*?>)'
DECLARED = re.compile(r'(?:^|[\s(,{;])(?:const\s+|static\s+|thread_local\s+)*' + TYPE +
                      r'\s+[A-Za-z_]\w*\s*(?:[;=({,)\[]|$)')
DEDUCED = re.compile(r'\bauto\s+[A-Za-z_]\w*\s*=\s*std::(?:string|vector|make_unique|unique_ptr)\b')
SAFE = 'destructor-safe:'

found = []
for root, _, names in os.walk('src/pg'):
    for name in sorted(names):
        if not name.endswith(('.cpp', '.hpp')):
            continue
        path = os.path.join(root, name)
        with open(path, encoding='utf-8') as f:
            lines = f.read().split('\n')
        for number, line in enumerate(lines, 1):
            code = line.split('//', 1)[0]
            if not (DECLARED.search(code) or DEDUCED.search(code)):
                continue
            if SAFE in line or (number > 1 and SAFE in lines[number - 2]):
                continue
            found.append(f'{path}:{number}: {line.strip()}')
for entry in found:
    print(f'an object with a destructor where PostgreSQL may longjmp: {entry}')
print(f'no_destructors_in_pg: {len(found)} found')
sys.exit(1 if found else 0)
PY
