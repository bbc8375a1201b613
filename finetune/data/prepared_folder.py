"""What a prepared corpus folder holds beside its WAVs, written once its clips are (finetune/data/prepare.py):
the quality limits applied, metadata.csv and metadata_val.csv (the held-out split, finetune/data/held_out.py),
quality.csv (each clip's measures) and prepare_report.json (counts, hours, speakers, every drop and why). Its
page, prepare_report.html, is the reporting layer's (finetune/reporting/prepare_page.py).
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np

from finetune.data import quality
from finetune.data.held_out import split_by_speaker
from finetune.data.metadata import write_metadata
from finetune.data.prepare import DROP_REASONS, NotWritten, Tally
from finetune.system.atomic import write_text_atomic
from finetune.system.disk import describe_failure


def apply_quality(tally: Tally, limits: quality.QualityLimits) -> None:
    """Characters a second against each speaker's median, then the drops the limits decide (counted)."""
    rates: dict[str, list[float]] = {}
    for clip in tally.kept.values():
        if clip.seconds > 0:
            clip.quality["chars_per_s"] = round(len(clip.text) / clip.seconds, 3)
            rates.setdefault(clip.speaker, []).append(clip.quality["chars_per_s"])
    medians = {speaker: float(np.median(values)) for speaker, values in rates.items()}
    for item_id in sorted(tally.kept):
        clip = tally.kept[item_id]
        problem = limits.problem(clip.quality, medians.get(clip.speaker, 0.0))
        if problem is not None:
            del tally.kept[item_id]
            tally.drop(item_id, problem[0], problem[1], clip.text)


def speaker_table(tally: Tally, val_ids: set[str]) -> dict[str, dict]:
    """Per speaker: clips, hours, held-out clips and the median of each quality measure, most hours first."""
    table: dict[str, dict] = {}
    for item_id, clip in tally.kept.items():
        entry = table.setdefault(
            clip.speaker or "(one speaker)", {"clips": 0, "seconds": 0.0, "val": 0, "measures": {}}
        )
        entry["clips"] += 1
        entry["seconds"] += clip.seconds
        entry["val"] += item_id in val_ids
        for name, value in clip.quality.items():
            entry["measures"].setdefault(name, []).append(value)
    ordered = sorted(table.items(), key=lambda kv: -kv[1]["seconds"])
    return {
        speaker: {
            "clips": e["clips"],
            "hours": round(e["seconds"] / 3600, 4),
            "val_clips": e["val"],
            **{name: quality.summary(values) for name, values in e["measures"].items()},
        }
        for speaker, e in ordered
    }


def write_outputs(
    data_dir: Path,
    tally: Tally,
    val_fraction: float,
    report_extra: dict,
    limits: quality.QualityLimits = quality.QualityLimits(),
) -> dict:
    """metadata.csv, metadata_val.csv, quality.csv and prepare_report.json; returns the report. Its page,
    prepare_report.html, is the reporting layer's (finetune/reporting/prepare_page.py, written by prepare_data.py)."""
    apply_quality(tally, limits)
    ids = sorted(tally.kept)
    val_ids = split_by_speaker(tally.kept, val_fraction)
    speakers = {clip.speaker for clip in tally.kept.values()}
    with_speakers = len(speakers) > 1
    row = lambda i: (i, tally.kept[i].speaker, tally.kept[i].text)  # noqa: E731
    train_rows = [row(i) for i in ids if i not in val_ids]
    val_rows = [row(i) for i in ids if i in val_ids]
    try:
        write_metadata(data_dir / "metadata.csv", train_rows, with_speakers)
        write_metadata(data_dir / "metadata_val.csv", val_rows, with_speakers)
        write_quality(data_dir / "quality.csv", tally, val_ids)
    except OSError as error:
        raise NotWritten(
            f"could not write the metadata in {data_dir}: {describe_failure(error, data_dir, 'it', 0)}; "
            "the clips are kept: free space and run the same command again"
        ) from None
    hours = lambda rows: round(sum(tally.kept[i].seconds for i, _, _ in rows) / 3600, 4)  # noqa: E731
    report = {
        **report_extra,
        "counts": {
            "items": len(tally.kept) + len(tally.dropped),
            "kept": len(ids),
            "train": len(train_rows),
            "val": len(val_rows),
            "dropped": len(tally.dropped),
            "reused": tally.reused,
            "processed": tally.processed,
            "speakers": len(speakers),
        },
        "hours": {"kept": hours(train_rows) + hours(val_rows), "train": hours(train_rows), "val": hours(val_rows)},
        "speakers": speaker_table(tally, val_ids),
        "dropped_by_reason": dict(Counter(d["reason"] for d in tally.dropped).most_common()),
        "drop_reasons": {**DROP_REASONS, **quality.QUALITY_DROP_REASONS},
        "out_of_vocabulary_characters": dict(tally.oov_chars.most_common()),
        "punctuation_removed": dict(tally.removed_chars.most_common()),
        "dropped": tally.dropped,
    }
    try:
        write_text_atomic(data_dir / "prepare_report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    except OSError as error:
        raise NotWritten(
            f"could not write {data_dir}/prepare_report.json: "
            f"{describe_failure(error, data_dir, 'it', 0)}; free space and run the same command again"
        ) from None
    return report


QUALITY_COLUMNS = ("snr_db", "clipping", "silence", "chars_per_s", "dnsmos")


def write_quality(path: Path, tally: Tally, val_ids: set[str]) -> None:
    """One line per kept clip: id, speaker, held out or not, seconds and each quality measure."""
    lines = ["id\tspeaker\tsplit\tseconds\t" + "\t".join(QUALITY_COLUMNS)]
    for item_id in sorted(tally.kept):
        clip = tally.kept[item_id]
        values = ["" if clip.quality.get(name) is None else f"{clip.quality[name]:g}" for name in QUALITY_COLUMNS]
        lines.append(
            "\t".join([item_id, clip.speaker, "val" if item_id in val_ids else "train", f"{clip.seconds:.3f}", *values])
        )
    write_text_atomic(path, "\n".join(lines) + "\n")
