"""Corpus sources for preparation: each yields SourceItems (id, raw text, audio path or bytes).

- an LJSpeech-style folder: `metadata.csv` (`id|text` or `id|raw|normalised`) and `wavs/<id>.<ext>`;
- a folder of pairs, as a recording app writes corrections: `<name>.<audio ext>` + `<name>.txt`;
- a Hugging Face `datasets` dataset: a hub id, a `save_to_disk` folder, or a downloaded hub snapshot;
- an audiofolder (audio files + metadata.csv/.jsonl with a `file_name` column, at the top or in a split
  folder), read directly: building it with `datasets` needs torchcodec to encode the audio;
- a CSV/TSV/JSONL manifest with an audio-path column and a text column (Common Voice's TSVs work).

Audio is never decoded here (and never through torchcodec): dataset audio columns are cast to
`Audio(decode=False)` and hand over their encoded bytes or path; workers decode them with soundfile.
A wrong source (missing folder, unknown column, unknown speaker) raises SourceError with what exists.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from finetune.system.errors import ToolError

AUDIO_EXTENSIONS = (".wav", ".flac", ".mp3", ".ogg", ".opus", ".oga")
AUDIO_COLUMN_GUESSES = ("audio", "file_name", "path", "file", "filename", "audio_path", "wav", "audio_filepath")
TEXT_COLUMN_GUESSES = ("sentence", "text", "transcription", "normalized_text", "transcript", "raw_text")


class SourceError(ToolError):
    """The source itself is wrong (not one item of it); the message says what exists and which flag fixes it."""


@dataclass(frozen=True)
class SourceItem:
    item_id: str
    text: str
    audio_path: str | None = None  # a file to decode
    audio_bytes: bytes | None = None  # encoded audio in memory (datasets); preferred over the path
    problem: tuple[str, str] | None = None  # (drop reason, detail) when the source already knows it is unusable
    speaker: str = ""  # who recorded it ("": one speaker, or unknown)

    def audio_signature(self) -> str:
        """What identifies this clip's audio, cheaply: a hash of the bytes, or path + size + mtime.
        Preparation reuses earlier work only when this is unchanged."""
        if self.audio_bytes is not None:
            return "bytes:" + hashlib.blake2b(self.audio_bytes, digest_size=16).hexdigest()
        try:
            stat = os.stat(self.audio_path or "")
        except OSError:
            return "missing"
        return f"file:{os.path.abspath(self.audio_path)}:{stat.st_size}:{stat.st_mtime_ns}"


@dataclass
class Source:
    description: str
    count: int  # items that will be yielded
    iterate: Callable[[], Iterator[SourceItem]]
    notes: dict = field(default_factory=dict)  # e.g. which speaker was kept, for the report


def safe_id(raw: str) -> str:
    """A file-name-safe id: 'clips/common_voice 1.mp3' -> 'clips_common_voice_1'."""
    stem = re.sub(r"\.(wav|flac|mp3|ogg|opus|oga)$", "", raw.strip(), flags=re.IGNORECASE)
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", stem).strip("._") or "item"


def pick_column(columns: list[str], wanted: str | None, guesses: tuple[str, ...], flag: str, what: str) -> str:
    if wanted:
        if wanted not in columns:
            raise SourceError(f"{flag} {wanted!r} is not a column; the columns are: {', '.join(columns)}")
        return wanted
    for guess in guesses:
        if guess in columns:
            return guess
    raise SourceError(
        f"no {what} column found (tried {', '.join(guesses)}); the columns are: "
        f"{', '.join(columns)}. Name it with {flag}"
    )


SPEAKER_COLUMN_GUESSES = ("client_id", "speaker_id", "speaker")  # Common Voice's first


def find_speaker_column(columns: list[str], wanted: str | None) -> str | None:
    """--speaker_column as given (checked), else a column named like one (Common Voice's client_id), else None."""
    if wanted:
        return pick_column(columns, wanted, (), "--speaker_column", "speaker")
    return next((c for c in SPEAKER_COLUMN_GUESSES if c in columns), None)


def speaker_rows(values: list, speaker: str | None, column: str) -> tuple[list[int], dict]:
    """Which rows to keep (all, or only `speaker`'s) and the note for the report."""
    values = [str(v) for v in values]
    if speaker is None:
        counts = Counter(values)
        return list(range(len(values))), {"column": column, "speakers": len(counts)}
    chosen, clips = choose_speaker(values, speaker, column)
    return [i for i, v in enumerate(values) if v == chosen], {"column": column, "speaker": chosen, "clips": clips}


def choose_speaker(values: list, speaker: str, column: str) -> tuple[str, int]:
    """The speaker asked for, checked. Returns (speaker, clips)."""
    counts = Counter(str(v) for v in values)
    if speaker not in counts:
        top = ", ".join(f"{s!r} ({n} clips)" for s, n in counts.most_common(5))
        raise SourceError(f"--speaker {speaker!r} is not in column {column!r}; the speakers with most clips: {top}")
    return speaker, counts[speaker]


# ---------------------------------------------------------------- LJSpeech folder


def find_audio_file(wav_dir: Path, name: str) -> Path:
    """wavs/<name> if it has an extension and exists, else wavs/<name>.<ext> for the first ext found;
    the .wav path when nothing exists (so the item is reported as a missing file)."""
    direct = wav_dir / name
    if direct.suffix.lower() in AUDIO_EXTENSIONS and direct.is_file():
        return direct
    for ext in AUDIO_EXTENSIONS:
        candidate = wav_dir / f"{name}{ext}"
        if candidate.is_file():
            return candidate
    return wav_dir / f"{name}.wav"


def ljspeech_source(input_dir: str | Path, max_samples: int = 0, flag: str = "--input_dir") -> Source:
    """`flag` is the option that named the folder, for the messages."""
    folder = Path(input_dir)
    metadata = folder / "metadata.csv"
    if not folder.is_dir():
        raise SourceError(f"{flag} {input_dir}: no such folder")
    if not metadata.is_file():
        raise SourceError(
            f"{flag} {input_dir}: no metadata.csv (expected an LJSpeech layout: "
            "metadata.csv with id|text lines and wavs/<id>.wav)"
        )
    rows = []
    for line in metadata.read_text(encoding="utf-8-sig").splitlines():
        if not line.strip():
            continue
        parts = line.split("|")
        # id|raw|normalised (LJSpeech proper): the normalised column has numbers written out.
        text = parts[2] if len(parts) >= 3 and parts[2].strip() else (parts[1] if len(parts) >= 2 else "")
        rows.append((parts[0].strip(), text))
    if max_samples:
        rows = rows[:max_samples]

    def iterate() -> Iterator[SourceItem]:
        for name, text in rows:
            path = find_audio_file(folder / "wavs", name)
            yield SourceItem(item_id=safe_id(name), text=text, audio_path=str(path))

    return Source(description=f"LJSpeech folder {folder}", count=len(rows), iterate=iterate)


# ---------------------------------------------------------------- pairs of audio + text


def looks_like_pairs(folder: Path) -> bool:
    return folder.is_dir() and any(p.suffix.lower() in (*AUDIO_EXTENSIONS, ".txt") for p in folder.iterdir())


def pairs_source(folder: str | Path, flag: str) -> Source:
    """Each `<name>.<audio ext>` with its `<name>.txt` (the text, UTF-8, one line or several) in `folder`.
    An audio file without its text, or a text without its audio, is an item that will be dropped by name
    (missing_text, missing_file); an empty text is dropped as empty_text."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SourceError(f"{flag} {folder}: no such folder")
    audio = {p.stem: p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix.lower() in AUDIO_EXTENSIONS}
    texts = {p.stem: p for p in sorted(folder.iterdir()) if p.is_file() and p.suffix.lower() == ".txt"}
    names = sorted(set(audio) | set(texts))

    def iterate() -> Iterator[SourceItem]:
        for name in names:
            text = " ".join(texts[name].read_text(encoding="utf-8-sig").split()) if name in texts else ""
            problem = None if name in texts else ("missing_text", f"no {name}.txt beside {audio[name].name}")
            path = audio.get(name, folder / f"{name}.wav")  # a missing file is reported as missing_file
            yield SourceItem(item_id=safe_id(name), text=text, audio_path=str(path), problem=problem)

    return Source(description=f"folder of audio + .txt pairs {folder}", count=len(names), iterate=iterate)


# ---------------------------------------------------------------- CSV / TSV manifest


def resolve_manifest_path(base: Path, value: str) -> str:
    """Audio paths in a manifest are relative to its folder; Common Voice keeps clips in clips/."""
    path = Path(value)
    if path.is_absolute():
        return str(path)
    for candidate in (base / path, base / "clips" / path):
        if candidate.is_file():
            return str(candidate)
    return str(base / path)


def read_manifest(manifest: Path) -> tuple[list[str], list[dict]]:
    """Columns and rows of a .csv, .tsv or .jsonl manifest."""
    if manifest.suffix.lower() == ".jsonl":
        lines = manifest.read_text(encoding="utf-8-sig").splitlines()
        try:
            rows = [json.loads(line) for line in lines if line.strip()]
        except ValueError as error:
            raise SourceError(f"{manifest}: not valid JSON lines ({error})") from error
        columns = list(dict.fromkeys(key for row in rows for key in row))
        return columns, [{k: "" if v is None else str(v) for k, v in row.items()} for row in rows]
    delimiter = "\t" if manifest.suffix.lower() == ".tsv" else ","
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL  # CV's TSVs hold bare quotes
    with open(manifest, encoding="utf-8-sig", newline="") as handle:
        reader = csv.DictReader(handle, delimiter=delimiter, quoting=quoting)
        return list(reader.fieldnames or []), list(reader)


def looks_like_ljspeech(folder: Path) -> bool:
    """A wavs/ folder beside a headerless `id|text` metadata.csv."""
    metadata = folder / "metadata.csv"
    if not (metadata.is_file() and (folder / "wavs").is_dir()):
        return False
    with open(metadata, encoding="utf-8", errors="replace") as handle:
        first = handle.readline()
    return "|" in first and "file_name" not in first


def audiofolder_manifest(folder: Path, split: str) -> Path | None:
    """The metadata file of an audiofolder: DIR/metadata.* or DIR/<split>/metadata.*."""
    for base in (folder, folder / split):
        for name in ("metadata.csv", "metadata.jsonl", "metadata.tsv"):
            if (base / name).is_file():
                return base / name
    return None


def manifest_source(
    path: str | Path,
    audio_column: str | None,
    text_column: str | None,
    id_column: str | None,
    speaker_column: str | None,
    speaker: str | None,
    max_samples: int = 0,
) -> Source:
    manifest = Path(path)
    columns, rows = read_manifest(manifest)
    audio_col = pick_column(columns, audio_column, AUDIO_COLUMN_GUESSES, "--audio_column", "audio path")
    text_col = pick_column(columns, text_column, TEXT_COLUMN_GUESSES, "--text_column", "text")
    if id_column:
        pick_column(columns, id_column, (), "--id_column", "id")
    notes = {}
    speaker_col = find_speaker_column(columns, speaker_column)
    if speaker and not speaker_col:
        raise SourceError(
            f"--speaker {speaker!r}: {manifest} has no speaker column; name it with --speaker_column "
            f"(its columns: {', '.join(columns)})"
        )
    if speaker_col:
        keep, notes["speaker"] = speaker_rows([r[speaker_col] for r in rows], speaker, speaker_col)
        rows = [rows[i] for i in keep]
    if max_samples:
        rows = rows[:max_samples]

    def iterate() -> Iterator[SourceItem]:
        for row in rows:
            audio = resolve_manifest_path(manifest.parent, row[audio_col] or "")
            item_id = safe_id(row[id_column] if id_column else row[audio_col] or "item")
            yield SourceItem(
                item_id=item_id,
                text=row[text_col] or "",
                audio_path=audio,
                speaker=str(row[speaker_col]) if speaker_col else "",
            )

    description = f"manifest {manifest} (audio: {audio_col}, text: {text_col})"
    return Source(description=description, count=len(rows), iterate=iterate, notes=notes)


# ---------------------------------------------------------------- Hugging Face datasets


def is_saved_dataset(folder: Path) -> bool:
    return (folder / "dataset_dict.json").is_file() or (folder / "state.json").is_file()


def load_any_dataset(spec: str, split: str):
    """A Dataset from a save_to_disk folder, a downloaded hub snapshot, or a hub id; `split` picks from a
    DatasetDict."""
    import datasets

    folder = Path(spec).expanduser()
    if folder.is_dir() and is_saved_dataset(folder):
        loaded = datasets.load_from_disk(str(folder))
    elif folder.is_dir():  # a downloaded hub snapshot (parquet / arrow / csv files), as `hf download` writes
        try:
            loaded = datasets.load_dataset(str(folder))
        except (ValueError, OSError, FileNotFoundError) as error:
            raise SourceError(
                f"--dataset {spec}: not a save_to_disk folder, an audiofolder, or a dataset snapshot "
                f"that datasets can read ({error})"
            ) from error
    elif folder.exists() or spec.startswith((".", "/", "~")):
        raise SourceError(f"--dataset {spec}: not a dataset folder, an audiofolder or a .csv/.tsv/.jsonl manifest")
    else:
        loaded = load_hub_dataset(spec)
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise SourceError(f"--split {split!r} is not in {spec}; its splits are: {', '.join(loaded)}")
        return loaded[split]
    return loaded


def load_hub_dataset(repo_id: str):
    """A hub dataset. The hub is probed first: offline, `datasets` retries for half a minute before
    failing. With HF_HUB_OFFLINE=1 a copy in the local cache is used without asking the hub."""
    import datasets

    from finetune.system.model_source import hub_reachable, offline_advice

    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    if not offline and not hub_reachable():
        raise SourceError(
            offline_advice("dataset", repo_id, "--dataset") + " (or, if it is in the local cache, set HF_HUB_OFFLINE=1)"
        )
    try:
        return datasets.load_dataset(repo_id, download_mode="reuse_dataset_if_exists")
    except (ConnectionError, OSError, ValueError) as error:
        raise SourceError(f"--dataset {repo_id}: cannot load it: {error}") from error


def audio_reference(value, base: Path | None) -> tuple[bytes | None, str | None]:
    """(bytes, path) from a dataset audio cell: an undecoded Audio dict or a path string."""
    if isinstance(value, dict):
        data, path = value.get("bytes"), value.get("path")
    else:
        data, path = None, value
    if data is None and path and base is not None and not os.path.isabs(path):
        path = str(base / path)
    return data, path


def dataset_source(
    spec: str,
    split: str,
    audio_column: str | None,
    text_column: str | None,
    id_column: str | None,
    speaker_column: str | None,
    speaker: str | None,
    max_samples: int = 0,
) -> Source:
    import datasets

    dataset = load_any_dataset(spec, split)
    columns = list(dataset.column_names)
    audio_col = pick_column(columns, audio_column, AUDIO_COLUMN_GUESSES, "--audio_column", "audio")
    text_col = pick_column(columns, text_column, TEXT_COLUMN_GUESSES, "--text_column", "text")
    if id_column:
        pick_column(columns, id_column, (), "--id_column", "id")
    if isinstance(dataset.features[audio_col], datasets.Audio):
        dataset = dataset.cast_column(audio_col, datasets.Audio(decode=False))  # bytes, never torchcodec
    notes = {}
    speaker_col = find_speaker_column(columns, speaker_column)
    if speaker and not speaker_col:
        raise SourceError(
            f"--speaker {speaker!r}: {spec} has no speaker column; name it with --speaker_column "
            f"(its columns: {', '.join(columns)})"
        )
    if speaker_col:
        keep, notes["speaker"] = speaker_rows(dataset[speaker_col], speaker, speaker_col)
        if len(keep) < len(dataset):
            dataset = dataset.select(keep)
    if max_samples:
        dataset = dataset.select(range(min(max_samples, len(dataset))))
    base = Path(spec) if Path(spec).is_dir() else None
    wanted = [c for c in dict.fromkeys([audio_col, text_col, id_column, speaker_col]) if c]
    dataset = dataset.select_columns(wanted)

    def iterate() -> Iterator[SourceItem]:
        for index, row in enumerate(dataset):
            data, path = audio_reference(row[audio_col], base)
            raw_id = str(row[id_column]) if id_column else (Path(path).name if path else f"{split}_{index:06d}")
            yield SourceItem(
                item_id=safe_id(raw_id),
                text=str(row[text_col] or ""),
                audio_bytes=data,
                audio_path=path,
                speaker=str(row[speaker_col]) if speaker_col else "",
            )

    description = f"dataset {spec} split {split} (audio: {audio_col}, text: {text_col})"
    return Source(description=description, count=len(dataset), iterate=iterate, notes=notes)


COLUMN_FLAGS = ("audio_column", "text_column", "id_column", "speaker_column", "speaker")


def refuse_column_flags(options: dict, what: str) -> None:
    """Column and speaker flags mean nothing to an LJSpeech folder: refuse them rather than ignore them."""
    given = [f"--{name}" for name in COLUMN_FLAGS if options.get(name)]
    if given:
        raise SourceError(
            f"{what} (id|text lines, one speaker): {', '.join(given)} only apply to datasets and "
            "manifests; leave them out, or give only the clips you want in metadata.csv"
        )


def open_source(input_dir: str | None, dataset: str | None, **options) -> Source:
    """The source the flags name: --input_dir (LJSpeech) or --dataset (datasets / manifest)."""
    if input_dir:
        refuse_column_flags(options, f"--input_dir {input_dir} is an LJSpeech folder")
        return ljspeech_source(input_dir, max_samples=options.get("max_samples", 0))
    spec = str(dataset)
    split = options.pop("split")
    if Path(spec).suffix.lower() in (".csv", ".tsv", ".jsonl"):
        if not Path(spec).is_file():
            raise SourceError(f"--dataset {spec}: no such manifest file")
        return manifest_source(spec, **options)
    folder = Path(spec).expanduser()
    if looks_like_ljspeech(folder):  # what --input_dir reads; taking it here too saves a round trip
        refuse_column_flags(options, f"--dataset {spec} is an LJSpeech folder")
        return ljspeech_source(str(folder), max_samples=options.get("max_samples", 0), flag="--dataset")
    if folder.is_dir() and not is_saved_dataset(folder):
        manifest = audiofolder_manifest(folder, split)
        if manifest is not None:
            return manifest_source(manifest, **options)
    return dataset_source(spec, split, **options)
