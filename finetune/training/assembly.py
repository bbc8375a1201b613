"""Assembling a training run: device, generator, discriminator, data, evaluation. Shared by the recipes
(train_vits.py, train_feedback.py) so they differ only in what they choose, not in how it is built.

A run resumed from a checkpoint is rebuilt from the checkpoint alone (model config, tokenizer files,
weights), so a scratch model with its text-derived vocabulary comes back exactly as it was.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from transformers import VitsConfig, VitsModel, VitsTokenizer

from finetune.data.corpus import Corpus, tokenize
from finetune.data.metadata import CorpusError, read_metadata
from finetune.data.speakers import target_clips
from finetune.data.text import TextNormalizer, describe_oov
from finetune.system import gpu_check
from finetune.system.errors import ConfigError
from finetune.system.model_source import resolve_model
from finetune.training.checkpoint_file import CheckpointError
from finetune.vits.discriminator import Discriminator, DiscriminatorConfig, load_discriminator, parameter_count
from finetune.vits.generator import LoadedGenerator, load_generator, ready_for_training, shape_mismatches

# Kurmanji sentences written for this project and absent from the demo corpus's recordings.
DEFAULT_TEST_SENTENCES = [
    "Sibê em ê zû rabin, ji ber ku rêwîtiyek dirêj li pêşiya me ye.",
    "Av ewqas zelal bû ku me kevirên binî didîtin.",
    "Her kes dikare tiştekî nû fêr bibe.",
]


def seed_everything(seed: int) -> None:
    import random

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def pick_device(name: str, local_rank: int | None = None, training: bool = False) -> torch.device:
    """--device as a torch device; in a data-parallel run each process takes the GPU of its local rank. For
    `training`, auto refuses a card nvidia-smi lists but torch cannot use (finetune/system/gpu_check.py)."""
    if name == "auto":
        problem = gpu_check.unusable_card_problem() if training else None
        if problem:
            raise ConfigError([problem])
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError([f"--device {name}: CUDA is not available on this machine (use --device cpu)"])
    if device.type != "cuda":
        return device
    # An index always: torch.cuda.set_device refuses a bare "cuda" (ValueError), and "cuda:0" is the name a
    # checkpoint's random state and every log line should carry.
    index = local_rank if local_rank is not None else device.index
    index = torch.cuda.current_device() if index is None else index
    if index >= torch.cuda.device_count():
        raise ConfigError(
            [f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s), numbered from 0"]
        )
    device = torch.device("cuda", index)
    torch.cuda.set_device(device)  # the current device: new tensors and the saved random state are its
    return device


def corpus_texts(data_dir: Path) -> list[str]:
    """Every text of the prepared corpus (training and held-out): a scratch vocabulary must cover both."""
    texts = []
    for name in ("metadata.csv", "metadata_val.csv"):
        if (data_dir / name).is_file():
            texts += [text for _, text in read_metadata(data_dir / name)]
    if not texts:
        raise CorpusError(
            f"{data_dir}/metadata.csv not found or empty: run prepare_data.py --data_dir {data_dir} first"
        )
    return texts


# ---------------------------------------------------------------- generator


def tokenizer_files(tokenizer: VitsTokenizer) -> dict[str, str]:
    """The tokenizer's saved files as text, for storing in a checkpoint."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        return {name: Path(tmp, name).read_text(encoding="utf-8") for name in os.listdir(tmp)}


def tokenizer_from_files(files: dict[str, str]) -> VitsTokenizer:
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in files.items():
            Path(tmp, name).write_text(text, encoding="utf-8")
        return VitsTokenizer.from_pretrained(tmp)


def load_weights(module: torch.nn.Module, state: dict, what: str) -> None:
    """load_state_dict, refusing a wrongly shaped weight in one line that names it and both shapes."""
    wrong = shape_mismatches(module, state)
    if wrong:
        count = f"{len(wrong)} weight{'s' if len(wrong) > 1 else ''}"
        raise CheckpointError(
            f"the checkpoint's {what} has {count} of the wrong shape "
            f"({'; '.join(wrong[:3])}{'; ...' if len(wrong) > 3 else ''}): it was not written by "
            "this run's model, or it is damaged; resume another with --resume PATH, or start a new run "
            "in another --checkpoint_dir"
        )
    module.load_state_dict(state)


def generator_from_checkpoint(payload: dict) -> LoadedGenerator:
    config = VitsConfig.from_dict(payload["model_config"])
    model = ready_for_training(VitsModel(config))
    load_weights(model, payload["model"], "generator")
    return LoadedGenerator(
        model,
        tokenizer_from_files(payload["tokenizer_files"]),
        pretrained=True,
        description=f"resumed at step {payload['state']['step']}",
    )


