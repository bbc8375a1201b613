"""A recipe run in a real process of its own, forked from a server that has imported it already.

Tests that kill, signal or crash a run need a process of its own: a SIGKILL cannot be caught, and a
signal must reach a process that handles it. Starting a Python interpreter and importing torch and
transformers costs 5 to 6 s of CPU every time, half of such a test. multiprocessing's forkserver pays it
once per test worker: the server imports the recipes, then forks a fresh process for each launch. That
process is as real as one from `python train_vits.py` (its own pid, clock, signal handlers, SIGKILL,
exit status, stdout and stderr); it only skips the imports. Tests of the command line as users type it
(tests/test_bench_smoke.py, test_distributed.py's torchrun command, test_prepare.py) still
start a new interpreter.

    process = launch("train_vits", argv, faults="slow-stop")   # faults: tests/crash_helper.py's
    process.send_signal(signal.SIGTERM); process.wait(30); process.stdout
    done = run("train_vits", argv, faults="pointer-update", n=2)  # like subprocess.run(capture_output=True)
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

# The recipes, and what they import on first use (a run's parts, librosa, matplotlib, TensorBoard).
PRELOAD = [
    "torch",
    "transformers",
    "train_vits",
    "train_feedback",
    "tests.crash_helper",
    "finetune.recipes.shared",
    "finetune.recipes.train",
    "finetune.feedback.recipe",
    "finetune.training.loop",
    "finetune.reporting.evaluation",
    "finetune.reporting.run_report",
    "finetune.reporting.tracking",
    "librosa",
    "librosa.sequence",  # its numba functions, loaded from their cache on import: 0.5-1.5 s a process
    "librosa.core.audio",
    "scipy.signal",
    "matplotlib",
    "matplotlib.pyplot",
    "torch.utils.tensorboard",
]
_context = None


def server():
    """The multiprocessing context whose processes are forked from the preloaded server (for a test that
    runs a function of its own in processes of their own: `server().Process(target=...)`)."""
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _child(recipe: str, argv: list[str], faults: str, n: int, out: str, err: str) -> None:
    """In the forked process: stdout and stderr to the files, the faults injected, the recipe run."""
    for path, fd in ((out, 1), (err, 2)):
        handle = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(handle, fd)
        os.close(handle)
    from tests import crash_helper

    crash_helper.run_recipe(faults, n, recipe, argv)


class Launched:
    """A launched recipe, answering as subprocess.Popen does (returncode: negative for a signal)."""

    def __init__(self, process, folder: tempfile.TemporaryDirectory):
        self.process, self.folder = process, folder
        self.pid = process.pid

    def _read(self, name: str) -> str:
        return (Path(self.folder.name) / name).read_text(encoding="utf-8", errors="replace")

    @property
    def stdout(self) -> str:
        return self._read("stdout")

    @property
    def stderr(self) -> str:
        return self._read("stderr")

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(f"launched {self.pid}", timeout)
        return self.process.exitcode

    def wait_for_text(self, text: str, stream: str = "stderr", timeout: float = 60.0) -> bool:
        """Until `text` appears on the stream (True) or the process ends or `timeout` passes (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in self._read(stream):
                return True
            if self.poll() is not None:
                return text in self._read(stream)
            time.sleep(0.1)
        return False

    def kill(self) -> None:
        if self.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
            self.process.join()


def launch(recipe: str, argv: list[str], faults: str = "", n: int = 1) -> Launched:
    """Start `recipe`.main(argv) ("train_vits", "train_feedback") in a process of its own; `faults`
    (comma-separated) are tests/crash_helper.py's, each at its `n`-th occasion."""
    folder = tempfile.TemporaryDirectory(prefix="launched_")
    out, err = (str(Path(folder.name) / name) for name in ("stdout", "stderr"))
    for path in (out, err):
        Path(path).touch()
    process = server().Process(target=_child, args=(recipe, list(argv), faults, n, out, err))
    process.start()
    return Launched(process, folder)


def run(
    recipe: str, argv: list[str], faults: str = "", n: int = 1, timeout: float = 300.0
) -> subprocess.CompletedProcess:
    """launch(), then wait for the end (killed after `timeout` s, raising subprocess.TimeoutExpired)."""
    launched = launch(recipe, argv, faults, n)
    try:
        code = launched.wait(timeout)
    finally:
        launched.kill()
    return subprocess.CompletedProcess([recipe, *argv], code, launched.stdout, launched.stderr)
