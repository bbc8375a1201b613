"""Disk space: what a failed write looks like, how much room is left, and a sentence that says both.

A full disk does not raise one exception type. Measured on a full tmpfs (torch 2.x, safetensors 0.x,
soundfile 0.12): plain Python writes raise OSError(ENOSPC); `torch.save` raises RuntimeError
("[enforce fail at inline_container.cc] . unexpected pos N vs M", or "basic_ios::clear: iostream error",
or "PytorchStreamWriter failed writing file"); safetensors raises its own SafetensorError ("I/O error: No
space left on device (os error 28)"); soundfile raises LibsndfileError (a RuntimeError) naming no cause
at all; TensorBoard's writer thread raises OSError(ENOSPC) there and again at the next call. Each is
caught by what it is, never by catching every RuntimeError: a RuntimeError that is not a failed write
is a bug and must surface.
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path

from finetune.system.errors import ToolError

MB = 1024 * 1024


class DiskTooSmall(ToolError):
    """Not even one checkpoint (or model) fits on the disk; the message gives the figures and what to do."""


# Messages of the RuntimeErrors torch's and libsndfile's writers raise when the bytes do not reach the disk.
WRITE_FAILURE_MARKERS = (
    "unexpected pos",
    "basic_ios::clear",
    "iostream error",
    "file write failed",
    "PytorchStreamWriter failed",
    "No space left",
    "os error 28",
    "Error opening",
    "Write error",
    "error writing",
    "System error",
)
SPACE_MARKERS = ("No space left", "os error 28", "Disk quota exceeded", "os error 122")


def is_write_failure(error: BaseException) -> bool:
    """True for the errors a write raises when the file system refuses it (full, read-only, gone)."""
    if isinstance(error, OSError):
        return True
    if type(error).__name__ == "SafetensorError":  # safetensors' own type, not an OSError (see the docstring)
        return "I/O error" in str(error) or any(m in str(error) for m in SPACE_MARKERS)
    if isinstance(error, RuntimeError):
        return any(marker in str(error) for marker in WRITE_FAILURE_MARKERS)
    return False


def detached(error: BaseException) -> BaseException:
    """The error without its traceback, then a garbage collection. A failed torch.save leaves its file
    open in the frames the traceback holds: the temporary file is already unlinked, but its blocks stay
    taken until that handle closes (measured on tmpfs: 0.0 MB free after the failure, and a retry after
    deleting an older checkpoint failed again). Keep this, never the raised object, past the except."""
    import gc

    error.__context__ = error.__cause__ = None
    error = error.with_traceback(None)
    gc.collect()
    return error


def free_bytes(path: str | Path) -> int:
    """Bytes free for this process on the file system that holds `path` (or would, once created)."""
    path = Path(path).absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def looks_full(error: BaseException, folder: str | Path, needed_bytes: int = 0) -> bool:
    """Whether the failure is the disk being full: said so by the error, or little room left (torch's
    and libsndfile's messages never say why; the room left does)."""
    if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    if any(marker in str(error) for marker in SPACE_MARKERS):
        return True
    return free_bytes(folder) < max(needed_bytes, 1 * MB)


def mb(n_bytes: float) -> str:
    return f"{n_bytes / MB:.1f} MB"


def describe_failure(error: BaseException, folder: str | Path, what: str, needed_bytes: int) -> str:
    """One sentence: 'disk full in DIR: N MB free, WHAT needs M MB' or the error itself when it is not
    the disk being full (read-only, permissions)."""
    folder = Path(folder)
    if looks_full(error, folder, needed_bytes):
        need = f", {what} needs about {mb(needed_bytes)}" if needed_bytes else ""
        return f"disk full in {folder}: {mb(free_bytes(folder))} free{need}"
    if isinstance(error, OSError):
        code = errno.errorcode.get(error.errno or 0, "error")
        return f"cannot write in {folder}: {error.strerror or error} ({code})"
    return f"cannot write in {folder}: {type(error).__name__}: {str(error)[:160]}"


FREE_SPACE_FIX = "free space on that disk, or point --checkpoint_dir / --output_dir at a larger one"


class OptionalWrites:
    """Writes a run can do without (train.log lines, metrics, report.html, samples, TensorBoard): a failed
    one is skipped and said once per kind, in one line, and the run goes on; training matters more than
    its record. The next write of that kind is tried as usual (space may have been freed)."""

    def __init__(self):
        self.warned: set[str] = set()

    def failed(self, kind: str, folder: str | Path, error: BaseException, warn) -> None:
        if kind in self.warned:
            return
        self.warned.add(kind)
        warn(
            f"warning: {kind} not written: {describe_failure(error, folder, kind, 0)}; skipped until there is room "
            f"(training goes on). To keep them, {FREE_SPACE_FIX}"
        )


OPTIONAL = OptionalWrites()  # one per process: each kind is said once a run
