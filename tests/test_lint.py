"""The linter's rules (pyproject.toml [tool.ruff]) hold on every file: a new unused import, undefined
name or syntax error fails the suite, not a later reader."""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO


def test_ruff_finds_nothing():
    ruff = shutil.which("ruff") or str(Path(sys.executable).parent / "ruff")
    result = subprocess.run([ruff, "check", "--no-cache", str(REPO)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
