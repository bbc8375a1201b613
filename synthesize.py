#!/usr/bin/env python3
"""Speak text with a trained model: one sentence to a WAV, or a file of sentences to a folder.

    python synthesize.py --text "Rojbaş, tu çawa yî?" --out hello.wav
    python synthesize.py --model training/checkpoints/best_model --sentences review.txt --out_dir review

With --sentences, each line becomes OUT_DIR/<id>.wav and OUT_DIR/metadata.csv lists `id|text`: listen,
and record corrected versions of the ones that sound wrong under the same ids for train_feedback.py.
Text is normalised as in training; a sentence with characters the model cannot say is skipped with the
characters named (nothing is silently dropped). Synthesis is seeded: the same text gives the same audio.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from finetune.cli import ConfigError, flag, parse_config, run_script


@dataclass
class SynthesizeConfig:
    model: str = flag(
        "training/final_model", "model folder (final_model, best_model, or any VITS save_pretrained folder)"
    )
    text: str | None = flag(None, "one sentence to speak (to --out)")
    sentences: str | None = flag(None, "text file, one sentence a line (to --out_dir)")
    out: str = flag("speech.wav", "output WAV for --text")
    out_dir: str = flag("review", "output folder for --sentences")
    seed: int = flag(0, "random seed of the synthesis noise")
    speaking_rate: float = flag(
        1.0,
        "relative to the voice's own tempo (config.json's speaking_rate, fitted to its "
        "recordings): above 1 speaks faster, below 1 slower",
    )
    speaker: str | None = flag(
        None,
        "a voice of the multi-speaker model beside a multi-speaker run's model "
        "(MODEL/multi_speaker/speakers.json names them); default: the model's one voice",
    )
    device: str = flag("auto", "cuda, cpu, or auto")

    def __post_init__(self):
        problems = []
        if bool(self.text) == bool(self.sentences):
            problems.append("give exactly one of --text or --sentences")
        if self.sentences and not Path(self.sentences).is_file():
            problems.append(f"--sentences {self.sentences}: no such file")
        if not Path(self.model).is_dir():
            problems.append(f"--model {self.model}: no such folder (train first, or point at a model folder)")
        elif not all((Path(self.model) / name).is_file() for name in ("config.json", "vocab.json")):
            problems.append(
                f"--model {self.model}: not a model folder (no config.json or vocab.json); give a folder "
                "train_vits.py wrote (final_model, best_model) or a VITS save_pretrained folder"
            )
        if self.speaking_rate <= 0:
            problems.append(f"--speaking_rate {self.speaking_rate}: must be positive")
        if problems:
            raise ConfigError(problems)


def main(argv: list[str] | None = None) -> int:
    config = parse_config(SynthesizeConfig, argv, __doc__)
    # torch and transformers load below, once the flags are read (--help never waits for them)
    from finetune.data.audio import write_pcm16
    from finetune.training.assembly import pick_device
    from finetune.vits.synthesis import load_voice, numbered, prepare_lines, read_sentences, speak, speak_for_review

    voice = load_voice(config.model, pick_device(config.device), config.speaking_rate, config.speaker)
    if config.text:
        line = prepare_lines(voice, numbered([config.text]))[0]
        if line.token_ids is None:
            print(f"error: nothing to say: {line.problem}: {line.text}", file=sys.stderr)
            return 1
        wave = speak(voice, line.token_ids, config.seed)
        write_pcm16(config.out, wave, voice.sample_rate)
        print(f"{config.out}  {len(wave) / voice.sample_rate:.2f}s  {config.text}")
        return 0
    out_dir = Path(config.out_dir)
    lines = prepare_lines(voice, numbered(read_sentences(config.sentences)))
    spoken = speak_for_review(voice, lines, out_dir, config.seed)
    if not spoken:
        print("error: nothing to say: every sentence was skipped", file=sys.stderr)
        return 1
    for path, line in spoken:
        print(f"{path}  {line.text}")
    print(
        f"{len(spoken)} sentences -> {out_dir}/ (metadata.csv lists id|text)"
        + (f"; {len(lines) - len(spoken)} skipped" if len(spoken) < len(lines) else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
