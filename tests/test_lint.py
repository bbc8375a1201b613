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


def test_the_rules_reach_every_file_of_the_project():
    """An exclude that matches a package's folder name (once, "training": the working folder's, and with it
    finetune/training/) silently takes that package out of both checks."""
    listed = {
        Path(line.strip()).resolve() for line in ruff("check", "--show-files").stdout.splitlines() if line.strip()
    }
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=REPO, capture_output=True, text=True, check=True)
    missing = [name for name in tracked.stdout.split() if (REPO / name).resolve() not in listed]
    assert not missing, f"ruff does not check {missing}: see extend-exclude in pyproject.toml"
