"""A voice's versions folder: numbered model versions, the current voice, the history, the rounds' folders.

    VOICES/current/          the voice in use: the default starting model of the next round
    VOICES/v000/             the model the first round started from (copied once)
    VOICES/v001/, v002/ ...  one per accepted round
    VOICES/history.json      every round (accepted or not) and every rollback, with scores; the sentences held
                             out of every round so far (a correction held out once is never trained on later);
                             the folder the user's app loads (the training run's output folder)
    VOICES/app_copies/vNNN/  what the app's folder held when an accepted round replaced it while vNNN was current
    VOICES/rounds/round_NNN/ a round's run folder: checkpoints, logs, listen/, feedback_report.*

An accepted round's version becomes current/ and the app's folder; rolling back copies a version into current/
file by file (current/ is then byte for byte that version) and into the app's folder (what it held under that
version, when a round replaced it). A round killed while making a version leaves nothing the next start does not
put right (repair).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from finetune.feedback.corrections import FeedbackError
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
        app = self.app_folder
        if app is not None:
            notes += [f"{app}: {note}" for note in recover(app.parent, only=app.name)]
        removed = [note for note in notes if note.startswith("removed v")]
        if app is not None and removed and named in self.versions():
            # the killed round may have published its version to the app: what the app loads follows the history
            # (only then: the app's folder may hold a voice trained since, which is the user's, not a round's)
            kept = self.root / "app_copies" / named
            if app.is_dir() and listing(app) not in (listing(self.root / named), listing(kept)):
                self._restore_app(named)
                notes.append(f"{app} restored to {named}, the version the history names")
        return notes

    def held_out_sentences(self) -> set[str]:
        """The sentences (corrections.sentence_key) this voice's rounds have held out: held out again, never trained."""
        return set(self.history().get("held_out", []))

    def hold_out_sentences(self, keys: set[str]) -> None:
        """Record sentences held out of a round (before it trains: a killed round's held-out ones stay held out)."""
        history = self.history()
        known = set(history.get("held_out", []))
        if keys <= known:
            return
        history["held_out"] = sorted(known | keys)
        self.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.root / HISTORY, json.dumps(history, indent=2, ensure_ascii=False) + "\n")

    @property
    def app_folder(self) -> Path | None:
        """The folder the user's app loads, as the first round recorded it (None: none)."""
        named = self.history().get("app_model_dir")
        return Path(named) if named else None

    def set_app_folder(self, folder: Path | None) -> None:
        history = self.history()
        history["app_model_dir"] = str(folder) if folder is not None else None
        self.root.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.root / HISTORY, json.dumps(history, indent=2, ensure_ascii=False) + "\n")

    def publish_to_app(self, version: str) -> Path | None:
        """The version into the app's folder (atomically); what the folder held first kept in app_copies/ under
        the version that was current (restored when the voice is rolled back to it). None without an app folder."""
        app, current = self.app_folder, self.history().get("current")
        if app is None:
            return None
        if app.is_dir() and current and not (self.root / "app_copies" / current).is_dir():
            if listing(app) != listing(self.root / current):
                self._copy_model(app, self.root / "app_copies" / current)
        self._copy_model(self.root / version, app)
        return app

    def _restore_app(self, version: str) -> None:
        app = self.app_folder
        if app is None:
            return
        kept = self.root / "app_copies" / version
        self._copy_model(kept if kept.is_dir() else self.root / version, app)

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
        """The round's model as the next version: current/ and the app's folder (the previous one kept)."""
        name = f"v{len(self.versions()):03d}"
        self._copy_model(model_dir, self.root / name)
        self._copy_model(self.root / name, self.current)
        self.publish_to_app(name)
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
        self._restore_app(target)
        self._record({"event": "rollback", "from": current, "to": target}, current=target)
        return str(current), target
