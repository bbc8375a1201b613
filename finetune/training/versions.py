"""A voice's versions folder: numbered model versions, the current voice, the history, the rounds' folders.

    VOICES/current/          the voice in use: the default starting model of the next round
    VOICES/v000/             the model the first round started from (copied once)
    VOICES/v001/, v002/ ...  one per accepted round
    VOICES/history.json      every round (accepted or not) and every rollback, with scores
    VOICES/rounds/round_NNN/ a round's run folder: checkpoints, logs, listen/, feedback_report.*

Rolling back copies a version into current/ file by file, so current/ is then byte for byte that version. A
round killed while making a version leaves nothing the next start does not put right (repair).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from finetune.data.corrections import FeedbackError
from finetune.system.atomic import recover, replace_dir, staging_dir, write_text_atomic

HISTORY = "history.json"


def listing(folder: Path) -> list[tuple[str, int, int]]:
    """(relative path, size, modification time) of every file: copies made with copytree keep the last two."""
    if not folder.is_dir():
        return []
    return sorted(
        (p.relative_to(folder).as_posix(), p.stat().st_size, p.stat().st_mtime_ns)
        for p in folder.rglob("*")
        if p.is_file()
    )


class Versions:
    """The versions folder: numbered model versions, the current voice, the history, round folders."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def current(self) -> Path:
        return self.root / "current"

    def history(self) -> dict:
        path = self.root / HISTORY
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"current": None, "events": []}

    def versions(self) -> list[str]:
        return sorted(p.name for p in self.root.glob("v[0-9][0-9][0-9]") if p.is_dir())

    def _record(self, event: dict, current: str | None = None) -> None:
        history = self.history()
        history["events"].append({"time": time.strftime("%Y-%m-%d %H:%M:%S"), **event})
        if current is not None:
            history["current"] = current
        self.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.root / HISTORY, json.dumps(history, indent=2, ensure_ascii=False) + "\n")

    def repair(self) -> list[str]:
        """Undo what a round killed while making a version left (run before anything else): an unfinished
        folder swap is rolled back, a version folder the history never recorded is removed, and current/
        is made the version the history names again. Returns what was done."""
        if not self.root.is_dir():
            return []
        notes = recover(self.root)
        history = self.history()
        recorded = {e.get("version") for e in history["events"] if e.get("event") in ("base", "accepted")}
        for name in self.versions():
            if name not in recorded:
                shutil.rmtree(self.root / name)
                notes.append(f"removed {name}, a version whose round did not finish making it")
        named = history.get("current")
        if named in self.versions() and listing(self.current) != listing(self.root / named):
            self._copy_model(self.root / named, self.current)
            notes.append(f"current/ restored to {named}, the version the history names")
        return notes

    def new_round_dir(self) -> Path:
        rounds = self.root / "rounds"
        rounds.mkdir(parents=True, exist_ok=True)
        number = 1 + max([int(p.name.split("_")[1]) for p in rounds.glob("round_[0-9]*")] or [0])
        folder = rounds / f"round_{number:03d}"
        folder.mkdir()
        return folder

    def _copy_model(self, source: Path, target: Path) -> None:
        staging = staging_dir(target)
        shutil.rmtree(staging)
        shutil.copytree(source, staging)
        replace_dir(staging, target)

    def ensure_base(self, base_dir: Path) -> None:
        """Before the first round: the starting model becomes v000 and current/."""
        if not self.versions():
            self._copy_model(base_dir, self.root / "v000")
            self._copy_model(base_dir, self.current)
            self._record({"event": "base", "version": "v000", "from": str(base_dir)}, current="v000")

    def accept(self, model_dir: Path, round_name: str, report: dict) -> str:
        name = f"v{len(self.versions()):03d}"
        self._copy_model(model_dir, self.root / name)
        self._copy_model(self.root / name, self.current)
        self._record(
            {
                "event": "accepted",
                "round": round_name,
                "version": name,
                "base_version": self.history().get("current"),
                **report,
            },
            current=name,
        )
        return name

    def parent(self, version: str) -> str | None:
        """The version the round that made `version` started from (v000 has none)."""
        for event in reversed(self.history()["events"]):
            if event.get("event") == "accepted" and event.get("version") == version and event.get("base_version"):
                return event["base_version"]
        versions = self.versions()  # histories written before base_version was recorded: number order
        return versions[versions.index(version) - 1] if version in versions and versions.index(version) > 0 else None

    def reject(self, round_name: str, report: dict) -> None:
        self._record({"event": "rejected", "round": round_name, **report})

    def rollback(self, target: str) -> tuple[str, str]:
        """Make `target` current: a version name, or "previous": the version the current one was trained
        from (so repeated "previous" walks back along the accepted rounds). Returns (from, to)."""
        history, versions = self.history(), self.versions()
        current = history.get("current")
        if target == "previous":
            parent = self.parent(current) if current in versions else None
            if parent is None:
                raise FeedbackError(
                    f"no version before {current or 'nothing'} to roll back to; versions: "
                    f"{', '.join(versions) or 'none'}"
                )
            target = parent
        if target not in versions:
            raise FeedbackError(f"--rollback {target}: no such version; versions: {', '.join(versions) or 'none'}")
        self._copy_model(self.root / target, self.current)
        self._record({"event": "rollback", "from": current, "to": target}, current=target)
        return str(current), target
