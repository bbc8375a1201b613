"""A voice for phones and small boards: an ONNX graph of inference and the files sherpa-onnx's VITS loader
reads for MMS models (the convention of its MMS recipe, k2-fsa/sherpa docs/source/onnx/tts/mms.rst).

    model.onnx   inputs, in this order (sherpa-onnx feeds them by position):
                   x              int64 [1, tokens]  token ids, the blank between characters included
                   x_length       int64 [1]          tokens
                   noise_scale    float32 [1]        prior noise, relative (see below)
                   length_scale   float32 [1]        1 / speaking rate, relative
                   noise_scale_w  float32 [1]        duration noise, relative
                 output y float32 [1, 1, samples]; durations capped as everywhere in this tool
                 (finetune/vits/inference.py). Metadata: model_type vits, comment mms, frontend characters,
                 add_blank 1, use_eos_bos 0 (so sherpa's ids equal the transformers tokenizer's),
                 blank_id, n_speakers 0, sample_rate, language, licence.

The voice's inference settings are folded into the graph. sherpa-onnx reads none of them from a model
(its VITS loader takes noise_scale 0.667, noise_scale_w 0.8 and length_scale 1.0 from its own config,
whatever the metadata says), so an app that uses the documented snippet would speak at those, not at the
speaking_rate and noise_scale_duration fitted into config.json (26% fast on one fine-tuned voice,
bench/RESULTS.md). So each input is scaled inside the graph by the voice's setting over sherpa-onnx's
default: at sherpa-onnx's defaults the graph speaks exactly as config.json does (the stock pipeline), and
any other value an app gives (GenerationConfig.speed, a length_scale of 1.2) is relative to the voice's
own tempo. voice.json lists both.
    tokens.txt   `symbol id` a line, in id order; the space is a line with just its id; a capital line
                 for each lower-case letter with a capital (sherpa-onnx lower-cases ASCII only, so
                 Ç, Ê, Î, Ş, Û need their own lines); multi-character symbols (`<pad>`) left out (the blank
                 id is in the metadata).

sherpa-onnx reads its text as it is, so give it text normalised the way the tokenizer expects; it
splits sentences at `. ? ! :` and synthesises each apart.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from pathlib import Path

import torch

from finetune.system.atomic import replace_dir, staging_dir, write_text_atomic
from finetune.system.errors import ToolError
from finetune.vits.inference import synthesise_graph

OPSET = 17


class ExportError(ToolError):
    """The exported voice does not load or speak as it should; the message says where it failed."""


# What sherpa-onnx's OfflineTtsVitsModelConfig uses when an app sets nothing (sherpa-onnx's
# offline-tts-vits-model-config.h): the graph's inputs are relative to these.
SHERPA_DEFAULTS = {"noise_scale": 0.667, "noise_scale_w": 0.8, "length_scale": 1.0}


def folded_settings(model) -> dict[str, float]:
    """Each graph input's factor: the voice's own setting (config.json's, as the stock pipeline reads it) over
    sherpa-onnx's default, so that its defaults give the voice's settings."""
    return {
        "noise_scale": float(model.noise_scale) / SHERPA_DEFAULTS["noise_scale"],
        "noise_scale_w": float(model.noise_scale_duration) / SHERPA_DEFAULTS["noise_scale_w"],
        "length_scale": 1.0 / float(model.speaking_rate) / SHERPA_DEFAULTS["length_scale"],
    }


class OnnxVoice(torch.nn.Module):
    """A VitsModel behind sherpa-onnx's five inputs, and a sixth, `sid` [1] int64, for a multi-speaker one
    (sherpa-onnx passes its GenerationConfig.sid there when the graph has it); each scale multiplied by
    the voice's factor (folded_settings), a constant of the graph."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.factors = folded_settings(model)

    def forward(self, x, x_length, noise_scale, length_scale, noise_scale_w, sid=None):
        f = self.factors
        return synthesise_graph(
            self.model,
            x,
            noise_scale * f["noise_scale"],
            length_scale * f["length_scale"],
            noise_scale_w * f["noise_scale_w"],
            token_count=x_length,
            speaker_ids=sid,
        )


def tokens_lines(vocab: dict[str, int]) -> list[str]:
    """tokens.txt in sherpa-onnx's character format (see the module docstring)."""
    lines, seen = [], set()
    for symbol, index in sorted(vocab.items(), key=lambda item: item[1]):
        if len(symbol) != 1 or symbol in seen:
            continue
        seen.add(symbol)
        lines.append(f"{symbol} {index}" if symbol != " " else f" {index}")
    for symbol, index in sorted(vocab.items(), key=lambda item: item[1]):
        capital = symbol.upper()
        if len(symbol) == 1 and len(capital) == 1 and capital != symbol and capital not in seen:
            seen.add(capital)
            lines.append(f"{capital} {index}")
    return lines


def metadata(model, tokenizer, language: str, licence: str = "unknown") -> dict[str, str]:
    """The graph's metadata. noise_scale, noise_scale_w and length_scale are what to give sherpa-onnx for the
    voice's own settings: its defaults (the voice's settings are folded into the graph); folded_* are those
    settings."""
    return {
        "model_type": "vits",
        "comment": "mms",
        "frontend": "characters",
        "add_blank": "1",
        "use_eos_bos": "0",
        "blank_id": str(tokenizer.pad_token_id or 0),
        "n_speakers": str(speakers(model)),
        "sample_rate": str(int(model.config.sampling_rate)),
        "language": language,
        "licence": licence,
        **{name: str(value) for name, value in SHERPA_DEFAULTS.items()},
        "folded_speaking_rate": str(float(model.speaking_rate)),
        "folded_noise_scale_duration": str(float(model.noise_scale_duration)),
        "folded_noise_scale": str(float(model.noise_scale)),
    }


def card(model, source: str, licence: str, licence_note: str) -> str:
    """README.md of an exported voice folder: its licence (inherited), how to load it, its folded settings."""
    return f"""# sherpa-onnx voice exported from {source}

Licence: {licence} ({licence_note}); this export inherits it.

Load it with sherpa-onnx as its documentation does (nothing else to set):

```python
import sherpa_onnx
tts = sherpa_onnx.OfflineTts(sherpa_onnx.OfflineTtsConfig(model=sherpa_onnx.OfflineTtsModelConfig(
    vits=sherpa_onnx.OfflineTtsVitsModelConfig(model="model.onnx", lexicon="", tokens="tokens.txt"))))
audio = tts.generate("your sentence")
```

At sherpa-onnx's defaults it speaks with the voice's own inference settings, folded into the graph:
speaking_rate {float(model.speaking_rate):g}, noise_scale_duration {float(model.noise_scale_duration):g}, noise_scale
{float(model.noise_scale):g} (config.json's, fitted to the voice's recordings). A `speed` or `length_scale` an app
gives is relative to that tempo.
"""


def speakers(model) -> int:
    """n_speakers as sherpa-onnx reads it: 0 for a single voice, else how many the sid input chooses from."""
    return model.config.num_speakers if model.config.speaker_embedding_size and model.config.num_speakers > 1 else 0


def example_inputs(tokens: int, with_speaker: bool = False) -> tuple[torch.Tensor, ...]:
    x = torch.randint(1, 5, (1, tokens), dtype=torch.int64)
    sid = (torch.tensor([0], dtype=torch.int64),) if with_speaker else ()
    return (
        x,
        torch.tensor([tokens], dtype=torch.int64),
        torch.tensor([0.667]),
        torch.tensor([1.0]),
        torch.tensor([0.8]),
        *sid,
    )


def export_voice(model, tokenizer, out_dir: Path, language: str, licence: str = "unknown", card: str = "") -> Path:
    """model.onnx and tokens.txt (and voice.json, what was exported; README.md, `card`, when given) in
    out_dir, written atomically."""
    out_dir = Path(out_dir)
    staging = staging_dir(out_dir)
    try:
        write_export(model, tokenizer, staging, language, licence)
        if card:
            write_text_atomic(staging / "README.md", card)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_dir(staging, out_dir)
    return out_dir


def write_export(model, tokenizer, staging: Path, language: str, licence: str = "unknown") -> None:
    import onnx

    onnx_path = staging / "model.onnx"
    voice = OnnxVoice(model).eval()  # the wrapper too: the exporter puts back the wrapper's mode, recursively
    with torch.no_grad(), traceable_attention(), warnings.catch_warnings():
        # The tracer warns about every Python-side shape check and the exporter about index and slice
        # lowering; what matters is whether the graph computes what PyTorch does at every length, which
        # export_onnx.py checks on sentences of several lengths after exporting.
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", message="(Exporting aten::index|Constant folding)")
        several = speakers(model) > 0
        torch.onnx.export(
            voice,
            example_inputs(23, several),
            str(onnx_path),
            dynamo=False,
            opset_version=OPSET,
            input_names=[
                "x",
                "x_length",
                "noise_scale",
                "length_scale",
                "noise_scale_w",
                *(["sid"] if several else []),
            ],
            output_names=["y"],
            dynamic_axes={"x": {1: "tokens"}, "y": {2: "samples"}},
        )
    graph = onnx.load(str(onnx_path))
    for key, value in metadata(model, tokenizer, language, licence).items():
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(graph, str(onnx_path))
    write_text_atomic(staging / "tokens.txt", "\n".join(tokens_lines(tokenizer.get_vocab())) + "\n")
    write_text_atomic(
        staging / "voice.json",
        json.dumps(
            {"format": "sherpa-onnx vits (mms)", "onnx_opset": OPSET, **metadata(model, tokenizer, language, licence)},
            indent=2,
        )
        + "\n",
    )


SHERPA_PROGRAM = """
import json, sys
import sherpa_onnx
request = json.loads(sys.argv[1])
folder = request["folder"]
if request["noise"] is None:  # the documented snippet (README, export_onnx.py): nothing set but the files
    vits = sherpa_onnx.OfflineTtsVitsModelConfig(model=folder + "/model.onnx", lexicon="", tokens=folder + "/tokens.txt")
else:
    vits = sherpa_onnx.OfflineTtsVitsModelConfig(model=folder + "/model.onnx", lexicon="", tokens=folder + "/tokens.txt",
                                                 data_dir="", noise_scale=request["noise"],
                                                 noise_scale_w=request["noise_w"], length_scale=1.0)
config = sherpa_onnx.OfflineTtsConfig(model=sherpa_onnx.OfflineTtsModelConfig(vits=vits, num_threads=1, provider="cpu"))
if not config.validate():
    sys.exit("sherpa-onnx rejected the configuration")
tts = sherpa_onnx.OfflineTts(config)
samples, peak, rate = [], 0.0, 0
for text in request["texts"]:
    counts = []
    for _ in range(request["repeats"]):
        if request["noise"] is None and request["sid"] == 0:
            audio = tts.generate(text)
        else:
            generation = sherpa_onnx.GenerationConfig()
            generation.sid, generation.speed, generation.silence_scale = request["sid"], 1.0, 1.0
            audio = tts.generate(text, generation)
        counts.append(len(audio.samples))
        peak, rate = max([peak] + [abs(x) for x in audio.samples]), audio.sample_rate
    samples.append(counts)
print(json.dumps({"samples": samples, "sample_rate": rate, "peak": peak}))
"""


def sherpa_run(
    out_dir: Path,
    texts: list[str],
    noise_scale: float | None = 0.0,
    noise_scale_w: float | None = 0.0,
    sid: int = 0,
    repeats: int = 1,
) -> dict:
    """Have sherpa-onnx load the export and speak each of `texts` `repeats` times (as speaker `sid` of a
    multi-speaker export) in a child process (a model it cannot load ends its process, not ours). Noise
    None: sherpa-onnx's documented snippet, which sets nothing (its defaults; the voice's settings are
    folded into the graph). {"samples": [[count a repeat] a text], "sample_rate", "peak"}."""
    import subprocess
    import sys

    request = {
        "folder": str(out_dir),
        "texts": texts,
        "noise": noise_scale,
        "noise_w": noise_scale_w,
        "sid": sid,
        "repeats": repeats,
    }
    done = subprocess.run(
        [sys.executable, "-c", SHERPA_PROGRAM, json.dumps(request)],
        capture_output=True,
        text=True,
        timeout=300 + 30 * len(texts) * repeats,
    )
    if done.returncode != 0:
        raise ExportError(
            f"sherpa-onnx could not load or run {out_dir} (exit {done.returncode}): "
            f"{(done.stderr or done.stdout).strip()[-300:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])


def sherpa_speech(
    out_dir: Path, text: str, noise_scale: float | None = 0.0, noise_scale_w: float | None = 0.0, sid: int = 0
) -> dict:
    """One text once: {"samples", "sample_rate", "peak"}. Pauses are kept at their length."""
    speech = sherpa_run(out_dir, [text], noise_scale, noise_scale_w, sid)
    return {**speech, "samples": speech["samples"][0][0]}


def sherpa_speaks(out_dir: Path, text: str, sid: int = 0) -> float:
    """Seconds of audio sherpa-onnx made from `text` with the export, as the documented snippet makes it."""
    speech = sherpa_speech(out_dir, text, None, None, sid)
    if speech["samples"] == 0 or speech["peak"] == 0.0:
        raise ExportError(f"sherpa-onnx loaded {out_dir} but made no audio for {text!r}")
    return speech["samples"] / speech["sample_rate"]


# ---------------------------------------------------------------- attention that traces with any length
#
# transformers' VitsAttention turns relative positions into absolute ones with pads and slices whose
# sizes come from Python arithmetic on the sequence length (`max(length - 5, 0)`), which a trace records
# as constants: the exported graph then only works for the example's length. These equivalents index
# with positions built from the tensors themselves, so the length stays a dynamic axis. They are used
# only while exporting (tested equal to the originals).


def _positions(x: torch.Tensor) -> torch.Tensor:
    """0 .. length-1 for x [batch, length, ...], derived from x (not from a Python number)."""
    return torch.cumsum(torch.ones_like(x[0, :, 0], dtype=torch.long), 0) - 1


def _offsets(positions: torch.Tensor) -> torch.Tensor:
    """-(length-1) .. length-1."""
    return torch.cat([-positions.flip(0), positions[1:]])


def relative_embeddings_traceable(self, relative_embeddings: torch.Tensor, length) -> torch.Tensor:
    """[1, 2 * window + 1, dim] -> [1, 2 * length - 1, dim]: the embedding of each offset, zero outside the window."""
    offsets = _offsets(self._export_positions)
    index = torch.clamp(offsets + self.window_size, 0, 2 * self.window_size)
    inside = (offsets.abs() <= self.window_size).to(relative_embeddings.dtype)
    return relative_embeddings[:, index] * inside.view(1, -1, 1)


def relative_to_absolute_traceable(self, x: torch.Tensor) -> torch.Tensor:
    """[batch_heads, length, 2 * length - 1] -> [batch_heads, length, length]: out[i, j] = x[i, j - i + length - 1]."""
    positions = _positions(x)
    index = positions.view(1, -1) - positions.view(-1, 1) + positions[-1]
    return torch.gather(x, 2, index.unsqueeze(0).expand(x.shape[0], -1, -1))


def absolute_to_relative_traceable(self, x: torch.Tensor) -> torch.Tensor:
    """[batch_heads, length, length] -> [batch_heads, length, 2 * length - 1]: out[i, r] = x[i, i + r - (length - 1)]."""
    positions = _positions(x)
    index = positions.view(-1, 1) + _offsets(positions).view(1, -1)
    inside = ((index >= 0) & (index <= positions[-1])).to(x.dtype)
    gathered = torch.gather(
        x, 2, torch.clamp(index, min=0).minimum(positions[-1]).unsqueeze(0).expand(x.shape[0], -1, -1)
    )
    return gathered * inside.unsqueeze(0)


@contextlib.contextmanager
def traceable_attention():
    """VitsAttention with the equivalents above, for the duration of an export."""
    from transformers.models.vits.modeling_vits import VitsAttention

    names = (
        "forward",
        "_get_relative_embeddings",
        "_relative_position_to_absolute_position",
        "_absolute_position_to_relative_position",
    )
    saved = {name: getattr(VitsAttention, name) for name in names}

    def forward(self, hidden_states, *args, **kwargs):
        self._export_positions = _positions(hidden_states)
        return saved["forward"](self, hidden_states, *args, **kwargs)

    replacements = (
        forward,
        relative_embeddings_traceable,
        relative_to_absolute_traceable,
        absolute_to_relative_traceable,
    )
    for name, replacement in zip(names, replacements):
        setattr(VitsAttention, name, replacement)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(VitsAttention, name, original)
