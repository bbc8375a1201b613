"""A peer's own environment and its logged commands, for the benches that run another trainer's code
(bench_peers.py: finetune-hf-vits; bench_piper.py: Piper): never our venv, never our pins."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from bench.launcher import signal_process, wait_passing_stops


def run(command: list, log: Path, label: str, env: dict | None = None, cwd: Path | None = None) -> None:
    """`command` with its output in `log`; a failure stops the bench, naming the step and the log. A SIGTERM or
    SIGINT to the bench reaches the command too, then ends the bench."""
    with open(log, "w") as out:
        process = subprocess.Popen([str(c) for c in command], stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        code = wait_passing_stops(process.wait, signal_process(process.pid))
    if code != 0:
        raise SystemExit(f"{label} failed (exit {code}); see {log}")


def made_venv(venv: Path, packages: list[str], logs: Path, name: str) -> Path:
    """The python of a venv holding `packages`, made once (W/<name>_venv.log, W/<name>_pip.log) and made
    again when the packages asked for change; its `.ready` file records them."""
    python = venv / "bin" / "python"
    wanted = "\n".join(packages) + "\n"
    if not (venv / ".ready").is_file() or (venv / ".ready").read_text() != wanted:
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", venv], logs / f"{name}_venv.log", f"making {name}'s venv")
        run([python, "-m", "pip", "install", *packages], logs / f"{name}_pip.log", f"installing {name}'s packages")
        (venv / ".ready").write_text(wanted)
    return python
