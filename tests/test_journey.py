"""The user's whole journey with the defaults, in a folder of their own: a crowd's corpus in Common Voice's
layout prepared, a run from a pretrained single-speaker voice, a round of the app's corrections with no
flag, a sentence spoken. Only what makes it fit a test is given (a tiny model's sizes, the budgets, the
injected clock); every path and every choice the journey makes (which speaker, which clips, where the
corrections are) is the default."""

from __future__ import annotations

import json
import shutil

import soundfile as sf

import prepare_data
import synthesize
import train_feedback
import train_vits
from finetune.data.metadata import read_rows
from tests.conftest import TEST_SIZE, clock_for
from tests.test_speakers import SPEAKERS, common_voice_folder

SMALL = ["--discriminator_width", "0.0625", "--discriminator_periods", "2", "3", "--batch_size", "4"]
QUICK = ["--benchmark_samples", "4", "--val_samples", "2", "--max_epochs", "1", "--log_every_seconds", "60"]


def pretrained_voice(folder) -> None:
    """A single-speaker VITS folder, as the hub's MMS voice is to the user (its weights new, its vocabulary
    the crowd's letters)."""
    import torch

    from finetune.vits.generator import scratch_generator

    torch.manual_seed(0)
    loaded = scratch_generator(TEST_SIZE, sorted(set("ezbaşimtuvlsêhrk ")), 16000)
    loaded.model.save_pretrained(str(folder))
    loaded.tokenizer.save_pretrained(str(folder))


def app_corrections(folder, data) -> list[str]:
    """Six recordings by other volunteers than the voice, as a recording app saves them: audio_NNN.wav +
    audio_NNN.txt in training/feedback/, each a sentence that starts with the word the voice says wrong
    ("kevir", a word its corpus never holds, of its letters), recorded as a hiss before the volunteer's clip: a
    sound the voice's reading of it is far from, as a mistake is (the round hears that before it learns)."""
    import numpy as np

    rows = [(i, who, f"kevir {text}") for i, who, text in read_rows(data / "metadata.csv") if who != "aaa111"][:6]
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for number, (item_id, _, text) in enumerate(rows, 1):
        audio, rate = sf.read(data / "wavs" / f"{item_id}.wav")
        hiss = 0.3 * rng.standard_normal(int(0.4 * rate))
        sf.write(folder / f"audio_{number:03d}.wav", np.concatenate([hiss, audio]), rate)
        (folder / f"audio_{number:03d}.txt").write_text(text + "\n", encoding="utf-8")
    return [text for _, _, text in rows]


def test_prepare_train_correct_and_speak_with_the_defaults(tmp_path, monkeypatch, timed_work):
    fake, _ = timed_work
    monkeypatch.chdir(tmp_path)
    common_voice_folder(tmp_path / "cv")
    pretrained_voice(tmp_path / "mms")
    assert prepare_data.main(["--dataset", "cv/validated.tsv", "--model_name", "mms", "--num_workers", "1"]) == 0
    data = tmp_path / "training"
    speakers = {who for _, who, _ in read_rows(data / "metadata.csv")}
    assert speakers == set(SPEAKERS)

    argv = ["--model_name", "mms", "--target_hours", "1", *SMALL, *QUICK, "--report_to", "none"]
    assert train_vits.main(argv, clock=clock_for(fake)) == 0
    log = (data / "checkpoints" / "train.log").read_text(encoding="utf-8")
    assert "trained the target's clips only (--speakers target_only)" in log
    assert "left out: the other 2 speakers'" in log  # what the default leaves out, said
    for model in ("final_model", "checkpoints/best_model"):  # the voice names who it speaks as
        assert json.loads((data / model / "config.json").read_text())["speaker"] == "aaa111"

    texts = app_corrections(data / "feedback", data)
    fake.t = 0.0
    assert train_feedback.main(["--target_minutes", "60", "--batch_size", "4", *QUICK], clock=clock_for(fake)) == 0
    round_dir = data / "voices" / "rounds" / "round_001"
    report = json.loads((round_dir / "feedback_report.json").read_text(encoding="utf-8"))
    assert report["voice"] == "aaa111" and report["counts"]["corrections"] == len(texts) == 6
    assert report["counts"]["held_out"] == 3 and "'kevir'" in report["focus"]  # found by itself, held out by sentence
    assert report["accepted"] in (True, False) and report["reason"]  # a decision, with its reason

    shutil.rmtree(data / "feedback")  # the app's recordings are the user's; speaking needs none of them
    assert synthesize.main(["--text", "ez baş im", "--out", "hello.wav"]) == 0
    audio, rate = sf.read(tmp_path / "hello.wav")
    assert rate == 16000 and audio.size > 0
