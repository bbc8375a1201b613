"""A round validates the judges it is asked for on its own voice (finetune/feedback/judge_check.py over
finetune/reporting/judge_ladders.py): a judge that ranks the voice's ladders right votes, one that ranks them
wrong does not and the report says why; what was found is kept beside the voice and read again, not recomputed,
until the voice changes; a validation that runs out of its time lets no judge vote and keeps nothing. Planted
judges (no optional extra needed) on the tiny voice test_feedback.py trains."""

from __future__ import annotations

import json
import logging
import re
import shutil
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from finetune.feedback.judge_check import VoiceValidation
from finetune.feedback.report import judges_line
from finetune.reporting import judge_ladders, judges
from finetune.training.budget import Budget, Clock
from tests.conftest import FakeClock


class SpectrumJudge:
    """Nearer the recording's long-term spectrum is better: more noise or less of the band scores lower."""

    name, kind, higher_is_better = "spectrum", "naturalness", True

    def __init__(self):
        self.calls = 0

    def score(self, waveform, sample_rate, reference=None, **_):
        self.calls += 1

        def spectrum(audio):
            frames = np.lib.stride_tricks.sliding_window_view(np.asarray(audio, np.float64), 512)[::256]
            return 10 * np.log10(np.mean(np.abs(np.fft.rfft(frames * np.hanning(512))) ** 2, axis=0) + 1e-10)

        return -float(np.mean(np.abs(spectrum(waveform) - spectrum(reference[0]))))


class LoudnessJudge(SpectrumJudge):
    """Louder is better: noise makes a clip louder, so it ranks the noise ladder backwards."""

    name = "loudness"

    def score(self, waveform, sample_rate, **_):
        self.calls += 1
        return float(np.sqrt(np.mean(np.square(waveform))))


class TickingClock(FakeClock):
    """Each reading of the time moves it on by `step` seconds: work that asks the time often runs out of it."""

    def __init__(self, step: float):
        super().__init__()
        self.step = step

    def now(self) -> float:
        self.t += self.step
        return self.t


def round_run(clock: FakeClock, budget_s: float = 900.0):
    logger = logging.getLogger("test_judge_check")
    return SimpleNamespace(budget=Budget(budget_s, Clock(clock.now)), device=torch.device("cpu"), logger=logger)


def voice_copy(base_run, tmp_path):
    folder = tmp_path / "voice"
    shutil.copytree(base_run / "checkpoints" / "best_model", folder)
    return folder


def test_a_round_validates_its_judges_on_its_voice_once_and_says_why_one_does_not_vote(
    prepared_demo,
    base_run,
    tmp_path,
):
    folder = voice_copy(base_run, tmp_path)
    validation = VoiceValidation(folder, prepared_demo, None, round_run(FakeClock()))
    assert validation.known() == {}  # nothing found on this voice yet
    right, wrong = SpectrumJudge(), LoudnessJudge()
    found = validation({"spectrum": right, "loudness": wrong})
    assert found["spectrum"]["votes"] and found["spectrum"]["why"] == ""
    assert set(found["spectrum"]["ladders"]) == {"noise", "lowpass"}  # its kind's ladders a voice alone gives
    assert not found["loudness"]["votes"] and "noise ladder ranked wrong" in found["loudness"]["why"]
    kept = json.loads((folder / judge_ladders.CACHE).read_text(encoding="utf-8"))
    assert set(kept["judges"]) == {"spectrum", "loudness"}
    assert validation.known() == {"spectrum": True, "loudness": False}

    calls = right.calls
    again = VoiceValidation(folder, prepared_demo, None, round_run(FakeClock()))
    assert again({"spectrum": right})["spectrum"]["votes"] and right.calls == calls  # read back, not scored again

    panel = judges.Panel({"spectrum": right, "loudness": wrong}, votes={"spectrum": True, "loudness": False})
    panel.why = {"loudness": found["loudness"]["why"]}
    line = judges_line(panel)
    assert line.startswith("Judges: spectrum voted; loudness only reported (its noise ladder ranked wrong")

    (folder / "model.safetensors").write_bytes((folder / "model.safetensors").read_bytes())  # the voice rewritten
    assert VoiceValidation(folder, prepared_demo, None, round_run(FakeClock())).known() == {}
    VoiceValidation(folder, prepared_demo, None, round_run(FakeClock()))({"spectrum": right})
    assert right.calls > calls  # a changed voice is validated again


def test_a_validation_that_runs_out_of_time_lets_no_judge_vote_and_keeps_nothing(
    prepared_demo,
    base_run,
    tmp_path,
):
    folder = voice_copy(base_run, tmp_path)
    validation = VoiceValidation(folder, prepared_demo, None, round_run(TickingClock(1.0), budget_s=20.0))
    found = validation({"spectrum": SpectrumJudge()})  # about 3 s of 20 given; every reading of the clock costs 1 s
    assert not found["spectrum"]["votes"]
    assert re.fullmatch(r"not validated on this voice in the \d+s given to it", found["spectrum"]["why"])
    assert not (folder / judge_ladders.CACHE).exists()


@pytest.mark.skipif(not judges.available("phonetic"), reason=f"the phonetic judge's extra: {judges.INSTALL_HINT}")
def test_a_judge_a_round_asks_for_is_validated_on_its_voice_and_its_vote_logged(
    prepared_demo,
    base_run,
    tmp_path,
    caplog,
):
    """The round's panel (shared.judges_panel with the round's VoiceValidation): the phone error rate asked for by
    name is validated on the voice before it may vote, and the log says whether it votes and why; with
    --judges_validation's file, that file decides and nothing is validated."""
    from finetune.recipes.shared import judges_panel
    from finetune.settings import TrainingFlags

    folder = voice_copy(base_run, tmp_path)
    run = round_run(FakeClock())
    run.dist = SimpleNamespace(is_main=True)
    validation = VoiceValidation(folder, prepared_demo, None, run, clips=3)
    with caplog.at_level(logging.INFO, logger="test_judge_check"):
        panel = judges_panel(TrainingFlags(judges=["phone_errors"]), run, [], {}, 16000, validation)
    entry = json.loads((folder / judge_ladders.CACHE).read_text(encoding="utf-8"))["judges"]["phone_errors"]
    assert set(entry["ladders"]) == {"noise", "lowpass", "text_swaps", "words_dropped"}
    voted = (
        "phone_errors (votes: validated on this voice)"
        if entry["votes"]
        else f"phone_errors (reported: {entry['why']})"
    )
    assert voted in caplog.text and panel.voting == (["phone_errors"] if entry["votes"] else [])
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"judges": {"phone_errors": {"votes": not entry["votes"]}}}))
    (folder / judge_ladders.CACHE).unlink()
    panel = judges_panel(
        TrainingFlags(judges=["phone_errors"], judges_validation=str(results)), run, [], {}, 16000, validation
    )
    assert panel.voting == ([] if entry["votes"] else ["phone_errors"]) and not (folder / judge_ladders.CACHE).exists()
