"""Corpus preparation: source items -> 16 kHz mono PCM-16 WAVs, metadata files and a report.

Per item: the text is normalised in the main process (cheap; an item whose text fails is dropped
before its audio is read), then a worker decodes, resamples, trims, checks the length and writes the
WAV. Every dropped item is recorded with its reason. Results are cached in `.prepare_cache.json`
keyed by id, audio signature and audio settings, so a second run only redoes what changed.

Outputs in `data_dir`: wavs/<id>.wav here; metadata.csv (id|text, training), metadata_val.csv (held out),
quality.csv and prepare_report.json from what the Preparer kept (finetune/data/prepared_folder.py).
"""

from __future__ import annotations

import json
import multiprocessing
import sys
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import numpy as np

from finetune.data import audio, quality
from finetune.data.sources import Source, SourceItem
from finetune.data.text import TextNormalizer, describe_oov
from finetune.system.atomic import write_text_atomic
from finetune.system.disk import describe_failure, detached, is_write_failure
from finetune.system.errors import ToolError
from finetune.system.progress import Progress

CACHE_NAME = ".prepare_cache.json"
RESERVE_NAME = ".prepare_cache.reserve"  # room for the cache while the clips are written (Preparer.reserve_room)
RESERVE_BYTES_PER_CLIP = 512  # a cache entry is about 300 bytes (its id, signature, text, seconds, quality)
CACHE_VERSION = 1

# Reasons an item is dropped (keys in the report), with what each means.
DROP_REASONS = {
    "duplicate_id": "an earlier item has the same id",
    "empty_text": "no sayable text left after normalisation",
    "missing_text": "an audio file without its .txt (a pair needs both)",
    "out_of_vocabulary": "the text has letters or digits the model's vocabulary lacks",
    "missing_file": "the audio file does not exist",
    "unreadable_audio": "the audio could not be decoded (corrupt, empty or unsupported)",
    "silent_audio": "the audio is silent",
    "too_short": "shorter than --min_seconds after trimming",
    "too_long": "longer than --max_seconds after trimming",
    "failed": "processing raised an unexpected error (detail has it)",
}


@dataclass(frozen=True)
class ClipSettings:
    """How each clip is processed. Only `audio_signature` fields change the written audio."""

    sample_rate: int
    trim_db: float
    trim_margin_s: float
    peak: float
    min_seconds: float
    max_seconds: float

    def audio_signature(self) -> str:
        return f"sr={self.sample_rate};trim={self.trim_db};margin={self.trim_margin_s};peak={self.peak}"

    def length_problem(self, seconds: float) -> tuple[str, str] | None:
        if seconds < self.min_seconds:
            return "too_short", f"{seconds:.2f} s < --min_seconds {self.min_seconds}"
        if self.max_seconds and seconds > self.max_seconds:
            return "too_long", f"{seconds:.2f} s > --max_seconds {self.max_seconds}"
        return None


@dataclass(frozen=True)
class ClipJob:
    item_id: str
    audio_path: str | None
    audio_bytes: bytes | None
    out_path: str
    settings: ClipSettings


@dataclass
class ClipResult:
    item_id: str
    seconds: float | None = None  # processed length; None when the audio failed
    reason: str | None = None  # drop reason when it failed or its length is out of range
    detail: str = ""
    quality: dict = field(default_factory=dict)  # finetune/data/quality.py's measures of a kept clip


class NotWritten(ToolError):
    """A clip's WAV or a metadata file could not be written (a full disk, a read-only folder): not the clip's
    fault, so the preparation stops, keeping the finished clips, instead of marking every clip after it as
    failed."""


