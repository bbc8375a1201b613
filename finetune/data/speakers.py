"""Whose voice a run learns from and speaks in.

A prepared corpus names each clip's speaker when it has several (metadata.csv as `id|speaker|text`).
train_vits.py then speaks as one target speaker (--target_speaker, default the one with the most hours),
trained in one of three ways (--speakers; `auto`, the default, picks by the start: resolve_mode):

    conditioned   every speaker under its own embedding (finetune/vits/speaker_layers.py): the crowd teaches
                  the text, the target keeps its own voice; exported as the target alone (auto from new weights)
    pooled        every clip as one voice (what single-speaker training does with a crowd)
    target_only   the target's clips only (auto from a pretrained voice)

In all three, evaluation and best_model are judged on the target's held-out clips. The target is index 0
of the list, the others follow by hours: the order is fixed by the data, so a resumed run maps speakers
to the same embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from finetune.data.metadata import WAV_HEADER_BYTES, read_rows
from finetune.system.errors import ConfigError

MODES = ("conditioned", "pooled", "target_only")
AUTO = "auto"  # --speakers' default: resolve_mode picks one of MODES


def resolve_mode(mode: str, pretrained: bool, resumed_conditioned: bool = False) -> tuple[str, str]:
    """--speakers as one of MODES, and why, for a multi-speaker corpus. `auto` follows what
    bench/bench_speakers.py and the demo measured (docs/training.md, "Many speakers in, one voice out"):
    from a pretrained voice the target's own clips gave the nearer voice (conditioned on the crowd ended
    3-6% behind at 180 s with the target 15% and 50% of the clips, 6% at 360 s with 15%); from new weights
    the two tied, and the crowd is the data a new model lacks. A resumed conditioned run stays conditioned
    (its checkpoint has the layers)."""
    if mode != AUTO:
        return mode, ""
    if resumed_conditioned:
        return "conditioned", "--speakers auto: the resumed run trained conditioned on its speakers"
    if pretrained:
        return "target_only", (
            "--speakers auto: a pretrained voice learns the target nearest from the target's own clips "
            "(--speakers conditioned trains on every clip)"
        )
    return "conditioned", "--speakers auto: new weights learn from every clip, each speaker under its own embedding"


TARGET_SPEAKER = 0  # the id the voice trains under, is judged and exported as; a crowd's (or correctors') follow


def target_clips(examples: list) -> list:
    """The target's clips, each once (a run's training list may repeat them: weighted_for_target)."""
    return list({e.item_id: e for e in examples if e.speaker == TARGET_SPEAKER}.values())


@dataclass(frozen=True)
class Speakers:
    names: list[str]  # the target first, then by hours (most first)
    hours: dict[str, float]  # training hours of each
    held_out: dict[str, int]  # held-out clips of each
    mode: str

    @property
    def target(self) -> str:
        return self.names[0]

    @property
    def conditioned(self) -> bool:
        return self.mode == "conditioned" and len(self.names) > 1

    def indices(self) -> dict[str, int]:
        """speaker -> the index its clips train under (the speakers a mode leaves out are absent)."""
        if self.mode == "target_only":
            return {self.target: TARGET_SPEAKER}
        if self.mode == "pooled":
            return {name: TARGET_SPEAKER for name in self.names}
        return {name: index for index, name in enumerate(self.names)}

    def describe(self) -> str:
        how = {
            "conditioned": "each under its own speaker embedding",
            "pooled": "all as one voice",
            "target_only": "the target's clips only",
        }[self.mode]
        left_out = (
            f"; left out: the other {len(self.names) - 1} speakers' "
            f"{sum(self.hours.values()) - self.hours.get(self.target, 0.0):.2f} h"
            if self.mode == "target_only"
            else ""
        )
        return (
            f"speakers: {len(self.names)} in the training data, trained {how} (--speakers {self.mode}); the voice "
            f"judged and exported: {self.target} ({self.hours.get(self.target, 0.0):.2f} h, "
            f"{self.held_out.get(self.target, 0)} held-out clips){left_out}"
        )


def clip_hours(data_dir: Path, rows: list[tuple[str, str, str]], sample_rate: int) -> dict[str, float]:
    """Hours per speaker, from the WAV sizes (16-bit mono PCM)."""
    hours: dict[str, float] = {}
    for item_id, speaker, _ in rows:
        try:
            size = (data_dir / "wavs" / f"{item_id}.wav").stat().st_size
        except OSError:
            continue
        hours[speaker] = hours.get(speaker, 0.0) + max(0, size - WAV_HEADER_BYTES) / 2 / sample_rate / 3600
    return hours


def find_speakers(
    data_dir: Path, target: str | None, mode: str, sample_rate: int, saved_names: list[str] | None = None
) -> Speakers | None:
    """The corpus's speakers with the target first; None for a single-speaker corpus (no speaker named, or
    one). `saved_names`: a resumed run's list, kept as it was. A --target_speaker that is not in the
    training data is a ConfigError listing the speakers with most hours."""
    rows = read_rows(data_dir / "metadata.csv")
    val_path = data_dir / "metadata_val.csv"
    val_rows = read_rows(val_path) if val_path.is_file() else []
    hours = clip_hours(data_dir, rows, sample_rate)
    if len(hours) < 2:
        if target:
            raise ConfigError(
                [
                    f"--target_speaker {target}: {data_dir}/metadata.csv names no speakers (one voice); "
                    "prepare a multi-speaker corpus (prepare_data.py --speaker_column) or leave it out"
                ]
            )
        return None
    by_hours = sorted(hours, key=lambda name: (-hours[name], name))
    if target is not None and target not in hours:
        top = ", ".join(f"{name} ({hours[name]:.2f} h)" for name in by_hours[:5])
        raise ConfigError([f"--target_speaker {target}: not a speaker of {data_dir}/metadata.csv; most hours: {top}"])
    chosen = target or by_hours[0]
    names = saved_names or [chosen] + [name for name in by_hours if name != chosen]
    held = {}
    for _, speaker, _ in val_rows:
        held[speaker] = held.get(speaker, 0) + 1
    return Speakers(names, hours, held, mode)


def weighted_for_target(examples: list, share: float) -> tuple[list, str]:
    """A conditioned run's training list with the target's clips (speaker 0) repeated so that they are
    about `share` of every epoch's draws (never fewer than they are), and the line that says so. In a
    fixed budget the target's voice is learnt from its own clips; the crowd's are there for the text,
    and at their natural share (15% for a minority target) the target's layers see too few steps."""
    target = [e for e in examples if e.speaker == TARGET_SPEAKER]
    others = len(examples) - len(target)
    if not target or not others or len(target) >= share * len(examples):
        return examples, (
            f"speakers: the target's {len(target)} clips are {len(target) / len(examples):.0%} of the "
            f"training clips, at least --target_share {share:g}: drawn once an epoch"
        )
    repeats = max(1, round(share * others / ((1 - share) * len(target))))
    weighted = examples + target * (repeats - 1)
    return weighted, (
        f"speakers: the target's {len(target)} clips ({len(target) / len(examples):.0%} of the training "
        f"clips) drawn {repeats} times an epoch: {repeats * len(target) / len(weighted):.0%} of the draws "
        f"(--target_share {share:g}; 0 draws each clip once)"
    )
