"""A voice for phones and small boards: an ONNX graph of inference and the files sherpa-onnx's VITS loader
reads for MMS models (the convention of its MMS recipe, k2-fsa/sherpa docs/source/onnx/tts/mms.rst).

    model.onnx   inputs, in this order (sherpa-onnx feeds them by position):
                   x              int64 [1, tokens]  token ids, the blank between characters included
                   x_length       int64 [1]          tokens
                   noise_scale    float32 [1]        prior noise (MMS: 0.667)
                   length_scale   float32 [1]        1 / speaking rate
                   noise_scale_w  float32 [1]        duration noise (MMS: 0.8)
                 output y float32 [1, 1, samples]; durations capped as everywhere in this tool
                 (finetune/vits/inference.py). Metadata: model_type vits, comment mms, frontend characters,
                 add_blank 1, use_eos_bos 0 (so sherpa's ids equal the transformers tokenizer's),
                 blank_id, n_speakers 0, sample_rate, language.
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


class OnnxVoice(torch.nn.Module):
    """A VitsModel behind sherpa-onnx's five inputs, and a sixth, `sid` [1] int64, for a multi-speaker one
    (sherpa-onnx passes its GenerationConfig.sid there when the graph has it)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, x_length, noise_scale, length_scale, noise_scale_w, sid=None):
        return synthesise_graph(self.model, x, noise_scale, length_scale, noise_scale_w, token_count=x_length,
                                speaker_ids=sid)


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


def metadata(model, tokenizer, language: str) -> dict[str, str]:
    return {"model_type": "vits", "comment": "mms", "frontend": "characters", "add_blank": "1", "use_eos_bos": "0",
            "blank_id": str(tokenizer.pad_token_id or 0), "n_speakers": str(speakers(model)),
            "sample_rate": str(int(model.config.sampling_rate)), "language": language,
            "noise_scale": str(model.noise_scale), "noise_scale_w": str(model.noise_scale_duration),
            "length_scale": str(1.0 / model.speaking_rate)}


def speakers(model) -> int:
    """n_speakers as sherpa-onnx reads it: 0 for a single voice, else how many the sid input chooses from."""
    return model.config.num_speakers if model.config.speaker_embedding_size and model.config.num_speakers > 1 else 0


def example_inputs(tokens: int, with_speaker: bool = False) -> tuple[torch.Tensor, ...]:
    x = torch.randint(1, 5, (1, tokens), dtype=torch.int64)
    sid = (torch.tensor([0], dtype=torch.int64),) if with_speaker else ()
    return (x, torch.tensor([tokens], dtype=torch.int64), torch.tensor([0.667]), torch.tensor([1.0]),
            torch.tensor([0.8]), *sid)


def export_voice(model, tokenizer, out_dir: Path, language: str) -> Path:
    """model.onnx and tokens.txt (and voice.json, what was exported) in out_dir, written atomically."""
    out_dir = Path(out_dir)
    staging = staging_dir(out_dir)
    try:
        write_export(model, tokenizer, staging, language)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_dir(staging, out_dir)
    return out_dir


def write_export(model, tokenizer, staging: Path, language: str) -> None:
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
        torch.onnx.export(voice, example_inputs(23, several), str(onnx_path), dynamo=False, opset_version=OPSET,
                          input_names=["x", "x_length", "noise_scale", "length_scale", "noise_scale_w",
                                       *(["sid"] if several else [])],
                          output_names=["y"], dynamic_axes={"x": {1: "tokens"}, "y": {2: "samples"}})
    graph = onnx.load(str(onnx_path))
    for key, value in metadata(model, tokenizer, language).items():
        entry = graph.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(graph, str(onnx_path))
    write_text_atomic(staging / "tokens.txt", "\n".join(tokens_lines(tokenizer.get_vocab())) + "\n")
    write_text_atomic(staging / "voice.json", json.dumps({"format": "sherpa-onnx vits (mms)", "onnx_opset": OPSET,
                                                         **metadata(model, tokenizer, language)}, indent=2) + "\n")


SHERPA_PROGRAM = """
import json, sys
import sherpa_onnx
folder, text, noise, noise_w, sid = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
vits = sherpa_onnx.OfflineTtsVitsModelConfig(model=folder + "/model.onnx", lexicon="", tokens=folder + "/tokens.txt",
                                             data_dir="", noise_scale=noise, noise_scale_w=noise_w, length_scale=1.0)
config = sherpa_onnx.OfflineTtsConfig(model=sherpa_onnx.OfflineTtsModelConfig(vits=vits, num_threads=1, provider="cpu"))
if not config.validate():
    sys.exit("sherpa-onnx rejected the configuration")
tts = sherpa_onnx.OfflineTts(config)
generation = sherpa_onnx.GenerationConfig()
generation.sid, generation.speed, generation.silence_scale = sid, 1.0, 1.0
audio = tts.generate(text, generation)
print(json.dumps({"samples": len(audio.samples), "sample_rate": audio.sample_rate,
                  "peak": max((abs(x) for x in audio.samples), default=0.0)}))
"""


def sherpa_speech(out_dir: Path, text: str, noise_scale: float = 0.0, noise_scale_w: float = 0.0,
                  sid: int = 0) -> dict:
    """Have sherpa-onnx load the export and speak `text` (as speaker `sid` of a multi-speaker export) in a
    child process (a model it cannot load ends its process, not ours): {"samples", "sample_rate", "peak"}.
    Pauses are kept at their length."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", SHERPA_PROGRAM, str(out_dir), text, str(noise_scale),
                           str(noise_scale_w), str(sid)], capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise ExportError(f"sherpa-onnx could not load or run {out_dir} (exit {done.returncode}): "
                         f"{(done.stderr or done.stdout).strip()[-300:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def sherpa_speaks(out_dir: Path, text: str, sid: int = 0) -> float:
    """Seconds of audio sherpa-onnx made from `text` with the export (its default noise)."""
    speech = sherpa_speech(out_dir, text, 0.667, 0.8, sid)
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
    gathered = torch.gather(x, 2, torch.clamp(index, min=0).minimum(positions[-1]).unsqueeze(0).expand(x.shape[0], -1, -1))
    return gathered * inside.unsqueeze(0)


@contextlib.contextmanager
def traceable_attention():
    """VitsAttention with the equivalents above, for the duration of an export."""
    from transformers.models.vits.modeling_vits import VitsAttention

    names = ("forward", "_get_relative_embeddings", "_relative_position_to_absolute_position",
             "_absolute_position_to_relative_position")
    saved = {name: getattr(VitsAttention, name) for name in names}

    def forward(self, hidden_states, *args, **kwargs):
        self._export_positions = _positions(hidden_states)
        return saved["forward"](self, hidden_states, *args, **kwargs)

    replacements = (forward, relative_embeddings_traceable, relative_to_absolute_traceable,
                    absolute_to_relative_traceable)
    for name, replacement in zip(names, replacements):
        setattr(VitsAttention, name, replacement)
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(VitsAttention, name, original)
