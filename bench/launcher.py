"""A recipe script run as a process of its own, forked from a server that imported torch, transformers
and the recipes once (multiprocessing's forkserver).

Benchmarks that compare what runs produce (bench_finetune.py, bench_speakers.py) launch several
recipes, and bench_synthesis.py its cases; a new interpreter pays 5 to 6 s of CPU importing torch and
transformers each time. A forked process is as separate as one from `python train_vits.py` (its own pid,
threads, memory, exit status; its output goes to its log), it only skips the imports. Benchmarks that time
a launch or measure a whole process's memory (bench_deadline.py, bench_scale.py, bench_train.py), or race a
run against another tool's (bench_peers.py: a run's imports count against its budget), start real
interpreters instead.

Where this process runs torch on one thread and has no CUDA context (the test suite's smoke runs:
OMP_NUM_THREADS=1, forked from tests/launch.py's server, which holds these imports already), a launch
forks this process itself: no thread pool or CUDA context is copied half-made, and no server pays the
imports a second time (the five smoke tests that launch recipes: 132.0 s of test time before, 111.9 s
after, bench/RESULTS.md). Otherwise the server.
"""

from __future__ import annotations

import multiprocessing
import os
import runpy
import signal
import sys
from pathlib import Path
from typing import Callable, TypeVar

T = TypeVar("T")

REPO = Path(__file__).resolve().parent.parent
# The recipes, and what they import on first use (a run's parts, librosa, matplotlib, TensorBoard): each of
# these a launch would otherwise import again.
PRELOAD = [
    "torch",
    "transformers",
    "prepare_data",
    "train_vits",
    "check_transcripts",
    "finetune.recipes.shared",
    "finetune.recipes.train",
    "finetune.feedback.recipe",
    "finetune.training.loop",
    "finetune.reporting.evaluation",
    "finetune.reporting.run_report",
    "finetune.reporting.tracking",
    "finetune.data.prepare",
    "librosa",
    "librosa.sequence",  # its numba functions, loaded from their cache on import: 0.5-1.5 s a process
    "librosa.core.audio",
    "scipy.signal",
    "matplotlib",
    "matplotlib.pyplot",
    "torch.utils.tensorboard",
]
_context = None


def _server():
    global _context
    if _context is None:
        import torch

        if torch.get_num_threads() == 1 and not torch.cuda.is_initialized():
            _context = multiprocessing.get_context("fork")
        else:
            _context = multiprocessing.get_context("forkserver")
            _context.set_forkserver_preload(PRELOAD)
    return _context


def _child(script: str, argv: list[str], log: str) -> None:
    """In the forked process: output to the log, the script run as __main__ from the repository root."""
    handle = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    for fd in (1, 2):
        os.dup2(handle, fd)
    os.close(handle)
    # A process the forkserver started inherits its start method; the recipe gets the platform's own, as
    # in a new interpreter (else each DataLoader worker of a CUDA run starts through a forkserver: 26 s
    # before the first batch of a run on the H200, bench/RESULTS.md).
    multiprocessing.set_start_method(None, force=True)
    os.chdir(REPO)
    sys.argv = [script, *argv]
    runpy.run_path(script, run_name="__main__")  # its sys.exit(status) becomes the process's exit status


def wait_passing_stops(wait: Callable[[], T], stop: Callable[[int], None]) -> T:
    """wait() for a child, passing each SIGTERM or SIGINT this process gets on to it (`stop(signal)`); once the
    child has ended after one, this process stops too (exit status 128 + the signal). Without it a benchmark
    stopped by SIGTERM (a scheduler, `timeout`) left its recipe training on alone (its forked children are not
    in its process group's reach either when the signal is sent to it alone)."""
    received: list[int] = []

    def pass_on(signum, _frame) -> None:
        received.append(signum)
        stop(signum)

    previous = {s: signal.signal(s, pass_on) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        result = wait()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    if received:
        raise SystemExit(128 + received[0])
    return result


def signal_process(pid: int) -> Callable[[int], None]:
    """stop() for wait_passing_stops: the signal, to process `pid` (gone already: nothing to do)."""

    def stop(signum: int) -> None:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    return stop


def run_script(script: Path, argv: list[str], log: Path, timeout_s: float | None = None) -> int | None:
    """Run `script` with `argv` in a forked process, its output in `log`; its exit status, or None when it was
    still running after `timeout_s` (then it is killed). A SIGTERM or SIGINT to this process reaches the script
    too (a recipe saves and stops within seconds), then ends this one."""
    context = _server()
    sys.stdout.flush()  # a forked child would otherwise write this process's pending output into its log
    sys.stderr.flush()
    process = context.Process(target=_child, args=(str(script), [str(a) for a in argv], str(log)))
    process.start()
    wait_passing_stops(lambda: process.join(timeout_s), signal_process(process.pid))
    if process.exitcode is None:
        process.kill()
        process.join()
        return None
    return process.exitcode
