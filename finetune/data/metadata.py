"""A prepared corpus's lists: `metadata.csv` and `metadata_val.csv`, one clip a line, written atomically and read
without loading any audio (so a recipe's flags can be checked, and a corpus's speakers counted, before torch is imported).

    id|text            one speaker (the speaker is "")
    id|speaker|text    several speakers (every line so)
"""

from __future__ import annotations

from pathlib import Path

from finetune.system.atomic import write_text_atomic
from finetune.system.errors import ToolError

WAV_HEADER_BYTES = 44  # a prepared clip's WAV header: 16-bit mono PCM, so hours follow from the file sizes


class CorpusError(ToolError):
    """The prepared folder cannot be used as it is; the message says what to run."""


def read_rows(path: Path) -> list[tuple[str, str, str]]:
    """(id, speaker, text) of each line: `id|speaker|text` (a multi-speaker corpus, every line so) or
    `id|text` (one speaker: ""). A line without '|' is a CorpusError naming the line."""
    split = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        parts = line.split("|", 2)
        if len(parts) < 2:
            raise CorpusError(f"{path}:{number}: expected 'id|text' or 'id|speaker|text', found {line[:60]!r}")
        split.append(parts)
    if split and all(len(parts) == 3 for parts in split):
        return [(item_id, speaker, text) for item_id, speaker, text in split]
    return [(parts[0], "", "|".join(parts[1:])) for parts in split]


def read_metadata(path: Path) -> list[tuple[str, str]]:
    """(id, text) of each line of a metadata file (either layout: read_rows)."""
    return [(item_id, text) for item_id, _, text in read_rows(path)]


def texts_of(data_dir: Path) -> dict[str, str]:
    """Clip id -> text of a prepared folder's lists (training and held-out, those there are)."""
    names = [name for name in ("metadata.csv", "metadata_val.csv") if (data_dir / name).is_file()]
    return {item: text for name in names for item, text in read_metadata(data_dir / name)}


def write_metadata(path: Path, rows: list[tuple[str, str, str]], with_speakers: bool) -> None:
    """`id|text` lines, or `id|speaker|text` (Piper's multi-speaker layout) when `with_speakers`."""
    lines = (f"{i}|{speaker}|{text}\n" if with_speakers else f"{i}|{text}\n" for i, speaker, text in rows)
    write_text_atomic(path, "".join(lines))