def build_generator(model_name: str, payload: dict | None, texts: list[str]) -> LoadedGenerator:
    """From the checkpoint alone when resuming (the hub is not asked); else --model_name, resolved here (a
    scratch model's vocabulary is the texts' characters)."""
    if payload is not None:
        return generator_from_checkpoint(payload)
    vocabulary = sorted(set("".join(texts)))
    loaded = load_generator(resolve_model(model_name), vocabulary)
    ready_for_training(loaded.model)
    return loaded


def check_vocabulary(tokenizer: VitsTokenizer, texts: list[str]) -> None:
    """Prepared texts must be sayable by this tokenizer (prepare_data.py with another model breaks this)."""
    vocabulary = {t for t in tokenizer.encoder if len(t) == 1}
    missing = sorted({c for text in texts for c in text} - vocabulary)
    if missing:
        raise CorpusError(
            f"the prepared texts use characters this model's vocabulary lacks ({describe_oov(missing)}): "
            "prepare the data again with this model: prepare_data.py --model_name <the same model>"
        )


# ---------------------------------------------------------------- discriminator


@dataclass
class DiscriminatorChoice:
    discriminator: Discriminator
    description: str
    warmup_steps: int  # steps before its gradients reach the generator


def build_discriminator(
    path: str | None,
    width: float,
    periods: list[int] | None,
    scales: int,
    payload: dict | None,
    generator_pretrained: bool,
    warmup_steps: int,
) -> DiscriminatorChoice:
    """From the checkpoint when resuming; else loaded from --discriminator; else new (`periods` None: the
    standard VITS ones). A new
    discriminator facing a pretrained generator is warmed up first (finetune/training/warmup.py), so its first,
    uninformed gradients do not pull the generator away from what it already says well."""
    if payload is not None:
        saved = payload["discriminator"]
        config = DiscriminatorConfig(
            periods=tuple(saved["config"]["periods"]), width=saved["config"]["width"], scales=saved["config"]["scales"]
        )
        discriminator = Discriminator(config)
        load_weights(discriminator, saved["state"], "discriminator")
        warmup = int(saved["warmup_steps"])  # as the original run resolved it, not as the flag now says
        return DiscriminatorChoice(discriminator, "discriminator resumed from the checkpoint", warmup)
    if path:
        loaded = load_discriminator(path)
        size = parameter_count(loaded.discriminator) / 1e6
        return DiscriminatorChoice(
            loaded.discriminator, f"discriminator loaded from {loaded.source}, {size:.1f}M parameters", 0
        )
    config = DiscriminatorConfig(width=width, scales=scales, **({} if periods is None else {"periods": tuple(periods)}))
    discriminator = Discriminator(config)
    size = parameter_count(discriminator) / 1e6
    warmup = warmup_steps if generator_pretrained else 0
    note = (
        f"; it trains alone (at most {warmup} steps) before its gradients reach the pretrained generator"
        if warmup
        else "; generator and discriminator start together"
        if not generator_pretrained
        else "; no warm-up (--discriminator_warmup_steps 0): its first, random gradients reach the pretrained generator"
    )
    return DiscriminatorChoice(
        discriminator, f"discriminator initialised fresh (width {width}, {size:.1f}M parameters){note}", warmup
    )


# ---------------------------------------------------------------- evaluation inputs


def eval_batch_size(device: torch.device) -> int:
    """Held-out clips synthesised at once: 8 on a GPU; one at a time on a CPU, where batching gains little
    and a stop request is then honoured between clips."""
    return 8 if device.type == "cuda" else 1


def evaluation_clips(val: Corpus | None, train: Corpus, count: int, logger) -> list:
    """The clips that judge the voice: up to `count` held-out ones (of a crowd, the recipe loads the target's
    alone); without any, the target's first training clips, each once (and a loud warning)."""
    if val is not None and val.examples:
        return val.examples[:count]
    logger.warning(
        "warning: no held-out clips (metadata_val.csv is empty): the best model is judged on training "
        "clips. Prepare with --val_fraction > 0 for an honest measure"
    )
    return target_clips(train.examples)[:count]


def test_sentences(path: str | None, tokenizer: VitsTokenizer, logger) -> list[tuple[str, np.ndarray]]:
    """Sentences to synthesise at each evaluation: the file's lines, or the built-in Kurmanji ones.
    A sentence the vocabulary cannot say is skipped with a warning naming the characters."""
    if path:
        lines = [l.strip() for l in Path(path).read_text(encoding="utf-8").splitlines() if l.strip()]
    else:
        lines = DEFAULT_TEST_SENTENCES
    normalizer = TextNormalizer({t for t in tokenizer.encoder if len(t) == 1})
    sentences = []
    for index, line in enumerate(lines, start=1):
        check = normalizer(line)
        if check.oov or not check.text:
            logger.warning(f"test sentence {index} skipped: {describe_oov(check.oov) or 'nothing sayable'}")
            continue
        sentences.append((f"sentence_{index:02d}", tokenize(tokenizer, check.text)))
    return sentences
