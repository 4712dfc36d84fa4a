"""Every ```python example of docs/clients-python.md runs as a program
against the cluster and exits 0 (except those marked <!-- illustrative -->)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

PAGE = Path(__file__).resolve().parents[3] / "docs" / "clients-python.md"


def examples(markdown, language):
    found = []
    for match in re.finditer(rf"(<!-- illustrative -->\n)?```{language}\n(.*?)```\n", markdown, re.S):
        if not match.group(1):
            found.append((markdown[:match.start()].count("\n") + 2, match.group(2)))
    return found


FOUND = examples(PAGE.read_text(), "python")


def test_the_page_has_examples():
    assert len(FOUND) >= 5


@pytest.mark.parametrize("line, code", FOUND, ids=[f"line {line}" for line, _ in FOUND])
def test_the_example_runs(line, code, tmp_path):
    script = tmp_path / f"line_{line}.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout, "it prints what it shows"
