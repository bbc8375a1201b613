"""One run per folder: a lock file (`run.lock`) that says who holds the folder.

Two runs writing one --checkpoint_dir destroy each other's work: a starting run's cleanup deletes the
other's unfinished saves, and checkpoint rotation deletes what the other resumes from. So the first
process to start takes the folder; a second is refused at once with a message naming the first.

The lock is an exclusive `flock` on run.lock, held for the life of the process: the kernel releases it
when the process ends in any way (a SIGKILL, a crash, a power cut), so a lock left behind by a dead
process is simply taken over, and the next run says whose it was. The file's text (process id, host,
start time, command line) is what the refusal quotes. flock works on local file systems and on NFS
(Linux emulates it with POSIX locks there). In a data-parallel run only the launcher's main process
takes the lock; the other ranks belong to the same run.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from finetune.system.errors import ToolError

LOCK_NAME = "run.lock"
_HELD: dict[Path, "RunLock"] = {}  # this process's locks: a run started again in-process (tests) reuses its own


class FolderBusy(ToolError):
    """Another live run holds the folder; the message names it and says what to do."""


@dataclass
class Holder:
    pid: int
    host: str
    started: str  # UTC, ISO 8601
    command: str

    @staticmethod
    def this_process() -> "Holder":
        return Holder(
            os.getpid(),
            socket.gethostname(),
            time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
        )

    def describe(self) -> str:
        return f"process {self.pid} on {self.host}, started {self.started} ({self.command})"


def read_holder(path: Path) -> Holder | None:
    try:
        return Holder(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None  # empty (killed while writing it) or not ours


class RunLock:
    """Holds `folder/run.lock` until release() or the end of the process."""

    def __init__(self, folder: Path, flag: str = "--checkpoint_dir", lock_file: Path | None = None):
        """`lock_file` defaults to folder/run.lock; a folder that is swapped whole (an output folder) is
        guarded by a file beside it instead (output_lock)."""
        self.folder, self.flag = Path(folder), flag
        self.path = Path(lock_file) if lock_file is not None else self.folder / LOCK_NAME
        self.handle = None
        self.previous: Holder | None = None  # the dead holder whose lock was taken over, if any

    def acquire(self) -> "RunLock":
        """Take the lock, or raise FolderBusy naming the process that has it."""
        import fcntl

        key = self.path.resolve()
        if key in _HELD and _HELD[key].handle is not None:
            return _HELD[key]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            handle = open(self.path, "a+", encoding="utf-8")
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                handle.close()
                raise FolderBusy(self.busy_message()) from None
            # The holder before us may have deleted the file between our open and our flock: then we hold
            # a lock on a file no one else can see. Only a lock on the file at the path counts.
            if self.path.exists() and os.fstat(handle.fileno()).st_ino == os.stat(self.path).st_ino:
                break
            handle.close()
        self.previous = read_holder(self.path)
        handle.seek(0)
        handle.truncate()
        try:
            handle.write(json.dumps(asdict(Holder.this_process())) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        except OSError:
            pass  # a full disk: the lock holds all the same; a second run is refused without our name
        self.handle = handle
        _HELD[key] = self
        atexit.register(self.release)
        return self

    def busy_message(self) -> str:
        holder = read_holder(self.path)
        who = holder.describe() if holder else "a process that has not yet written its name"
        stop = f" or stop it (kill {holder.pid})" if holder and holder.host == socket.gethostname() else ""
        return (
            f"another run holds {self.folder}: {who}. Wait for it to finish{stop}, or give this run another {self.flag}"
        )

    def took_over(self) -> str | None:
        """A sentence for the log when the lock was left by a process that is gone."""
        if self.previous is None or self.previous.pid == os.getpid():
            return None
        return f"took over {self.path.name} left by {self.previous.describe()}, which is no longer running"

    def release(self) -> None:
        if self.handle is None:
            return
        self.path.unlink(missing_ok=True)  # before unlocking: a waiting process then retries on a new file
        try:
            self.handle.close()
        except OSError:
            pass  # its name could not be written (a full disk); the lock goes with the file all the same
        self.handle = None
        _HELD.pop(self.path.resolve(), None)


def hold_for_launch(folder: str | Path, flag: str = "--checkpoint_dir") -> RunLock | None:
    """A recipe's lock on its folder, taken right after its flags are read (before torch is imported, so a
    second run is refused within seconds). Under torchrun only rank 0 takes it: the other ranks are part of
    its run."""
    if os.environ.get("RANK", "0") != "0":
        return None
    return RunLock(Path(folder), flag).acquire()


def output_lock(output_dir: str | Path) -> RunLock:
    """The lock of a run's output folder (--output_dir): a file beside it, since the folder itself is
    swapped whole when a model is published. Two runs with their own checkpoint folders must not publish
    into (and clean up after a killed process in) one output folder at once."""
    output = Path(output_dir)
    return RunLock(output, "--output_dir", lock_file=output.parent / f".{output.name}.lock")