def write_clip(path: str, samples, sample_rate: int) -> None:
    """The WAV, or NotWritten saying why in one sentence (raised in a worker, read in the parent: a plain
    message, which pickles)."""
    try:
        audio.write_pcm16(path, samples, sample_rate)
        return
    except Exception as error:  # soundfile's LibsndfileError names no cause; is_write_failure tells
        if not is_write_failure(error):
            raise
        failure = error.with_traceback(None)
    # Out of the except block, the failed file's handle is closed (detached): deleting the part written then
    # really frees its room, enough for the cache of what is done to be saved.
    failure = detached(failure)
    Path(path).unlink(missing_ok=True)
    raise NotWritten(
        f"could not write {path}: {describe_failure(failure, Path(path).parent, 'a clip', 0)}. The "
        "clips finished so far are kept: free space (or give --data_dir on a larger disk) and run the "
        "same command again to continue"
    )


def process_clip(job: ClipJob) -> ClipResult:
    """Decode -> mono -> resample -> trim -> length check -> peak-normalise -> write. Runs in a worker."""
    settings = job.settings
    try:
        samples, rate = audio.decode(job.audio_bytes if job.audio_bytes is not None else (job.audio_path or ""))
        mono = audio.resample(audio.to_mono(samples), rate, settings.sample_rate)
        if float(abs(mono).max()) < audio.SILENCE_PEAK:
            return ClipResult(job.item_id, reason="silent_audio", detail="peak below -80 dBFS")
        trimmed = audio.trim_silence(mono, settings.sample_rate, settings.trim_db, settings.trim_margin_s)
        seconds = len(trimmed) / settings.sample_rate
        problem = settings.length_problem(seconds)
        if problem is not None:
            return ClipResult(job.item_id, seconds=seconds, reason=problem[0], detail=problem[1])
        write_clip(job.out_path, audio.peak_normalise(trimmed, settings.peak), settings.sample_rate)
        return ClipResult(job.item_id, seconds=seconds, quality=quality.measure(samples, trimmed, settings.sample_rate))
    except audio.AudioError as error:
        return ClipResult(job.item_id, reason=error.reason, detail=str(error))
    except NotWritten:
        raise  # the disk, not the clip: the preparation stops (Preparer.run keeps what was done)
    except Exception as error:  # a bad item must never stop the run: record it and go on
        return ClipResult(job.item_id, reason="failed", detail=f"{type(error).__name__}: {error}")


def measure_written(wav: Path) -> dict:
    """Quality of a WAV written earlier (its source's clipping is unknown there: None); {} if unreadable."""
    try:
        samples, rate = audio.decode(str(wav))
    except audio.AudioError:
        return {}
    return {**quality.measure(np.zeros(0), audio.to_mono(samples), rate), "clipping": None}


# ---------------------------------------------------------------- cache of earlier work


class PrepareCache:
    """id -> {audio signature, settings signature, seconds or failure}; JSON in the data folder."""

    def __init__(self, path: Path, entries: dict[str, dict]):
        self.path, self.entries = path, entries

    @classmethod
    def load(cls, data_dir: Path) -> "PrepareCache":
        path = data_dir / CACHE_NAME
        try:
            saved = json.loads(path.read_text(encoding="utf-8"))
            entries = saved["entries"] if saved.get("version") == CACHE_VERSION else {}
        except (OSError, ValueError, KeyError):
            entries = {}  # no cache, or an unreadable one: everything is processed again
        return cls(path, entries)

    def lookup(self, item: SourceItem, settings: ClipSettings) -> dict | None:
        entry = self.entries.get(item.item_id)
        if entry is None or entry["settings"] != settings.audio_signature():
            return None
        if entry["audio"] != item.audio_signature() or entry["audio"] == "missing":
            return None
        return entry

    def record(self, item_id: str, audio_sig: str, settings: ClipSettings, result: ClipResult) -> None:
        """Remember a result, except an unexpected failure ("failed"): its cause may be gone next time, so
        the clip is processed again rather than dropped again from memory."""
        if result.reason == "failed":
            self.entries.pop(item_id, None)
            return
        failed = result.seconds is None
        self.entries[item_id] = {
            "audio": audio_sig,
            "settings": settings.audio_signature(),
            "seconds": result.seconds,
            "reason": result.reason if failed else None,
            "detail": result.detail if failed else "",
            "quality": result.quality,
        }

    def save(self) -> None:
        write_text_atomic(self.path, json.dumps({"version": CACHE_VERSION, "entries": self.entries}))


