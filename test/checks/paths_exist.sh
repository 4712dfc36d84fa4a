#!/usr/bin/env bash
# Every path a comment under src/ or a doc (docs/, README.md) names exists:
# a moved or deleted file leaves no pointer behind. A path in a comment is
# read from the repository's root, from src/, from src/pg/ or src/relay/
# or from the commenting file's folder, and a bare file name (key_row.cpp) must be a
# file under src/; a path in a doc is read from the root, src/, src/pg/ or
# src/relay/.
set -u
cd "$(dirname "$0")/../.."
exec python3 - <<'PY'
import os, re, subprocess, sys

PATH_RE = re.compile(r'(?<![\w./-])((?:[a-z_][\w-]*/)+[\w.+-]*\.(?:hpp|cpp|h|c|sql|sh|md|py|pl|go|json|conf))\b')
BARE_RE = re.compile(r'(?<![\w./-])([a-z_]\w*\.(?:hpp|cpp))\b')
COMMENT_RE = re.compile(r'//(.*)$|^\s*(?:/\*|\*)(.*)$|^\s*#(?!include|pragma|if|endif|else|elif|define|undef|error)(.*)$')

def files(*specs):
    out = subprocess.run(['git', 'ls-files', '--', *specs], capture_output=True, text=True)
    if out.returncode != 0:  # a staged copy without .git
        found = []
        for spec in specs:
            if os.path.isfile(spec):
                found.append(spec)
            for root, _, names in os.walk(spec if os.path.isdir(spec) else '.'):
                found += [os.path.join(root, n) for n in names]
        return sorted(set(f[2:] if f.startswith('./') else f for f in found))
    return out.stdout.split()

def exists(path, bases):
    return any(os.path.exists(os.path.join(base, path)) for base in bases)

missing = []
source_names = {os.path.basename(f) for f in files('src')}
for name in files('src'):
    if not name.endswith(('.cpp', '.hpp', '.h', '.c')):
        continue
    with open(name, encoding='utf-8', errors='replace') as f:
        for number, line in enumerate(f, 1):
            m = COMMENT_RE.search(line)
            if not m:
                continue
            text = next(g for g in m.groups() if g is not None)
            for path in PATH_RE.findall(text):
                if not exists(path, ['.', 'src', 'src/pg', 'src/relay', os.path.dirname(name)]):
                    missing.append(f'{name}:{number}: {path}')
            for bare in BARE_RE.findall(text):
                if bare not in source_names:
                    missing.append(f'{name}:{number}: {bare}')
for name in ['README.md'] + [f for f in files('docs') if f.endswith('.md')]:
    if not os.path.exists(name):
        continue
    with open(name, encoding='utf-8') as f:
        for number, line in enumerate(f, 1):
            for path in PATH_RE.findall(line):
                if path.startswith(('src/', 'pg/', 'core/', 'relay/')) or '/' in path and path.endswith(('.hpp', '.cpp')):
                    if not exists(path, ['.', 'src', 'src/pg', 'src/relay']):
                        missing.append(f'{name}:{number}: {path}')
for entry in missing:
    print(f'names a path that does not exist: {entry}')
print(f'paths_exist: {len(missing)} missing')
sys.exit(1 if missing else 0)
PY
