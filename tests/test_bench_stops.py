"""A benchmark stopped by SIGTERM stops what it started first: its forked recipe (bench/launcher.py) and a peer's
command (bench/peer_venv.py) get the signal and end, then the benchmark ends with 143. Before, a benchmark killed
by a scheduler or `timeout` left its recipe training on alone for the rest of its budget."""

from __future__ import annotations

import os
import signal
import sys
import time

import psutil
import pytest

from tests import launch

SLEEPER = "import os, sys, time\nopen(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\n" + (
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1])\ntime.sleep(120)\n"
)


def benchmark(script: str, pid_file: str, log: str, how: str) -> None:
    """A benchmark's way of running a step, in a process of its own: a recipe forked, or a peer's command."""
    from bench import launcher, peer_venv

    if how == "recipe":
        launcher.run_script(script, [pid_file], log)
    else:
        peer_venv.run([sys.executable, script, pid_file], log, "the peer's command")
    sys.exit(0)  # not reached when stopped


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize("how", ["recipe", "command"])
def test_a_sigterm_to_a_benchmark_ends_what_it_started_then_the_benchmark(tmp_path, how):
    script, pid_file = tmp_path / "sleeper.py", tmp_path / "pid"
    script.write_text(SLEEPER)
    process = launch.server().Process(target=benchmark, args=(str(script), str(pid_file), str(tmp_path / "log"), how))
    process.start()
    deadline = time.monotonic() + 60
    while not pid_file.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(pid_file.read_text())
    assert not gone(child) and child != process.pid
    os.kill(process.pid, signal.SIGTERM)  # to the benchmark alone, as `kill` or a scheduler sends it
    process.join(30)
    try:
        assert process.exitcode == 128 + signal.SIGTERM
        deadline = time.monotonic() + 10
        while not gone(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone(child)
    finally:
        for pid in (process.pid, child):
            if not gone(pid):
                os.kill(pid, signal.SIGKILL)
