"""Writes that a deadline, a crash, a power cut or a full disk cannot leave half done.

Files are written to a temporary name in the same folder, flushed to the disk (fsync), then renamed over
the target (a rename within one filesystem is atomic), and the folder itself is flushed so the rename
survives a power cut. Folders are built under a temporary name, every file and the folder flushed, then
swapped in; the previous one is only deleted once the new one is in place and flushed. A folder swap is
two renames (old aside, new in). Every point a kill can land on leaves a complete folder somewhere, and
`recover` (run when a run starts) settles it:

    killed while building       the staging folder is deleted; the old folder is untouched
    between the two renames     the old folder is put back from its aside name; the staging folder deleted
    after the swap              the new folder is in place; the aside copy of the old one is deleted
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Callable


def _file_mode() -> int:
    """What a plain open() would give a new file under this process's umask (usually 0644): temporary
    files are created 0600 and would otherwise keep that after the rename."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


FILE_MODE = _file_mode()


def write_atomic(path: str | Path, write: Callable[[str], None], durable: bool = True) -> None:
    """Call `write(tmp_path)` to produce the file, then rename it to `path`. On any error the target is
    untouched and the temporary file removed. `durable` flushes to disk before the rename (checkpoints);
    files that a re-run can regenerate skip that cost."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, FILE_MODE)
        if durable:
            fsync_file(tmp)
        os.replace(tmp, path)
        if durable:
            fsync_dir(path.parent)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)  # a write that failed (a full disk) leaves no partial file behind


def fsync_file(path: str | Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def fsync_dir(folder: str | Path) -> None:
    """Flush a folder's entries (a rename or a new file in it) to the disk. Costs one disk flush."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """Every file under `folder`, then every folder, flushed: after this a power cut cannot lose them."""
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            fsync_file(path)
    for path in sorted((p for p in folder.rglob("*") if p.is_dir()), reverse=True):
        fsync_dir(path)
    fsync_dir(folder)


def write_text_atomic(path: str | Path, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w", encoding="utf-8") as handle:
            handle.write(text)

    write_atomic(path, write)


def torch_save_atomic(obj, path: str | Path) -> None:
    import torch

    write_atomic(path, lambda tmp: torch.save(obj, tmp))


def replace_dir(built: Path, target: Path) -> None:
    """Swap the fully written folder `built` in as `target`; the old target is removed only once the new
    one is on the disk. Files in it get ordinary permissions (libraries writing into it may leave
    temporary-file modes)."""
    for path in built.rglob("*"):
        if path.is_file():
            os.chmod(path, FILE_MODE)
    fsync_tree(built)
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old-{os.getpid()}")
        if old.exists():
            shutil.rmtree(old)
        os.replace(target, old)
        fsync_dir(target.parent)
    os.replace(built, target)
    fsync_dir(target.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def staging_dir(target: Path) -> Path:
    """An empty folder beside `target` to build its replacement in."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    return staging


LEFTOVER = re.compile(r"^\.(?P<name>.+?)(?:\.old-\d+|\.tmp-\d+|\.[^.]+\.tmp)$")


def recover(folder: Path, only: str | None = None) -> list[str]:
    """Undo what a process killed mid-write left in `folder` (for the target named `only`, if given): a
    folder set aside by an unfinished swap whose replacement never arrived is put back; unfinished
    temporary files and folders are deleted. Returns what was done, for the log. Only for folders one
    run writes at a time."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    done = []
    for path in sorted(folder.iterdir()):
        match = LEFTOVER.match(path.name)
        if not match or (only is not None and match["name"] != only):
            continue
        target = folder / match["name"]
        if ".old-" in path.name and path.is_dir() and not target.exists():
            os.replace(path, target)
            done.append(f"restored {target.name} from an unfinished swap")
        elif ".old-" in path.name:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
            done.append(f"removed {path.name}, the copy of {target.name} a finished swap had replaced")
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            done.append(f"removed unfinished {path.name}")
        else:
            path.unlink(missing_ok=True)
            done.append(f"removed unfinished {path.name}")
    return done
