"""What a round reads of the run its voice came from: the learning rate the voice was trained at (a round's is a
share of it) and the folder the user's app loads (an accepted round replaces it).
"""

from __future__ import annotations

import json
from pathlib import Path

ROUND_RATE_SHARE = 0.25  # a round's peak learning rate, as a share of the rate its voice was trained at
FALLBACK_RATE = 1e-5  # when the voice does not say its rate (a folder from elsewhere, or written before it was kept)


def voice_rate(base: Path) -> tuple[float | None, str]:
    """The peak learning rate the voice was trained at, and where that was read: its config.json (every folder
    this tool writes records it), else its run folder's training_args.json; (None, "") when neither says."""
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    if config.get("trained_learning_rate"):
        return float(config["trained_learning_rate"]), f"{base}/config.json"
    args = base.parent / "training_args.json"
    if args.is_file():
        rate = json.loads(args.read_text(encoding="utf-8")).get("learning_rate")
        if rate:
            return float(rate), str(args)
    return None, ""


def fit_rate(config, base: Path, logger) -> None:
    """--learning_rate 0 (the default): ROUND_RATE_SHARE of the voice's own training rate, so that one default
    serves a voice trained on a CPU at 2e-3 and an MMS voice fine-tuned at 2e-5."""
    if config.learning_rate > 0:
        logger.info(f"learning rate {config.learning_rate:g} (--learning_rate)")
    else:
        trained, where = voice_rate(base)
        config.learning_rate = ROUND_RATE_SHARE * trained if trained else FALLBACK_RATE
        logger.info(
            f"learning rate {config.learning_rate:g}: {ROUND_RATE_SHARE:g} of the {trained:g} the voice was trained at "
            f"({where}); --learning_rate sets another"
            if trained
            else f"learning rate {config.learning_rate:g}: the voice does not say the rate it was trained at (neither "
            f"{base}/config.json nor {base.parent}/training_args.json); --learning_rate sets another"
        )
    config.discriminator_learning_rate = config.discriminator_learning_rate or config.learning_rate


def app_folder(config, versions, base: Path) -> Path | None:
    """The folder the user's app loads, which an accepted round updates: --app_model_dir, else what the voice's
    first round recorded, else the output folder of the training run `base` came from (its training_args.json).
    None when there is none (--app_model_dir none, or a base from elsewhere)."""
    if config.app_model_dir:
        return None if config.app_model_dir == "none" else Path(config.app_model_dir)
    if versions.app_folder is not None or "app_model_dir" in versions.history():
        return versions.app_folder
    args = base.parent / "training_args.json"
    if args.is_file():
        output = json.loads(args.read_text(encoding="utf-8")).get("output_dir")
        if output and (Path(output) / "config.json").is_file():
            return Path(output)
    return None
