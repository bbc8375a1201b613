"""Speaker conditioning added to a single-speaker VITS, and folded out of it again.

transformers' VITS conditions on a speaker through a learnt embedding g [speaker_embedding_size] that
enters four places, each as a 1x1 convolution of g added to a layer's output:

    posterior encoder, flow    WaveNet: cond_layer(g), one slice per layer, added to in_layers[i](x)
    stochastic duration        conv_pre(x) + cond(g)
    decoder (HiFi-GAN)         conv_pre(x) + cond(g)

`add_speakers` turns a single-speaker model into one with those layers, the pretrained weights kept and
every conditioning layer's output exactly zero (the WaveNets' weight-normed cond_layer with magnitude 0,
the others with zero weights and biases): at step 0 every speaker sounds exactly as the pretrained
model. The embeddings start random, not zero: the gradient of a zero layer's weights is the embedding
times the gradient of its output, so with a zero embedding nothing would ever move.

For one speaker, each cond(g) is a constant vector over time added right after a layer with a bias, so
`single_speaker` folds it into that bias: a plain single-speaker model that stock
`VitsModel.from_pretrained` and the text-to-speech pipeline load and speak with no speaker id, equal to
the conditioned model for that speaker. A deterministic duration predictor adds cond(g) before a masked
convolution, where no bias can hold it: it is never conditioned here (its cond layer stays zero).
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from transformers import VitsConfig, VitsModel

from finetune.data.speakers import TARGET_SPEAKER
from finetune.vits.generator import has_weight_norm, inference_copy

EMBEDDING_SIZE = 256  # the original VITS's gin_channels for its multi-speaker models
EMBEDDING_INIT_STD = 0.1


def speaker_count(model: VitsModel) -> int:
    return model.config.num_speakers if model.config.speaker_embedding_size else 1


def add_speakers(model: VitsModel, count: int, embedding_size: int = EMBEDDING_SIZE, seed: int = 0) -> VitsModel:
    """A copy of single-speaker `model` conditioned on `count` speakers, each sounding exactly as `model`
    until trained. The embeddings are drawn from `seed` (in a forked generator: the run's random state
    does not depend on it)."""
    if speaker_count(model) > 1:
        raise ValueError("the model is conditioned on speakers already")
    config = copy.deepcopy(model.config)
    config.num_speakers, config.speaker_embedding_size = count, embedding_size
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        conditioned = VitsModel(config)
        if has_weight_norm(model.decoder):
            conditioned.decoder.apply_weight_norm()
        missing, unexpected = conditioned.load_state_dict(model.state_dict(), strict=False)
        assert not unexpected and all(is_conditioning(name) for name in missing), (missing, unexpected)
        torch.nn.init.normal_(conditioned.embed_speaker.weight, std=EMBEDDING_INIT_STD)
    # What ready_for_training changed on the modules (not the config) stays as it was: LayerDrop off (else
    # text encoder layers are skipped at random in training) and the blank's embedding trainable.
    conditioned.text_encoder.encoder.layerdrop = model.text_encoder.encoder.layerdrop
    conditioned.text_encoder.embed_tokens.padding_idx = model.text_encoder.embed_tokens.padding_idx
    with torch.no_grad():
        for layer in conditioning_layers(conditioned):
            silence(layer)
    conditioned.train(model.training)
    return conditioned.to(next(model.parameters()).device)


def is_conditioning(name: str) -> bool:
    return name.startswith("embed_speaker.") or ".cond_layer." in name or ".cond." in name


def conditioning_layers(model: VitsModel) -> list[torch.nn.Conv1d]:
    layers = [model.posterior_encoder.wavenet.cond_layer, model.decoder.cond, model.duration_predictor.cond]
    layers += [flow.wavenet.cond_layer for flow in model.flow.flows]
    return layers


def pin_target_speaker(model: VitsModel) -> None:
    """The target (TARGET_SPEAKER) keeps sounding exactly as the model did before add_speakers, however the
    others train: its embedding is zero and held there, and every conditioning layer's bias is held at zero,
    so each layer's output for the target (weights times a zero embedding, plus a zero bias) stays zero while
    its weights learn the other speakers. Held by zeroing those gradients (hooks), which survives any later
    requires_grad change; Adam moves nothing whose gradient was always zero."""
    with torch.no_grad():
        model.embed_speaker.weight[TARGET_SPEAKER].zero_()

    def without_first_row(grad: torch.Tensor) -> torch.Tensor:
        grad = grad.clone()
        grad[TARGET_SPEAKER] = 0
        return grad

    model.embed_speaker.weight.register_hook(without_first_row)
    for layer in conditioning_layers(model):
        layer.bias.register_hook(torch.zeros_like)


def train_conditioning(model: VitsModel) -> None:
    """The speaker embedding and every conditioning layer take gradients (inside parts otherwise frozen)."""
    for layer in [model.embed_speaker, *conditioning_layers(model)]:
        layer.requires_grad_(True)


def silence(layer: torch.nn.Conv1d) -> None:
    """Output exactly zero, gradients still flowing to the weights: a weight-normed layer gets magnitude 0
    (its direction stays random, so the magnitude's gradient is not zero), any other zero weights."""
    layer.bias.zero_()
    parametrizations = getattr(layer, "parametrizations", None)
    if parametrizations is not None and "weight" in parametrizations:
        parametrizations.weight.original0.zero_()
    else:
        layer.weight.zero_()


def conditioning(model: VitsModel, speaker_ids: torch.Tensor | None) -> torch.Tensor | None:
    """g [batch, embedding, 1] for a batch's speakers; None for a single-speaker model."""
    if speaker_count(model) <= 1 or speaker_ids is None:
        return None
    return model.embed_speaker(speaker_ids.to(model.embed_speaker.weight.device)).unsqueeze(-1)


def duration_conditioning(model: VitsModel, g: torch.Tensor | None) -> torch.Tensor | None:
    """What the duration predictor is given: g for a stochastic one, nothing for a deterministic one
    (see the module docstring)."""
    return g if model.config.use_stochastic_duration_prediction else None


@torch.no_grad()
def single_speaker(model: VitsModel, speaker: int) -> VitsModel:
    """A plain single-speaker model (on the CPU) speaking as `speaker` of conditioned `model`."""
    source = inference_copy(model)  # on the CPU, decoder weight norm folded
    g = source.embed_speaker.weight[speaker].view(1, -1, 1)
    state = source.state_dict()
    names = getattr(model.config, "speaker_names", None) or []
    settings = {k: v for k, v in model.config.to_dict().items() if k != "speaker_names"}
    config = VitsConfig.from_dict(
        {
            **settings,
            "num_speakers": 1,
            "speaker_embedding_size": 0,
            **({"speaker": names[speaker]} if speaker < len(names) else {}),
        }
    )
    with torch.random.fork_rng(devices=[]):
        plain = VitsModel(config)
    offsets = {}
    for prefix, wavenet in [("posterior_encoder.wavenet", source.posterior_encoder.wavenet)] + [
        (f"flow.flows.{i}.wavenet", flow.wavenet) for i, flow in enumerate(source.flow.flows)
    ]:
        shift = wavenet.cond_layer(g)[0, :, 0]  # [2 * hidden * layers], one slice per layer
        width = 2 * wavenet.hidden_size
        for layer in range(wavenet.num_layers):
            offsets[f"{prefix}.in_layers.{layer}.bias"] = shift[layer * width : (layer + 1) * width]
    offsets["decoder.conv_pre.bias"] = source.decoder.cond(g)[0, :, 0]
    if model.config.use_stochastic_duration_prediction:
        offsets["duration_predictor.conv_pre.bias"] = source.duration_predictor.cond(g)[0, :, 0]
    state = {k: v for k, v in state.items() if not is_conditioning(k)}
    for name, shift in offsets.items():
        state[name] = state[name] + shift
    plain.load_state_dict(state)
    return plain.eval()


MULTI_SPEAKER_DIR = "multi_speaker"  # inside an exported folder: the conditioned model, for apps that choose a voice


def save_conditioned(model: VitsModel, tokenizer, folder: Path) -> None:
    """The conditioned model as a stock multi-speaker folder, with speakers.json naming each speaker id."""
    folder.mkdir(parents=True, exist_ok=True)
    inference_copy(model).save_pretrained(str(folder), safe_serialization=True)
    tokenizer.save_pretrained(str(folder))
    names = list(getattr(model.config, "speaker_names", None) or [])
    (folder / "speakers.json").write_text(
        json.dumps(
            {"speakers": {name: i for i, name in enumerate(names)}, "target": names[0] if names else None},
            indent=2,
            ensure_ascii=False,
        )
        + "\n",
        encoding="utf-8",
    )


def speaker_id(folder: Path, name: str) -> int:
    """The id of speaker `name` in a multi-speaker folder's speakers.json (a ValueError listing them if absent)."""
    speakers = json.loads((folder / "speakers.json").read_text(encoding="utf-8"))["speakers"]
    if name not in speakers:
        if name.isdigit() and int(name) < len(speakers):
            return int(name)
        raise ValueError(
            f"--speaker {name}: not in {folder / 'speakers.json'}; its speakers: "
            f"{', '.join(list(speakers)[:10])}{', ...' if len(speakers) > 10 else ''}"
        )
    return int(speakers[name])