# ---------------------------------------------------------------- the run


@dataclass
class Kept:
    text: str
    seconds: float
    speaker: str = ""
    quality: dict = field(default_factory=dict)


@dataclass
class Tally:
    """Everything the report needs, filled in as items finish."""

    kept: dict[str, Kept] = field(default_factory=dict)
    dropped: list[dict] = field(default_factory=list)
    oov_chars: Counter = field(default_factory=Counter)
    removed_chars: Counter = field(default_factory=Counter)
    reused: int = 0
    processed: int = 0

    def drop(self, item_id: str, reason: str, detail: str, text: str = "") -> None:
        entry = {"id": item_id, "reason": reason, "detail": detail}
        if text:
            entry["text"] = text
        self.dropped.append(entry)


# A pool's worker is a new interpreter that imports the audio stack and the caller's main module (a
# benchmark's imports torch: seconds of CPU) before its first clip; a clip takes milliseconds to tens of them.
POOL_MIN_CLIPS = 100


class Preparer:
    """Runs one preparation: `run(source)` fills `tally`; `write_outputs` writes metadata and the report."""

    def __init__(self, data_dir: Path, normalizer: TextNormalizer, settings: ClipSettings, num_workers: int):
        self.data_dir, self.normalizer, self.settings = data_dir, normalizer, settings
        self.num_workers = max(1, num_workers)
        self.wav_dir = data_dir / "wavs"
        self.wav_dir.mkdir(parents=True, exist_ok=True)
        self.cache = PrepareCache.load(data_dir)
        self.tally = Tally()
        self.texts: dict[str, str] = {}  # id -> normalised text, for items whose audio is in flight
        self.signatures: dict[str, str] = {}
        self.speakers: dict[str, str] = {}  # id -> speaker, for items that have one

    def wav_path(self, item_id: str) -> Path:
        return self.wav_dir / f"{item_id}.wav"

    def screen(self, items: Iterator[SourceItem]) -> Iterator[ClipJob | None]:
        """Check text and cache for each item; yield a job for audio work, or None when it is settled."""
        seen: set[str] = set()
        for item in items:
            if item.item_id in seen:
                self.tally.drop(item.item_id, "duplicate_id", DROP_REASONS["duplicate_id"], item.text)
                yield None
                continue
            seen.add(item.item_id)
            if item.speaker:
                self.speakers[item.item_id] = item.speaker
            if item.problem is not None:
                self.tally.drop(item.item_id, item.problem[0], item.problem[1], item.text)
                yield None
                continue
            if self.settle_text(item) or self.settle_from_cache(item):
                yield None
                continue
            self.signatures[item.item_id] = item.audio_signature()
            yield ClipJob(
                item.item_id, item.audio_path, item.audio_bytes, str(self.wav_path(item.item_id)), self.settings
            )

    def settle_text(self, item: SourceItem) -> bool:
        """Normalise the text; True when that already decides the item (dropped)."""
        check = self.normalizer(item.text)
        self.tally.removed_chars.update(check.removed)
        if check.oov:
            self.tally.oov_chars.update(check.oov)
            self.tally.drop(item.item_id, "out_of_vocabulary", describe_oov(check.oov), item.text)
            return True
        if not check.text:
            self.tally.drop(item.item_id, "empty_text", DROP_REASONS["empty_text"], item.text)
            return True
        self.texts[item.item_id] = check.text
        return False

    def settle_from_cache(self, item: SourceItem) -> bool:
        entry = self.cache.lookup(item, self.settings)
        if entry is None:
            return False
        if entry["seconds"] is None:
            self.finish(ClipResult(item.item_id, reason=entry["reason"], detail=entry["detail"]), reused=True)
            return True
        problem = self.settings.length_problem(entry["seconds"])
        if problem is None and not self.wav_path(item.item_id).is_file():
            return False  # was out of range before (not written), in range now: process it
        result = ClipResult(item.item_id, seconds=entry["seconds"], quality=entry.get("quality") or {})
        if problem is None and not result.quality:  # cached by an older version: measured from the WAV
            result.quality = measure_written(self.wav_path(item.item_id))
        if problem is not None:
            result.reason, result.detail = problem
        self.finish(result, reused=True)
        return True

    def finish(self, result: ClipResult, reused: bool = False) -> None:
        text = self.texts.pop(result.item_id, "")
        if reused:
            self.tally.reused += 1
        else:
            self.tally.processed += 1
            self.cache.record(result.item_id, self.signatures.pop(result.item_id), self.settings, result)
        if result.reason is None:
            self.tally.kept[result.item_id] = Kept(
                text, result.seconds or 0.0, self.speakers.get(result.item_id, ""), result.quality
            )
        else:
            self.tally.drop(result.item_id, result.reason, result.detail, text)

    def run(self, source: Source) -> Tally:
        progress = Progress("prepare", total=source.count, unit="clips")
        last_save = time.monotonic()
        reserve = self.reserve_room(source.count)
        try:
            for result in self.results(self.screen(source.iterate()), progress, source.count):
                self.finish(result)
                if time.monotonic() - last_save > 60:  # an interrupted run keeps most of its work
                    self.save_cache()
                    last_save = time.monotonic()
        finally:
            progress.close()
            if reserve is not None:
                reserve.unlink(missing_ok=True)  # the cache's room, kept from the start
            self.save_cache()
        return self.tally

    def reserve_room(self, clips: int) -> Path | None:
        """A file holding room for the cache (about RESERVE_BYTES_PER_CLIP a clip), made before the first
        clip and deleted just before the cache is saved: when the disk fills up with clips, the cache of
        what was done still fits, whatever the clips' sizes. None when even that does not fit."""
        path = self.data_dir / RESERVE_NAME
        size = min(max(64 * 1024, RESERVE_BYTES_PER_CLIP * clips), 32 * 2**20)
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
            with open(path, "wb") as out:
                out.write(b"\0" * size)
            return path
        except OSError:
            path.unlink(missing_ok=True)
            return None

    def save_cache(self) -> None:
        """The cache, unless the disk refuses it too (then the next run redoes those clips): never in
        place of the error that is already on its way."""
        try:
            self.cache.save()
        except OSError as error:
            print(
                f"warning: {self.cache.path} not written ({describe_failure(error, self.data_dir, 'it', 0)}): "
                "the next run processes those clips again",
                file=sys.stderr,
            )

    def results(self, jobs: Iterator[ClipJob | None], progress: Progress, count: int) -> Iterator[ClipResult]:
        """Run jobs in a pool, with a bounded number in flight; in this process with 1 worker or fewer than
        POOL_MIN_CLIPS clips (`count`), where starting the pool would cost more than it saves."""
        if self.num_workers == 1 or count < POOL_MIN_CLIPS:
            for job in jobs:
                if job is not None:
                    yield process_clip(job)
                progress.update()
            return
        context = multiprocessing.get_context("spawn")  # no fork: the parent may hold threads (arrow, tqdm)
        in_flight: set[Future] = set()
        with ProcessPoolExecutor(self.num_workers, mp_context=context) as pool:
            try:
                for job in jobs:
                    if job is None:
                        progress.update()
                        continue
                    in_flight.add(pool.submit(process_clip, job))
                    if len(in_flight) >= 8 * self.num_workers:  # bounds memory held by queued audio bytes
                        yield from self.drain(in_flight, progress, FIRST_COMPLETED)
                yield from self.drain(in_flight, progress, None)
            except BaseException:
                pool.shutdown(wait=False, cancel_futures=True)
                raise

    @staticmethod
    def drain(in_flight: set[Future], progress: Progress, until) -> Iterator[ClipResult]:
        done, pending = wait(in_flight, return_when=until) if until else (set(in_flight), set())
        if until is None:
            wait(done)
        in_flight.clear()
        in_flight.update(pending)
        for future in done:
            progress.update()
            yield future.result()
