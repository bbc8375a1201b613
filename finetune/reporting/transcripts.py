"""Clips whose transcript does not match their audio, found by a model that has seen the corpus.

Common Voice has clips whose sentence is not what was read (another sentence, a word skipped, a false
start): training on them teaches wrong pronunciations. A model that has trained on the corpus aligns
each clip's text to its audio as training does (the monotonic alignment of the text's prior to the
audio's posterior, finetune/vits/objective.py) and pays an alignment cost for it: the KL divergence per
frame between the two, the training's own KL term for that one clip. Text that was not said cannot be
aligned well, so its cost stands out from the other clips of the same speaker (microphones and voices
move everyone's cost; a robust z-score within the speaker takes that out):

    z = (cost - the speaker's median) / (1.4826 x the speaker's median absolute deviation)

A clip with z above `max_z` is flagged. Speakers with fewer than MIN_CLIPS_PER_SPEAKER clips (most of
Common Voice's volunteers: a few clips each, each on a microphone of their own) are measured against
the clips of all such small speakers together, not against a pool the few big readers dominate (their
microphones and voices are not a small speaker's); only when the small speakers together have fewer
than MIN_CLIPS_PER_SPEAKER clips, against everyone's. Each clip's report line says which it was. Scoring is one clip at a time (bounded memory, a stop request
honoured between clips) and seeded (the posterior is a sample), so the same model gives the same costs.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from finetune.data.metadata import read_rows
from finetune.system.atomic import write_text_atomic

MIN_CLIPS_PER_SPEAKER = 10
REPORT_NAME = "transcript_check.csv"
EXCLUDED_NAME = "metadata_excluded.csv"
METADATA_NAMES = ("metadata.csv", "metadata_val.csv")


@dataclass
class ClipCost:
    item_id: str
    speaker: str
    cost: float  # alignment cost: KL per frame between the aligned prior and the posterior
    z: float = 0.0
    flagged: bool = False
    judged_against: str = ""  # OWN, SMALL or EVERYONE: whose costs its z is measured in


OWN, SMALL, EVERYONE = "own clips", "small speakers' clips", "all clips"


@torch.no_grad()
def alignment_cost(model, example, features, device: torch.device, seed: int) -> float:
    """One clip's alignment cost under `model` (in eval mode), in its own speaker's voice."""
    from finetune.data.examples import collate
    from finetune.vits.inference import fork_rng
    from finetune.vits.losses import kl_loss
    from finetune.vits.objective import generator_forward

    batch = collate([example], features.config.hop_length).to(device)
    with fork_rng(device):  # seeded, and the caller's random state left as it was
        torch.manual_seed(seed)
        out = generator_forward(model, batch, features, segment_frames=1)  # the decoder's one frame is unused
    return float(kl_loss(out.z_p, out.logs_q, out.m_p, out.logs_p, out.frame_mask))


def robust_z(values: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """How many robust standard deviations each value lies above the reference's median."""
    median = float(np.median(reference))
    spread = 1.4826 * float(np.median(np.abs(reference - median)))
    if spread <= 0:
        spread = float(np.std(reference)) or 1.0
    return (values - median) / spread


def flag_outliers(costs: list[ClipCost], max_z: float) -> list[ClipCost]:
    """Each clip's z within its speaker (or, for a speaker with few clips, among the small speakers' clips,
    or all clips: see the module docstring); flagged above max_z. Worst first."""

    def finite(clips: list[ClipCost]) -> np.ndarray:
        return np.array([c.cost for c in clips if np.isfinite(c.cost)])

    by_speaker = {speaker: [c for c in costs if c.speaker == speaker] for speaker in {c.speaker for c in costs}}
    small = [c for clips in by_speaker.values() if len(finite(clips)) < MIN_CLIPS_PER_SPEAKER for c in clips]
    pools = {OWN: None, SMALL: finite(small), EVERYONE: finite(costs)}
    for speaker, mine in by_speaker.items():
        if len(finite(mine)) >= MIN_CLIPS_PER_SPEAKER:
            against, reference = OWN, finite(mine)
        elif len(pools[SMALL]) >= MIN_CLIPS_PER_SPEAKER:
            against, reference = SMALL, pools[SMALL]
        else:
            against, reference = EVERYONE, pools[EVERYONE]
        scores = robust_z(
            np.array([c.cost if np.isfinite(c.cost) else np.inf for c in mine]),
            reference if len(reference) else np.array([0.0]),
        )
        for clip, z in zip(mine, scores):
            clip.z, clip.flagged, clip.judged_against = float(z), bool(z > max_z), against
    return sorted(costs, key=lambda c: -c.z)


def how_judged(costs: list[ClipCost]) -> str:
    """One line: how many speakers (and clips) were measured against their own clips, and how the small ones were."""
    speakers = {
        against: {c.speaker for c in costs if c.judged_against == against} for against in (OWN, SMALL, EVERYONE)
    }
    clips = {against: sum(c.judged_against == against for c in costs) for against in speakers}
    parts = [f"{len(speakers[OWN])} speaker(s) against their own clips ({clips[OWN]} clips)"] if speakers[OWN] else []
    if speakers[SMALL]:
        parts.append(
            f"{len(speakers[SMALL])} speaker(s) with fewer than {MIN_CLIPS_PER_SPEAKER} clips against the "
            f"{clips[SMALL]} clips of all such speakers together"
        )
    if speakers[EVERYONE]:
        parts.append(
            f"{len(speakers[EVERYONE])} speaker(s) with fewer than {MIN_CLIPS_PER_SPEAKER} clips against all "
            f"{len(costs)} clips (the small speakers together have too few to compare with)"
        )
    return "; ".join(parts)


def write_report(data_dir: Path, costs: list[ClipCost]) -> Path:
    path = data_dir / REPORT_NAME
    lines = ["id,speaker,alignment_cost,z,flagged,judged_against"] + [
        f"{c.item_id},{c.speaker},{c.cost:.4f},{c.z:.2f},{int(c.flagged)},{c.judged_against}" for c in costs
    ]
    write_text_atomic(path, "\n".join(lines) + "\n")
    return path


def exclude(data_dir: Path, flagged: set[str], reason: str) -> int:
    """Move the flagged clips' rows out of metadata.csv and metadata_val.csv into metadata_excluded.csv
    (its lines are the rows as they were, then |reason), each file replaced atomically. Returns how many."""
    moved = []
    for name in METADATA_NAMES:
        path = data_dir / name
        if not path.is_file():
            continue
        lines = path.read_text(encoding="utf-8").splitlines()
        keep = [line for line in lines if line.split("|", 1)[0] not in flagged]
        moved += [f"{line}|{reason}" for line in lines if line.split("|", 1)[0] in flagged]
        if len(keep) != len(lines):
            write_text_atomic(path, "".join(line + "\n" for line in keep))
    if moved:
        excluded = data_dir / EXCLUDED_NAME
        before = excluded.read_text(encoding="utf-8") if excluded.is_file() else ""
        write_text_atomic(excluded, before + "".join(line + "\n" for line in moved))
    return len(moved)


def read_report(data_dir: Path) -> list[dict]:
    with open(data_dir / REPORT_NAME, encoding="utf-8", newline="") as report:
        return list(csv.DictReader(report))


def speakers_of(data_dir: Path) -> dict[str, str]:
    """id -> speaker ("" for a single-speaker corpus) over both metadata files."""
    return {
        item_id: speaker
        for name in METADATA_NAMES
        if (data_dir / name).is_file()
        for item_id, speaker, _ in read_rows(data_dir / name)
    }
