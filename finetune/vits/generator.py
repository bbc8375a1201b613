"""The generator: a `transformers.VitsModel` and its tokenizer, loaded, built from scratch, readied for
training, and exported so that stock `VitsModel.from_pretrained` and `pipeline("text-to-speech")` load
it with no missing or unexpected weights.

Training differs from the stock module in three ways, all undone or harmless at export:
- the HiFi-GAN decoder gets weight norm, as in the original VITS training (MMS checkpoints were
  exported with it folded in); export folds it back;
- LayerDrop is switched off on the module (the original objective has none, and randomly skipped
  layers break data-parallel training); the saved config keeps its value, which inference ignores;
- the token embedding stops treating id 0 as padding: MMS configs name id 0 both the padding id and the
  blank inserted between every character, and `padding_idx` would freeze that embedding.
"""

from __future__ import annotations

import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn.utils import parametrize
from transformers import VitsConfig, VitsModel, VitsTokenizer
from transformers.initialization import no_init_weights
from transformers.utils import logging as transformers_logging

from finetune.system.model_source import ModelSource, ModelSourceError, load_tokenizer

transformers_logging.disable_progress_bar()  # "Writing model shards" bars would interleave with our log lines

BLANK_TOKEN = "<pad>"  # id 0 in scratch vocabularies: the blank VitsTokenizer puts between characters
SCRATCH_SAMPLE_RATE = 16_000  # a scratch model's rate, as MMS's (a pretrained model brings its own)

# Architectures for --model_name scratch:<size>. "mms" is VitsConfig's default, the MMS-TTS shape. "micro" is tiny
# with its widths halved and two posterior layers (0.18M parameters against 0.73M): the test suite's model, a step
# about a third cheaper and a synthesis a fifth; untrained, it says next to nothing (the evaluation calls that a
# collapsed voice).
TINY = dict(  # SCRATCH_CONFIGS["tiny"], which "micro" halves
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=2,
    ffn_dim=128,
    flow_size=48,
    upsample_initial_channel=64,
    resblock_kernel_sizes=[3],
    resblock_dilation_sizes=[[1, 3]],
    posterior_encoder_num_wavenet_layers=4,
    prior_encoder_num_flows=2,
    prior_encoder_num_wavenet_layers=2,
    duration_predictor_filter_channels=64,
    duration_predictor_num_flows=2,
    depth_separable_num_layers=2,
)
SCRATCH_CONFIGS: dict[str, dict] = {
    "micro": {
        **TINY,
        "hidden_size": 32,
        "ffn_dim": 64,
        "flow_size": 32,
        "upsample_initial_channel": 32,
        "posterior_encoder_num_wavenet_layers": 2,
        "duration_predictor_filter_channels": 32,
    },
    "tiny": TINY,
    "small": dict(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        ffn_dim=512,
        flow_size=128,
        upsample_initial_channel=256,
        posterior_encoder_num_wavenet_layers=8,
        duration_predictor_filter_channels=128,
    ),
    "mms": {},
}


@dataclass
class LoadedGenerator:
    model: VitsModel
    tokenizer: VitsTokenizer
    pretrained: bool  # False for scratch models
    description: str


def scratch_tokenizer(vocabulary: list[str]) -> VitsTokenizer:
    """An MMS-style character tokenizer: id 0 is the blank, then the characters in sorted order."""
    vocab = {BLANK_TOKEN: 0, **{char: i + 1 for i, char in enumerate(sorted(set(vocabulary) - {BLANK_TOKEN}))}}
    with tempfile.TemporaryDirectory() as tmp:
        vocab_file = Path(tmp) / "vocab.json"
        vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        return VitsTokenizer(
            str(vocab_file), pad_token=BLANK_TOKEN, add_blank=True, normalize=True, phonemize=False, is_uroman=False
        )


def scratch_generator(size: str, vocabulary: list[str], sample_rate: int) -> LoadedGenerator:
    tokenizer = scratch_tokenizer(vocabulary)
    config = VitsConfig(
        vocab_size=len(tokenizer.encoder), pad_token_id=None, sampling_rate=sample_rate, **SCRATCH_CONFIGS[size]
    )
    model = VitsModel(config)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    return LoadedGenerator(
        model,
        tokenizer,
        pretrained=False,
        description=f"new scratch:{size} VITS ({params:.2f}M parameters, "
        f"{len(tokenizer.encoder)} tokens from the training text)",
    )


WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin")


def missing_model_files(folder: Path) -> list[str]:
    """What a model folder lacks to be loaded: config.json, a weights file, vocab.json."""
    missing = [name for name in ("config.json", "vocab.json") if not (folder / name).is_file()]
    if not any((folder / name).is_file() for name in WEIGHT_FILES):
        missing.append("model.safetensors (the weights)")
    return missing


def load_complete_model(folder: Path, name: str, speakers: bool = False) -> VitsModel:
    """VitsModel.from_pretrained, refusing what it would accept silently: weights missing from the folder
    (transformers fills them with random values and only logs it) and, unless `speakers`, multi-speaker
    models (this tool fine-tunes single-voice models; it adds speakers itself). An incomplete folder is
    named with what it lacks."""
    missing = missing_model_files(Path(folder))
    if missing:
        raise ModelSourceError(
            f"{name}: the model folder is incomplete, it has no {', '.join(missing)}; download it "
            "again (hf download facebook/mms-tts-kmr-script_latin --local-dir DIR) or export it again"
        )
    config = VitsConfig.from_pretrained(str(folder))
    if config.num_speakers > 1 and not speakers:
        raise ModelSourceError(
            f"{name}: a multi-speaker VITS model ({config.num_speakers} speakers); this tool "
            "fine-tunes single-speaker models such as MMS-TTS (a multi_speaker/ folder that "
            "train_vits.py exported: give the folder that holds it, the target's voice alone)"
        )
    model, info = quiet_from_pretrained(folder)
    mismatched = [
        f"{key}: {tuple(saved)} in the folder, {tuple(expected)} in this model"
        for key, saved, expected in sorted(info.get("mismatched_keys") or [], key=lambda m: m[0])
    ]
    if mismatched:
        count = f"{len(mismatched)} weight{'s have' if len(mismatched) > 1 else ' has'}"
        raise ModelSourceError(
            f"{name}: {count} the wrong shape for its config.json "
            f"({'; '.join(mismatched[:3])}{'; ...' if len(mismatched) > 3 else ''}): the weights and "
            "config.json come from different models; download or export the folder again"
        )
    missing = info.get("missing_keys") or []
    if missing:
        names = sorted(str(k) for k in missing)
        raise ModelSourceError(
            f"{name}: {len(names)} weights are missing from the saved model "
            f"({', '.join(names[:6])}{', ...' if len(names) > 6 else ''}); the folder is incomplete or "
            "not a VITS model: download or export it again"
        )
    return model


def quiet_from_pretrained(folder: Path):
    """VitsModel.from_pretrained that reports wrongly shaped weights instead of raising from inside (and
    printing a load report first): they come back in the loading info, and are refused by the caller."""
    level = transformers_logging.get_verbosity()
    transformers_logging.set_verbosity_error()
    try:
        return VitsModel.from_pretrained(str(folder), output_loading_info=True, ignore_mismatched_sizes=True)
    finally:
        transformers_logging.set_verbosity(level)


def shape_mismatches(module: torch.nn.Module, state: dict) -> list[str]:
    """'name: (saved shape) saved, (expected shape) expected' for each weight of `state` that `module` has
    with another shape (load_state_dict would raise a RuntimeError listing them all, far from the user)."""
    expected = module.state_dict()
    return [
        f"{key}: {tuple(value.shape)} saved, {tuple(expected[key].shape)} expected"
        for key, value in state.items()
        if key in expected and hasattr(value, "shape") and tuple(value.shape) != tuple(expected[key].shape)
    ]


def pretrained_generator(source: ModelSource) -> LoadedGenerator:
    assert source.local_dir is not None
    tokenizer = load_tokenizer(source)
    model = load_complete_model(source.local_dir, source.name)
    if len(tokenizer.encoder) > model.config.vocab_size:
        raise ModelSourceError(
            f"{source.name}: tokenizer has {len(tokenizer.encoder)} tokens but the model embeds "
            f"only {model.config.vocab_size}"
        )
    params = sum(p.numel() for p in model.parameters()) / 1e6
    return LoadedGenerator(model, tokenizer, pretrained=True, description=f"{source.name} ({params:.1f}M parameters)")


def load_generator(
    source: ModelSource, vocabulary: list[str], sample_rate: int = SCRATCH_SAMPLE_RATE
) -> LoadedGenerator:
    """Pretrained weights from a local folder, or a scratch model whose vocabulary is `vocabulary`."""
    if source.is_scratch:
        return scratch_generator(source.scratch_size or "tiny", vocabulary, sample_rate)
    return pretrained_generator(source)


