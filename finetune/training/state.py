"""What a run has done so far, saved in every checkpoint and restored on resume: the counters, and five
named groups (the best model kept, what the run's pieces cost, its setbacks, the discriminator's warm-up,
the micro-batch fitted to memory).

Plain values only (a checkpoint loads with `weights_only=True`). `from_dict` also reads the flat layout
of checkpoints written before the groups existed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class Best:
    """The evaluation whose model is in best_model (finetune/training/selection.py says which wins)."""

    score: float = float("inf")  # its measure (MCD, dB); inf: none yet
    step: int = -1  # -1: none yet
    eligible: bool = True  # it met the timing rule (False: the nearest to it, a fallback)
    timing_error: float = 0.0  # its distance from the rule's band
    evals_since: int = 0  # evaluations since it was found (early stopping)
    clips: dict = field(default_factory=dict)  # its MCD on each held-out clip (the noise, compared clip by clip)
    judged: dict = field(default_factory=dict)  # each voting judge's score of each clip (name -> clip id -> score)


@dataclass
class Estimates:
    """What the run's pieces cost when last measured, in seconds (0: unknown), so that a resumed process
    plans and limits its first evaluation from the start."""

    micro_batch_s: float = 0.0  # cautious seconds of a micro-batch
    update_s: float = 0.0  # cautious seconds of an optimizer update
    export_s: float = 0.0  # a model folder written
    eval_s: float = 0.0  # a whole evaluation
    checkpoint_s: float = 0.0
    eval_group_s: float = 0.0  # the slowest group of held-out clips in the last evaluation
    eval_sentence_s: float = 0.0  # its slowest test sentence
    eval_batch_size: int = 0  # held-out clips synthesised at once, as last used (0: the device's default)


@dataclass
class Setbacks:
    lr_scale: float = 1.0  # lowered each time a NaN storm sent the run back to its last good state
    rollbacks: int = 0  # times that happened


@dataclass
class WarmupProgress:
    """A new discriminator's warm-up (finetune/training/warmup.py)."""

    done: int = 0  # discriminator-only steps run
    epochs: float = 0.0  # the corpus's epochs when it ended, the part of one included (not --max_epochs')
    finished: bool = False  # it ended (margin reached, step limit or its share of the budget)
    seconds: float = 0.0  # time it has taken so far (all processes of the run)
    allowed_s: float = 0.0  # its time cap, fixed when it first started (0: not started)
    margins: list = field(default_factory=list)  # its latest margins (the window it ends on)
    first: dict = field(default_factory=dict)  # its first applied step's losses (for the closing line)
    last: dict = field(default_factory=dict)  # its latest applied step's losses


@dataclass
class BatchFit:
    """The micro-batch the run fitted to memory (finetune/training/batch_fit.py). The asked --batch_size
    and --gradient_accumulation_steps stay as they were in the settings."""

    micro_batch: int = 0  # clips per micro-batch (0: --batch_size as asked)
    accumulation: int = 0  # micro-batches per optimizer step (0: as asked)
    refits: list = field(default_factory=list)  # each refit: step, from, to, accumulation, why
    refit_in_training: bool = False  # the first out-of-memory error of training refitted at once
    oom_since_refit: int = 0  # out-of-memory windows skipped since the last refit (batch_fit.py bounds them)


@dataclass
class TrainingState:
    step: int = 0  # optimizer steps done
    epoch: int = 0  # epochs completed
    samples_seen: int = 0
    time_used_s: float = 0.0  # of the budget, across all processes of this run
    best: Best = field(default_factory=Best)
    estimates: Estimates = field(default_factory=Estimates)
    setbacks: Setbacks = field(default_factory=Setbacks)
    warmup: WarmupProgress = field(default_factory=WarmupProgress)
    batch: BatchFit = field(default_factory=BatchFit)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, saved: dict) -> "TrainingState":
        """A checkpoint's state, in this layout or the flat one written before (best_score, ...)."""
        saved = _grouped(saved) if "best" not in saved else saved
        groups = {
            "best": Best,
            "estimates": Estimates,
            "setbacks": Setbacks,
            "warmup": WarmupProgress,
            "batch": BatchFit,
        }
        values = {name: kind(**_known(kind, saved.get(name, {}))) for name, kind in groups.items()}
        counters = {name: saved[name] for name in ("step", "epoch", "samples_seen", "time_used_s") if name in saved}
        return cls(**counters, **values)


def _known(kind: type, values: dict) -> dict:
    names = {f.name for f in fields(kind)}
    return {k: v for k, v in values.items() if k in names}


# The flat layout's names, by group: (flat name, name in the group).
_FLAT = {
    "best": [
        ("best_score", "score"),
        ("best_step", "step"),
        ("best_eligible", "eligible"),
        ("best_timing_error", "timing_error"),
        ("evals_since_best", "evals_since"),
    ],
    "estimates": [
        (f"{name}_estimate", name) for name in ("micro_batch_s", "update_s", "export_s", "eval_s", "checkpoint_s")
    ]
    + [
        ("eval_group_s_estimate", "eval_group_s"),
        ("eval_sentence_s_estimate", "eval_sentence_s"),
        ("eval_batch_size", "eval_batch_size"),
    ],
    "setbacks": [("lr_scale", "lr_scale"), ("rollbacks", "rollbacks")],
    "warmup": [
        (f"discriminator_warmup_{name}", name)
        for name in ("done", "finished", "s", "allowed_s", "margins", "first", "last")
    ],
    "batch": [
        ("micro_batch", "micro_batch"),
        ("refits", "refits"),
        ("refit_in_training", "refit_in_training"),
        ("oom_since_refit", "oom_since_refit"),
    ],
}


def _grouped(flat: dict) -> dict:
    grouped = {name: flat[name] for name in ("step", "epoch", "samples_seen", "time_used_s") if name in flat}
    for group, names in _FLAT.items():
        grouped[group] = {inner if inner != "s" else "seconds": flat[outer] for outer, inner in names if outer in flat}
    return grouped
