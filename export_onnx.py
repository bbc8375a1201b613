#!/usr/bin/env python3
"""Export a voice for devices: an ONNX graph of its inference, with the tokens file and metadata that
sherpa-onnx's VITS loader reads (phones, small boards; finetune/vits/onnx_export.py has the details).

    python export_onnx.py training/checkpoints/best_model voice_onnx          # -> voice_onnx/model.onnx, tokens.txt
    python export_onnx.py training/voices/current voice_onnx --language kmr

Then, on the device (pip install sherpa-onnx), with nothing set but the files: the voice's inference
settings (config.json's fitted speaking_rate and noise_scale_duration) are folded into the graph, so
sherpa-onnx's defaults speak at the voice's tempo:

    import sherpa_onnx
    tts = sherpa_onnx.OfflineTts(sherpa_onnx.OfflineTtsConfig(model=sherpa_onnx.OfflineTtsModelConfig(
        vits=sherpa_onnx.OfflineTtsVitsModelConfig(model="voice_onnx/model.onnx", lexicon="",
                                                   tokens="voice_onnx/tokens.txt"))))
    audio = tts.generate("ez bi kurdî diaxivim")        # audio.samples, audio.sample_rate

A model folder of a crowd's run (train_vits.py with several speakers) holds the target's voice and, in
multi_speaker/, every voice: both are exported, the second to OUT/multi_speaker/ with a sid input and
speakers.json (name -> sid: GenerationConfig.sid in sherpa-onnx).

After exporting it checks itself: onnxruntime against PyTorch on --check_sentences (same input, no
noise, so the outputs must agree), and, when sherpa-onnx is installed, that sherpa-onnx loads the folder
and speaks, at its defaults exactly as long as the stock pipeline with config.json (duration noise off on
both sides, so that the lengths are exact). The base model's licence, which the export inherits, goes
into voice.json, the graph's metadata and README.md. Needs the optional packages of requirements-export.txt.

Exit status: 0 exported and checked, 1 bad model or a failed check, 2 bad flags.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from finetune.cli import ConfigError, flag, parse_config, run_script

DEFAULT_CHECK = [
    "Rojbaş, tu çawa yî?",
    "Ez ji te hez dikim",
    "Sibê em ê zû rabin ji ber ku rêwîtiyek dirêj li pêşiya me ye",
]


@dataclass
class ExportConfig:
    model_dir: str = flag(
        "training/final_model", "model folder to export (final_model, best_model, a voice version)", positional=True
    )
    out_dir: str = flag("voice_onnx", "folder to write model.onnx, tokens.txt and voice.json into", positional=True)
    language: str = flag("kmr", "language code written into the metadata")
    check_sentences: list[str] = flag(DEFAULT_CHECK, "sentences spoken by both PyTorch and onnxruntime to compare")
    tolerance: float = flag(1e-3, "largest difference allowed between onnxruntime's and PyTorch's samples")

    def __post_init__(self):
        from finetune.reporting.tracking import installed

        problems = []
        if not Path(self.model_dir).is_dir():
            problems.append(f"{self.model_dir}: no such model folder")
        missing = [p for p in ("onnx", "onnxruntime") if not installed(p)]
        if missing:
            problems.append(f"{' and '.join(missing)} not installed: pip install -r requirements-export.txt")
        if problems:
            raise ConfigError(problems)


def check_onnxruntime(voice, out_dir: Path, lines: list, tolerance: float, sid: int | None = None) -> float:
    """The largest sample difference between onnxruntime and PyTorch over the sentences (no noise), as
    speaker `sid` of a multi-speaker export."""
    import numpy as np
    import onnxruntime
    import torch

    from finetune.vits.onnx_export import ExportError, OnnxVoice

    session = onnxruntime.InferenceSession(str(out_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    graph = OnnxVoice(voice.model).eval()  # what was exported, the voice's settings folded in
    worst = 0.0
    for line in lines:
        ids = torch.from_numpy(line.token_ids.astype(np.int64)).unsqueeze(0)
        scales = [torch.tensor([0.0]), torch.tensor([1.0]), torch.tensor([0.0])]
        speaker = None if sid is None else torch.tensor([sid], dtype=torch.int64)
        with torch.no_grad():
            expected = graph(ids, torch.tensor([ids.shape[1]]), *scales, speaker)[0, 0].numpy()
        inputs = {
            "x": ids.numpy(),
            "x_length": np.array([ids.shape[1]], dtype=np.int64),
            "noise_scale": scales[0].numpy(),
            "length_scale": scales[1].numpy(),
            "noise_scale_w": scales[2].numpy(),
            **({"sid": speaker.numpy()} if speaker is not None else {}),
        }
        got = session.run(None, inputs)[0][0, 0]
        if got.shape != expected.shape:
            raise ExportError(
                f"onnxruntime spoke {line.text!r} in {got.shape[0]} samples, PyTorch in {expected.shape[0]}"
            )
        worst = max(worst, float(np.abs(got - expected).max()))
    if worst > tolerance:
        raise ExportError(f"onnxruntime differs from PyTorch by up to {worst:.2e} (tolerance {tolerance:g})")
    return worst


def main(argv: list[str] | None = None) -> int:
    config = parse_config(ExportConfig, argv, __doc__)
    # torch and transformers load below, once the flags are read (--help never waits for them)
    import torch

    from finetune.reporting.model_card import card_facts
    from finetune.vits.onnx_export import card, export_voice
    from finetune.vits.speaker_layers import MULTI_SPEAKER_DIR
    from finetune.vits.synthesis import load_voice, numbered, prepare_lines

    voice = load_voice(config.model_dir, torch.device("cpu"))
    lines = [line for line in prepare_lines(voice, numbered(config.check_sentences)) if line.token_ids is not None]
    if not lines:
        raise ConfigError(["none of --check_sentences can be said by this voice: give sentences in its alphabet"])
    facts = card_facts(config.model_dir, 0.0, 0)  # its licence, from the folder's model card or config.json
    out_dir = export_voice(
        voice.model,
        voice.tokenizer,
        Path(config.out_dir),
        config.language,
        facts.licence,
        card(voice.model, config.model_dir, facts.licence, facts.licence_note),
    )
    print(f"exported {config.model_dir} -> {out_dir}/ (model.onnx, tokens.txt, voice.json, README.md)")
    print(f"licence: {facts.licence} ({facts.licence_note}); the export inherits it")
    worst = check_onnxruntime(voice, out_dir, lines, config.tolerance)
    print(f"onnxruntime equals PyTorch on {len(lines)} sentences (largest sample difference {worst:.1e})")
    check_sherpa(out_dir, voice.normalizer(lines[0].text).text)
    check_tempo(Path(config.model_dir), out_dir, [voice.normalizer(line.text).text for line in lines])
    several = Path(config.model_dir) / MULTI_SPEAKER_DIR
    if (several / "speakers.json").is_file():  # a crowd's run: its voices too, for apps that choose one
        export_speakers(several, out_dir / MULTI_SPEAKER_DIR, config, lines)
    return 0


def check_sherpa(out_dir: Path, text: str, sid: int | None = None) -> None:
    from finetune.reporting.tracking import installed

    if not installed("sherpa_onnx"):
        print("sherpa-onnx is not installed here: not checked (pip install sherpa-onnx)")
        return
    from finetune.vits.onnx_export import sherpa_speaks

    seconds = sherpa_speaks(out_dir, text, sid or 0)
    who = f" as speaker {sid}" if sid is not None else ""
    print(f"sherpa-onnx loads {out_dir} and speaks{who} ({seconds:.2f} s of audio for {text!r})")


def check_tempo(model_dir: Path, out_dir: Path, texts: list[str]) -> None:
    """sherpa-onnx at its own defaults speaks each sentence exactly as long as the stock pipeline does with
    the model folder's config.json (its speaking_rate, and its noise_scale_duration folded in the graph alike).
    Compared with the duration noise off on both sides, so that the lengths are exact, not draws."""
    import torch
    from transformers import VitsModel, VitsTokenizer

    from finetune.reporting.tracking import installed
    from finetune.vits.onnx_export import ExportError, sherpa_run

    if not installed("sherpa_onnx"):
        return
    stock, tokenizer = VitsModel.from_pretrained(str(model_dir)).eval(), VitsTokenizer.from_pretrained(str(model_dir))
    stock.noise_scale_duration = 0.0
    expected = []
    for text in texts:
        with torch.no_grad():
            expected.append(int(stock(**tokenizer(text, return_tensors="pt")).sequence_lengths[0]))
    heard = [counts[0] for counts in sherpa_run(out_dir, texts, 0.667, 0.0)["samples"]]  # its noise_scale default
    if heard != expected:
        raise ExportError(
            f"sherpa-onnx at its defaults speaks {heard} samples where the stock pipeline with "
            f"{model_dir}/config.json speaks {expected}: the fitted tempo did not reach the graph"
        )
    print(
        f"sherpa-onnx at its defaults speaks at config.json's tempo (speaking_rate {stock.speaking_rate:g}): "
        f"{len(texts)} sentences as long as the stock pipeline makes them (duration noise off to compare exactly)"
    )


def export_speakers(folder: Path, out_dir: Path, config: ExportConfig, lines: list) -> None:
    """The multi-speaker model beside the single voice: model.onnx with a sid input, tokens.txt, and
    speakers.json (name -> sid); its first and last speakers checked as the single voice is."""
    import json
    import shutil

    import torch

    from finetune.reporting.model_card import card_facts
    from finetune.vits.onnx_export import card, export_voice
    from finetune.vits.synthesis import load_voice

    names = json.loads((folder / "speakers.json").read_text(encoding="utf-8"))["speakers"]
    voice = load_voice(folder, torch.device("cpu"), speaker="0")
    facts = card_facts(config.model_dir, 0.0, 0)
    export_voice(
        voice.model,
        voice.tokenizer,
        out_dir,
        config.language,
        facts.licence,
        card(voice.model, str(folder), facts.licence, facts.licence_note),
    )
    shutil.copyfile(folder / "speakers.json", out_dir / "speakers.json")
    print(
        f"exported {folder} ({len(names)} speakers) -> {out_dir}/ (model.onnx with a sid input, tokens.txt, "
        "speakers.json)"
    )
    for sid in sorted({0, len(names) - 1}):
        worst = check_onnxruntime(voice, out_dir, lines, config.tolerance, sid)
        print(
            f"onnxruntime equals PyTorch as speaker {sid} on {len(lines)} sentences (largest sample difference "
            f"{worst:.1e})"
        )
    check_sherpa(out_dir, voice.normalizer(lines[0].text).text, len(names) - 1)


if __name__ == "__main__":
    sys.exit(run_script(main))
