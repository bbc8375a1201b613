"""The linter's and the formatter's rules (pyproject.toml [tool.ruff]) hold on every file: a new unused
import, undefined name, unsorted import block, syntax error or unformatted line fails the suite, not a
later reader."""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def ruff(*args: str) -> subprocess.CompletedProcess:
    binary = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    return subprocess.run([binary, *args, "--no-cache", str(REPO)], capture_output=True, text=True, timeout=60)


def test_ruff_finds_nothing():
    result = ruff("check")
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_file_is_formatted():
    result = ruff("format", "--check")
    assert result.returncode == 0, "run `ruff format .`:\n" + result.stdout + result.stderr
