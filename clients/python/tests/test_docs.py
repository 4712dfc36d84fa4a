"""The pages run: every ```python example of docs/clients-python.md runs as
a program against the cluster, as the application role, and exits 0; every
```sql block of the page runs as the role its marker names, in the order of
the page (blocks marked <!-- illustrative --> are not run). And the rule of
the pages: each SQL or shell block of docs/clients-python.md and
clients/python/README.md has a marker line `<!-- role: NAME -->` and a
sentence before it that names the role."""

import os
import re
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "clients-python.md"
README = ROOT / "clients" / "python" / "README.md"
ROLES = ("postgres", "app", "relay", "monitoring")
FENCE = re.compile(r"^```(\w*)\s*$")


def blocks(markdown):
    """(line, language, code, markers, prose before the markers) for each fenced block."""
    lines = markdown.split("\n")
    found, i, prose = [], 0, []
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            prose.append(lines[i])
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        markers, k = [], len(prose) - 1
        while k >= 0 and (prose[k].startswith("<!--") or not prose[k].strip()):
            if prose[k].strip():
                markers.insert(0, prose[k].strip())
            k -= 1
        before = "\n".join(prose[max(0, k - 8):k + 1])
        found.append((i + 2, m.group(1), "\n".join(lines[i + 1:j]) + "\n", markers, before))
        prose = []
        i = j + 1
    return found


def role_of(markers):
    for marker in markers:
        m = re.fullmatch(r"<!-- role: (\w+) -->", marker)
        if m:
            return m.group(1)
    return None


PAGE_BLOCKS = [b for b in blocks(PAGE.read_text()) if "<!-- illustrative -->" not in b[3]]
PYTHON = [(line, code) for line, lang, code, _, _ in PAGE_BLOCKS if lang == "python"]


def test_the_page_has_examples():
    assert len(PYTHON) >= 8


@pytest.mark.parametrize("page", [PAGE, README], ids=lambda p: p.name)
def test_every_sql_and_shell_block_says_its_role(page):
    """Finding 3: the pages never said which role runs a snippet."""
    checked = 0
    for line, lang, _, markers, before in blocks(page.read_text()):
        if lang not in ("sql", "sh", "bash", "shell"):
            continue
        checked += 1
        role = role_of(markers)
        assert role in ROLES, f"{page.name}:{line}: no <!-- role: NAME --> marker right before the block"
        assert markers[0] == f"<!-- role: {role} -->", f"{page.name}:{line}: the role marker comes first"
        assert re.search(rf"\b{role}\b", before), f"{page.name}:{line}: no sentence names the role {role}"
    assert checked


def admin():
    return psycopg.connect(user=os.environ.get("PGADMIN_USER", "postgres"), autocommit=True)


def run_python(code, tmp_path, name):
    script = tmp_path / f"{name}.py"
    script.write_text(code)
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path)


@pytest.fixture(scope="module")
def application_role_only():
    """The application role with grant_application only, as the page's reader
    has it; the other tests get the relay rights back afterwards."""
    with admin() as c:
        c.execute("SELECT idempotency.revoke_role('app')")
        c.execute("SELECT idempotency.grant_application('app')")
    yield
    with admin() as c:
        c.execute("SELECT idempotency.grant_relay('app')")


def test_the_consumer_example_needs_the_grant_the_page_shows(application_role_only, tmp_path):
    # Its own order and event, so that the page's run still finds its own.
    consumer = next(code for _, code in PYTHON if "idem.Consumer(" in code).replace("43", "4300")
    refused = run_python(consumer, tmp_path, "consumer")
    assert refused.returncode != 0 and "permission denied for function outbox_claim" in refused.stderr, \
        refused.stdout + refused.stderr
    grant = next(code for _, lang, code, markers, _ in PAGE_BLOCKS
                 if lang == "sql" and "grant_relay" in code and role_of(markers) == "postgres")
    with admin() as c:
        c.execute(grant)
    done = run_python(consumer, tmp_path, "consumer")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_page_runs_in_order(application_role_only, tmp_path):
    ran = 0
    for line, lang, code, markers, _ in PAGE_BLOCKS:
        if lang == "sql":
            role = role_of(markers)
            with (admin() if role == "postgres" else psycopg.connect(user=role, autocommit=True)) as c:
                c.execute(code)
        elif lang == "python":
            done = run_python(code, tmp_path, f"line_{line}")
            assert done.returncode == 0, f"line {line}:\n{done.stdout}{done.stderr}"
            assert done.stdout, f"line {line}: it prints what it shows"
            ran += 1
    assert ran == len(PYTHON)