def hop_length(config: VitsConfig) -> int:
    """Audio samples per spectrogram frame: the decoder's total upsampling."""
    return math.prod(config.upsample_rates)


def ready_for_training(model: VitsModel) -> VitsModel:
    """Decoder weight norm on, LayerDrop off, blank embedding trainable (see the module docstring)."""
    if not has_weight_norm(model.decoder):
        model.decoder.apply_weight_norm()
    model.text_encoder.encoder.layerdrop = 0.0
    model.text_encoder.embed_tokens.padding_idx = None
    return model


def without_dropout(model: VitsModel) -> None:
    """Every dropout of the model at rate 0 while it trains (--dropout off: finetune-hf-vits trains so, its model
    left in the eval mode from_pretrained gives it). Its config keeps the rates: an export is unchanged."""
    from transformers.models.vits.modeling_vits import VitsAttention

    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        elif isinstance(module, VitsAttention):  # a rate it applies itself, in training mode
            module.dropout = 0.0


def has_weight_norm(module: torch.nn.Module) -> bool:
    return any(parametrize.is_parametrized(m, "weight") for m in module.modules())


def fold_weight_norm(module: torch.nn.Module) -> None:
    for sub in module.modules():
        if parametrize.is_parametrized(sub, "weight"):
            parametrize.remove_parametrizations(sub, "weight", leave_parametrized=True)


def inference_copy(model: VitsModel) -> VitsModel:
    """A CPU copy in the stock layout (decoder weight norm folded), built fresh so no GPU memory is used.
    Built without initialising its weights, which the model's own overwrite (at the MMS size 0.05-0.23 s
    against 0.58 s an export, bench/RESULTS.md); in a forked generator all the same, so that nothing a
    constructor draws moves the run's random state (a resumed run must match an uninterrupted one)."""
    with torch.random.fork_rng(devices=[]), no_init_weights():
        plain = VitsModel(model.config)
    if has_weight_norm(model.decoder):
        plain.decoder.apply_weight_norm()
    plain.load_state_dict({k: v.detach().cpu() for k, v in model.state_dict().items()})
    fold_weight_norm(plain.decoder)
    return plain.eval()


FREEZABLE_PARTS = ("text_encoder", "duration_predictor", "posterior_encoder", "flow", "decoder")


# The parts that make the voice's sound from the latent (the posterior encoder trains the latent space): what
# a correction round keeps as it is (train_feedback.py --acoustics frozen).
ACOUSTIC_PARTS = ("posterior_encoder", "flow", "decoder")


def freeze(model: VitsModel, parts: list[str]) -> list[str]:
    """Stop gradients to the named parts (their parameters then stay out of the optimizer).
    Returns the parts frozen; an unknown name raises ValueError listing the known ones."""
    unknown = [p for p in parts if p not in FREEZABLE_PARTS]
    if unknown:
        raise ValueError(f"--freeze {' '.join(unknown)}: unknown part; choose from {', '.join(FREEZABLE_PARTS)}")
    for part in parts:
        getattr(model, part).requires_grad_(False)
    return list(parts)


def train_token_rows(model: VitsModel, token_ids: list[int] | None) -> torch.Tensor:
    """The token embeddings learn, but only the rows of `token_ids` (None: every row): the others' gradients
    are zeroed (a hook), so Adam's steps never move them (AdamW's decay toward zero, 0.01 x lr a step, still
    shrinks them a little; --anchor_weight holds them exactly). Returns the mask [tokens, 1] the hook applies:
    setting its rows to 1 later lets them learn from then on (a round's --timbre_first)."""
    embedding = model.text_encoder.embed_tokens.weight
    keep = torch.zeros(embedding.shape[0], 1, dtype=embedding.dtype, device=embedding.device)
    keep[list(range(embedding.shape[0])) if token_ids is None else list(token_ids)] = 1.0
    embedding.requires_grad_(True)
    embedding.register_hook(lambda grad: grad * keep.to(grad.device, grad.dtype))
    return keep


def train_mode(model: VitsModel, frozen_parts: list[str]) -> None:
    """Training mode, except frozen parts stay in eval mode (no dropout noise from parts that do not learn)."""
    model.train()
    for part in frozen_parts:
        getattr(model, part).eval()
