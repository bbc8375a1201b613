"""A model folder on disk: the voice written (export_model: Hugging Face files, the discriminator beside
them, extra JSON and the model card), copied (copy_model), each staged and swapped in so that a crash
mid-write leaves the previous folder as it was. A crowd's model writes its target alone, with the
conditioned model in multi_speaker/ (finetune/vits/speaker_layers.py)."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

from transformers import VitsModel, VitsTokenizer

from finetune.data.speakers import TARGET_SPEAKER
from finetune.system.atomic import replace_dir, staging_dir, write_text_atomic
from finetune.vits import speaker_layers
from finetune.vits.discriminator import save_discriminator
from finetune.vits.generator import inference_copy


def export_model(
    model: VitsModel,
    tokenizer: VitsTokenizer,
    out_dir: str | Path,
    discriminator=None,
    extra_json: dict[str, dict | str] | None = None,
    inference: dict[str, float] | None = None,
) -> None:
    """Write a Hugging Face folder (config.json, model.safetensors, tokenizer files) and, when given, the
    discriminator beside it (discriminator.pt) so training can continue. `inference`: config values the
    voice speaks with (speaking_rate, noise_scale_duration, noise_scale) instead of the model's own; a
    crowd's multi_speaker/ folder keeps the model's own (they were fitted to the target alone). Built in a
    staging folder and swapped in, so a crash mid-save leaves the previous export intact."""
    out_dir = Path(out_dir)
    staging = staging_dir(out_dir)
    try:
        if speaker_layers.speaker_count(model) > 1:  # the target alone, and the conditioned model beside it
            voice = speaker_layers.single_speaker(model, TARGET_SPEAKER)
            speaker_layers.save_conditioned(model, tokenizer, staging / speaker_layers.MULTI_SPEAKER_DIR)
        else:
            voice = inference_copy(model)
        if inference:
            voice.config = copy.deepcopy(voice.config)  # an inference copy may share the training model's config
            for name, value in inference.items():
                setattr(voice.config, name, value)
        voice.save_pretrained(str(staging), safe_serialization=True)
        tokenizer.save_pretrained(str(staging))
        if discriminator is not None:
            save_discriminator(discriminator, staging / "discriminator.pt")
        write_extras(staging, extra_json or {})
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a full disk or a kill: the previous export stays as it was
        raise
    replace_dir(staging, out_dir)


def write_extras(folder: Path, extras: dict[str, dict | str]) -> None:
    """Files beside a model: a dict as JSON (eval.json, training_summary.json), a str as text (README.md)."""
    for name, data in extras.items():
        text = data if isinstance(data, str) else json.dumps(data, indent=2, ensure_ascii=False) + "\n"
        write_text_atomic(folder / name, text)


def copy_model(source: Path, out_dir: str | Path, extra_json: dict[str, dict | str] | None = None) -> None:
    """Copy a written model folder to `out_dir` with `extra_json` files added; staged and swapped in
    like export_model, so a crash mid-copy leaves the previous folder intact."""
    out_dir = Path(out_dir)
    staging = staging_dir(out_dir)
    try:
        shutil.copytree(source, staging, dirs_exist_ok=True)
        write_extras(staging, extra_json or {})
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_dir(staging, out_dir)
