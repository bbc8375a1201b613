"""best_model always exists and says how it was chosen; final_model is its copy; every exported folder
carries a model card; --push_to_hub fails fast offline and loses nothing; the timing draws; naturalness."""

from __future__ import annotations

import json
import math
import socket

import numpy as np
import pytest
import soundfile as sf

import train_vits
from finetune.reporting.evaluation import ClipScore, judge, says_nothing
from finetune.reporting.measures import TimingRule
from finetune.reporting.model_card import card_facts, card_text
from finetune.system.errors import ConfigError
from finetune.training.selection import (
    NONE_YET,
    better,
    chosen_as,
    compare,
    judge_candidate,
    judge_cut_short,
    standing,
    timing_error,
)
from tests.conftest import DEMO_CORPUS, clock_for
from tests.test_train import args, metrics

# ---------------------------------------------------------------- the rule


def clip_scores(mean: float, clips: int = 8) -> dict[str, float]:
    """Clip scores around `mean` that vary from clip to clip, each model's its own way (so a paired
    difference has a noise to pass)."""
    rng = np.random.default_rng(int(mean * 100))
    return {f"c{i}": mean + float(rng.normal(0, 0.1)) for i in range(clips)}


def test_within_the_timing_rule_beats_any_fallback_then_the_lower_mcd_wins():
    inside = standing(True, 0.9, 9.0, 1.25, clip_scores(9.0))
    near = standing(False, 0.78, 4.0, 1.25, clip_scores(4.0))
    assert better(inside, near) and not better(near, inside)
    lower, higher = standing(True, 1.1, 8.0, 1.25, clip_scores(8.0)), standing(True, 1.0, 9.5, 1.25, clip_scores(9.5))
    assert better(lower, inside) and not better(higher, inside)


def test_while_none_meets_the_rule_the_nearest_wins_then_the_lower_mcd():
    far, near = standing(False, 0.60, 3.0, 1.25), standing(False, 0.75, 9.0, 1.25)
    assert better(near, far) and not better(far, near)  # timing first, whatever the MCD
    slow = standing(False, 1.40, 9.0, 1.25)  # 1.40 is further from 1.25 than 0.75 is from 0.80 (in log ratio)
    assert timing_error(1.30, 1.25) == pytest.approx(timing_error(1 / 1.30, 1.25))
    same_timing_better_mcd = standing(False, 0.752, 8.0, 1.25)  # within 0.01 of `near` in log ratio
    assert better(same_timing_better_mcd, near)  # no clip scores: cannot tell, so the lower mean, no more
    assert better(far, NONE_YET) and slow.key() > near.key()


def test_a_score_that_is_not_finite_is_never_kept():
    assert standing(True, 1.0, math.nan, 1.25) is None and not better(None, NONE_YET)
    assert timing_error(math.inf, 1.25) == math.inf and better(standing(False, math.inf, 5.0, 1.25), NONE_YET)


def test_the_choice_is_explained():
    assert "within the timing rule" in chosen_as(standing(True, 1.0, 5.0, 1.25), 1.0, "")
    text = chosen_as(standing(False, 0.7, 5.0, 1.25), 0.7, "median length ratio 0.70 is outside 0.80-1.25")
    assert text.startswith("fallback") and "x0.70" in text and "0.80-1.25" in text


# ---------------------------------------------------------------- beyond the noise


def scored(step: int, clips: dict[str, float], eligible: bool = True):
    return standing(eligible, 1.0 if eligible else 0.7, float(np.mean(list(clips.values()))), 1.25, clips, step)


def test_two_clips_cannot_tell_so_the_lower_mean_decides_and_says_no_more():
    # The case of issue 28: step 100 at 7.411 dB, step 246 at 7.418 dB, on 2 held-out clips.
    kept = scored(100, {"a": 6.9, "b": 7.922})
    later = scored(246, {"a": 7.1, "b": 7.736})
    verdict = judge_candidate(later, kept)
    assert later.score > kept.score and not verdict.replace
    assert "cannot tell: 2 clips in common, at least 3 are needed" in verdict.why and "step 100" in verdict.why
    assert "beyond the noise" not in verdict.why and "mean, no more" in verdict.why
    lower = judge_candidate(scored(300, {"a": 6.0, "b": 7.5}), kept)
    assert lower.replace and "cannot tell" in lower.why
    assert judge_candidate(scored(400, {"a": 6.9, "b": 7.922}), kept).replace  # a tie: the longer-trained


def test_differences_that_do_not_vary_cannot_tell_either():
    """Every clip exactly 0.001 dB better: a spread of 0 would make that "beyond the noise" (a bound of 0)."""
    kept = scored(100, {f"c{i}": 7.0 + i for i in range(8)})
    worse_by_a_hair = scored(200, {f"c{i}": 7.001 + i for i in range(8)})
    comparison = compare(kept, worse_by_a_hair)
    assert comparison.clips == 8 and not comparison.beyond_noise and "do not vary" in comparison.cannot_tell
    verdict = judge_candidate(worse_by_a_hair, kept)
    assert not verdict.replace and "cannot tell" in verdict.why and "beyond the noise" not in verdict.why
    better_by_a_hair = judge_candidate(scored(300, {f"c{i}": 6.999 + i for i in range(8)}), kept)
    assert better_by_a_hair.replace and "cannot tell" in better_by_a_hair.why


def test_a_kept_model_better_beyond_the_noise_stays():
    rng = np.random.default_rng(0)
    base = {f"c{i}": 7.0 + rng.normal(0, 1.0) for i in range(16)}  # clips differ a lot; the models, steadily
    kept = scored(100, base)
    worse = scored(200, {k: v + 0.3 + rng.normal(0, 0.05) for k, v in base.items()})
    verdict = judge_candidate(worse, kept)
    assert not verdict.replace and "step 100 is better beyond the noise" in verdict.why
    better_one = scored(300, {k: v - 0.3 + rng.normal(0, 0.05) for k, v in base.items()})
    assert "better beyond the noise" in judge_candidate(better_one, kept).why and better(better_one, kept)
    # Unpaired, the same shift is lost in the clips' spread (a standard error of 0.25 dB): pairing finds it.
    assert np.std(list(base.values())) / 4 > 0.2


def test_the_kept_model_is_better_beyond_the_noise_than_every_later_one():
    rng = np.random.default_rng(1)
    base = {f"c{i}": 7.0 + rng.normal(0, 1.0) for i in range(16)}
    wobble = {name: 0.3 * (-1) ** i for i, name in enumerate(base)}  # how each clip moves, step to step
    runs = [
        scored(100, base),
        scored(200, {k: v + 0.1 + wobble[k] for k, v in base.items()}),  # within the noise
        scored(300, {k: v + 0.2 for k, v in base.items()}),
        scored(400, {k: v + 0.5 + rng.normal(0, 0.03) for k, v in base.items()}),
    ]
    kept, history = NONE_YET, []
    for candidate in runs:
        kept = candidate if better(candidate, kept) else kept
        history.append(kept.step)
    assert history == [100, 200, 300, 300]  # ties go to training, one at a time; 400 is worse than 300 beyond it
    assert "step 300 is better beyond the noise" in judge_candidate(runs[3], runs[2]).why


def test_a_cut_short_evaluation_is_compared_only_clip_by_clip_and_within_the_timing_rule():
    """An evaluation cut short (fewer clips than planned) is compared on the clips it shares with the kept
    model when it is within the timing rule and shares at least 3 of them, and then replaces a kept model of
    its standing only when better beyond the noise there (no tie goes to it); a fallback, by the timing rule."""
    rng = np.random.default_rng(2)
    base = {f"c{i}": 9.0 + rng.normal(0, 1.0) for i in range(16)}
    kept = scored(0, base)
    first_14 = {k: v - 2.0 + rng.normal(0, 0.1) for k, v in list(base.items())[:14]}  # the 450 s run's final
    verdict = judge_cut_short(scored(220, first_14), kept)
    assert verdict.replace and verdict.why.startswith("better beyond the noise") and "on 14 clips" in verdict.why
    tie = scored(220, {k: v + 0.05 * (-1) ** i for i, (k, v) in enumerate(list(base.items())[:14])})
    assert judge_candidate(tie, kept).replace  # a whole evaluation's tie goes to the longer-trained model
    verdict = judge_cut_short(tie, kept)
    assert not verdict.replace and verdict.why.startswith("cut short, and not better beyond the noise than step 0")
    two = scored(220, dict(list(first_14.items())[:2]))
    assert "2 clips in common with step 0: at least 3" in judge_cut_short(two, kept).why
    elsewhere = scored(220, {f"other{i}": 5.0 + i for i in range(5)})  # no clip the kept model scored
    assert "0 clips in common" in judge_cut_short(elsewhere, kept).why
    drifted = standing(False, 1.6, 6.0, 1.25, first_14, 220)  # outside the timing rule
    assert judge_cut_short(drifted, kept).why == "cut short and not eligible: not compared"
    three = scored(220, dict(list(first_14.items())[:3]))
    assert judge_cut_short(three, NONE_YET).replace  # nothing kept yet: the first model kept
    assert "2 clips scored" in judge_cut_short(two, NONE_YET).why
    fallback = scored(0, base, eligible=False)  # the kept model outside the timing rule: the rule decides
    worse = scored(220, {k: v + 1.0 for k, v in list(base.items())[:14]})
    assert judge_cut_short(worse, fallback) == judge_candidate(worse, fallback)
    assert judge_cut_short(worse, fallback).why == "nearer the timing rule"
    assert not judge_cut_short(None, kept).replace  # not finite


def test_without_clip_scores_nothing_is_beyond_the_noise_and_the_lower_mean_decides():
    kept, same = standing(True, 1.0, 7.0, 1.25, step=5), standing(True, 1.0, 7.0, 1.25, step=9)
    assert better(same, kept) and not better(standing(True, 1.0, 7.5, 1.25, step=9), kept)
    verdict = judge_candidate(standing(True, 1.0, 7.5, 1.25, step=9), kept)
    assert "cannot tell: 0 clips in common" in verdict.why
    assert better(standing(False, 0.75, 3.0, 1.25, {"a": 1.0, "b": 5.0}, 7), standing(False, 0.6, 9.0, 1.25, step=3))


# ---------------------------------------------------------------- a run that never meets the rule


def test_a_run_that_never_meets_the_timing_rule_still_ends_with_a_best_model(prepared_demo, tmp_path, timed_work):
    fake, _ = timed_work
    # --max_length_ratio 1 accepts only an exact 1.0: no evaluation can meet it.
    code = train_vits.main(
        args(
            prepared_demo,
            tmp_path,
            "--target_hours",
            "1",
            "--max_epochs",
            "1",
            "--max_length_ratio",
            "1",
            "--no-naturalness",
        ),
        clock=clock_for(fake),
    )
    assert code == 0
    run = tmp_path / "checkpoints"
    saved = json.loads((run / "best_model" / "eval.json").read_text())
    assert saved["eligible"] is False and saved["chosen_as"].startswith("fallback")
    evals = metrics(tmp_path, "eval")
    assert saved["step"] in {r["step"] for r in evals if r["best"]}
    log = (run / "train.log").read_text()
    assert "saved best_model as a fallback" in log
    assert "a fallback: no evaluation met the timing rule 1.00-1.00" in log
    assert "a copy of best_model" in log
    end = metrics(tmp_path, "end")[0]
    assert end["best_within_timing_rule"] is False and end["best_step"] == saved["step"]
    assert "a fallback" in (run / "report.html").read_text()
    # The app's folder is the best model's weights; the last weights are kept beside the checkpoints.
    final = tmp_path / "final_model"
    assert (final / "model.safetensors").read_bytes() == (run / "best_model" / "model.safetensors").read_bytes()
    summary = json.loads((final / "training_summary.json").read_text())
    assert summary["final_model_holds"] == f"best_model (step {saved['step']})"
    assert (run / "last_model" / "config.json").is_file()
    for folder in (run / "best_model", run / "last_model", final):
        card = (folder / "README.md").read_text()
        header = card.split("---")[1]  # no language line where it is unknown (the Hub reads it as a code)
        assert "license: other" in header and "language:" not in header and 'pipeline("text-to-speech"' in card


def test_one_level_or_full_scale_says_nothing_and_noise_or_speech_says_something():
    rng = np.random.default_rng(0)
    held = np.full(16_000, -1.0, dtype=np.float32)
    held[:80] = np.linspace(0, -1, 80)  # a collapsed generator's output: -1.00 but for its first samples
    pattern = np.tile(np.array([-1, 1, 1, -1, 1, -1, -1, -1], dtype=np.float32), 2_000)  # another's, whatever the text
    assert says_nothing(held) and says_nothing(pattern) and says_nothing(np.zeros(16_000)) and says_nothing(np.zeros(1))
    tone = 0.3 * np.sin(2 * np.pi * 220 * np.arange(16_000) / 16_000)
    loud_noise = np.clip(rng.normal(0, 3, 16_000), -1, 1)  # new weights: pinned at +-1 most of the time
    assert not says_nothing(tone) and not says_nothing(loud_noise)
    assert not says_nothing(np.concatenate([np.zeros(12_000), tone[:4_000]]))  # a pause, then speech


def test_a_voice_that_says_nothing_is_never_kept_not_even_as_the_fallback(
    prepared_demo, tmp_path, timed_work, monkeypatch
):
    """After step 0 every clip comes out as a constant -1.00 (the collapsed scratch:small pretraining's output,
    bench/RESULTS.md), at exactly the recordings' length. No evaluation can meet the timing rule here
    (--max_length_ratio 1 takes 1.0 exactly, and a voice that says nothing is not eligible), so each collapsed
    one would be the fallback nearest the rule; none is kept, and each says why."""
    from finetune.reporting import evaluation

    collapsed = {"on": False}
    real_speak, real_ratio, timed_evaluate = evaluation.speak, evaluation.length_ratio, evaluation.Evaluator.evaluate

    def speak(*a, **k):
        speech = real_speak(*a, **k)
        if collapsed["on"]:
            speech.waveforms = [np.full_like(w, -1.0) for w in speech.waveforms]
        return speech

    def evaluate(self, model, step, *a, **k):
        collapsed["on"] = step > 0
        return timed_evaluate(self, model, step, *a, **k)

    monkeypatch.setattr(evaluation, "speak", speak)
    monkeypatch.setattr(evaluation, "length_ratio", lambda *a: 1.0 if collapsed["on"] else real_ratio(*a))
    monkeypatch.setattr(evaluation.Evaluator, "evaluate", evaluate)
    fake, _ = timed_work
    run = args(prepared_demo, tmp_path, "--target_hours", "1", "--max_epochs", "2", "--val_every", "2")
    assert train_vits.main([*run, "--max_length_ratio", "1", "--no-naturalness"], clock=clock_for(fake)) == 0
    evals = metrics(tmp_path, "eval")
    assert evals[0]["step"] == 0 and evals[0]["best"] and evals[0]["length_ratio"] != 1.0 and len(evals) >= 3
    for later in evals[1:]:
        assert later["says_nothing"] and later["length_ratio"] == 1.0 and not later["best"], later
        assert later["ineligible_reason"].startswith("the voice says nothing")
    saved = json.loads((tmp_path / "checkpoints" / "best_model" / "eval.json").read_text())
    assert saved["step"] == 0 and saved["chosen_as"].startswith("fallback") and "says_nothing" not in saved
    assert "a voice that says nothing is never kept" in (tmp_path / "checkpoints" / "train.log").read_text()


def test_a_run_whose_every_evaluation_says_nothing_ends_with_its_last_weights_and_says_so(
    prepared_demo, tmp_path, timed_work, monkeypatch
):
    from finetune.reporting import evaluation

    real_speak = evaluation.speak

    def silent(*a, **k):
        speech = real_speak(*a, **k)
        speech.waveforms = [np.zeros_like(w) for w in speech.waveforms]
        return speech

    monkeypatch.setattr(evaluation, "speak", silent)
    fake, _ = timed_work
    run = args(prepared_demo, tmp_path, "--target_hours", "1", "--max_epochs", "1", "--val_every", "2")
    assert train_vits.main(run, clock=clock_for(fake)) == 0
    assert all(record["says_nothing"] and not record["best"] for record in metrics(tmp_path, "eval"))
    checkpoints = tmp_path / "checkpoints"
    assert not (checkpoints / "best_model").exists()
    log = (checkpoints / "train.log").read_text()
    assert "no best_model (no evaluation had a finite score, or every one said nothing)" in log
    summary = json.loads((tmp_path / "final_model" / "training_summary.json").read_text())
    assert summary["final_model_holds"].startswith("the last weights")
    assert (tmp_path / "final_model" / "model.safetensors").read_bytes() == (
        checkpoints / "last_model" / "model.safetensors"
    ).read_bytes()


# ---------------------------------------------------------------- the model card


def test_an_mms_voice_card_names_its_language_licence_data_and_figures(tmp_path):
    facts = card_facts("facebook/mms-tts-kmr-script_latin", 9.5, 42139)
    assert (facts.language, facts.licence, facts.hub_base_model) == (
        "kmr",
        "cc-by-nc-4.0",
        "facebook/mms-tts-kmr-script_latin",
    )
    evaluation = {
        "step": 1200,
        "mcd_db": 5.4,
        "length_ratio": 0.93,
        "draw_spread": 1.12,
        "duration_error": 0.4,
        "naturalness": 2.9,
        "eligible": True,
        "chosen_as": "the lowest MCD among the evaluations within the timing rule",
    }
    card = card_text(facts, "the best model of its run (step 1200)", 1200, evaluation)
    header = card.split("---")[1]
    assert "language: kmr" in header and "license: cc-by-nc-4.0" in header
    assert "base_model: facebook/mms-tts-kmr-script_latin" in header and "pipeline_tag: text-to-speech" in header
    for expected in (
        "9.50 hours",
        "42139 clips",
        "1200 optimizer steps",
        "| 5.4 |",
        "| 0.93 |",
        "| 2.9 |",
        "no commercial use",
        "x0.93",
        "noise_scale_duration",
        "export_onnx.py",
        "sherpa_onnx",
        'pipeline("text-to-speech"',
    ):
        assert expected in card, expected
    (tmp_path / "voice").mkdir()
    (tmp_path / "voice" / "README.md").write_text(card)
    child = card_facts(str(tmp_path / "voice"), 0.01, 12, "train_feedback.py")
    assert (child.language, child.licence, child.hub_base_model) == (
        "kmr",
        "cc-by-nc-4.0",
        "facebook/mms-tts-kmr-script_latin",
    )
    assert "base_model:" not in card_text(card_facts("scratch:tiny", 0.2, 300), "x", 1, None).split("---")[1]


def test_a_voice_fine_tuned_from_an_mms_folder_carries_its_licence_to_every_card_the_log_and_the_report(
    prepared_demo, tmp_path, timed_work
):
    """An MMS checkpoint downloaded for offline use (a folder named as the hub's, its card's licence in its
    header): the voice made from it inherits CC-BY-NC-4.0, and says so wherever a user looks."""
    from finetune.system.model_source import resolve_model
    from finetune.vits.generator import load_generator, ready_for_training
    from finetune.vits.voice_on_disk import export_model
    from tests.conftest import KURMANJI_LETTERS

    fake, _ = timed_work
    base = tmp_path / "models" / "mms-tts-kmr-script_latin"
    loaded = load_generator(resolve_model("scratch:tiny"), list(KURMANJI_LETTERS + " "), 16000)
    export_model(ready_for_training(loaded.model), loaded.tokenizer, base)
    (base / "README.md").write_text("---\nlicense: cc-by-nc-4.0\ntags:\n- mms\n---\n# MMS: Kurdish TTS\n")
    flags = args(
        prepared_demo,
        tmp_path,
        "--target_hours",
        "1",
        "--max_epochs",
        "1",
        "--max_length_ratio",
        "100",
        "--discriminator_warmup_steps",
        "1",
    )
    flags[flags.index("--model_name") + 1] = str(base)
    assert train_vits.main(flags, clock=clock_for(fake)) == 0
    run = tmp_path / "checkpoints"
    for folder in (run / "best_model", run / "last_model", tmp_path / "final_model"):
        header = (folder / "README.md").read_text().split("---")[1]
        assert "license: cc-by-nc-4.0" in header and "language: kmr" in header, folder
    assert (
        "licence: cc-by-nc-4.0" in (run / "train.log").read_text() and "inherits it" in (run / "train.log").read_text()
    )
    assert "Licence: cc-by-nc-4.0" in (run / "report.html").read_text()


# ---------------------------------------------------------------- --push_to_hub offline


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again when the block ends: connections are refused


def test_push_to_hub_fails_before_training_when_the_hub_cannot_be_reached(prepared_demo, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(ConfigError, match="cannot be reached.*train without --push_to_hub"):
        train_vits.main(args(prepared_demo, tmp_path, "--push_to_hub", "me/voice"))
    run = tmp_path / "checkpoints"  # the run lock may have made the folder; nothing was trained or written in it
    assert not list(run.glob("*.pt")) and not (run / "best_model").exists() and not (run / "metrics.jsonl").exists()
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # no stored token either
    with pytest.raises(ConfigError, match="no Hugging Face token: run `hf auth login`"):
        train_vits.main(args(prepared_demo, tmp_path, "--push_to_hub", "me/voice"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE"):
        train_vits.main(args(prepared_demo, tmp_path, "--push_to_hub", "me/voice"))


def test_an_upload_that_fails_after_training_keeps_the_folder_and_says_how_to_upload(tmp_path, monkeypatch):
    from finetune.system.hub_upload import HubError, push_folder

    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    folder = tmp_path / "final_model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    with pytest.raises(
        HubError,
        match=r"saved as it was: upload it later with `hf upload me/voice .*final_model \. "
        r"--repo-type model --private`",
    ):
        push_folder(folder, "me/voice")
    assert (folder / "config.json").read_text() == "{}"


# ---------------------------------------------------------------- timing: several draws


def test_the_typical_single_draw_decides_and_the_spread_between_draws_is_reported():
    from finetune.vits.tempo_fit import geometric_spread

    draws = [
        (0.5, 0.7, 0.9, 3.0),
        (0.6, 0.8, 1.0, 2.5),
        (0.55, 0.75, 0.95, 2.8),
    ]  # skewed long, as sums of exponentials
    clips = {
        f"c{i}": ClipScore(5.0, float(np.median(d)), 0.1, False, length_draws=d, draw_spread=geometric_spread(d))
        for i, d in enumerate(draws)
    }
    result = judge(3, clips, {}, 0.0, TimingRule())
    assert result.length_ratio == pytest.approx(0.85)  # the median draw; the mean over draws says 1.34
    assert np.mean([r for d in draws for r in d]) > 1.2
    assert (
        result.draw_spread == pytest.approx(np.median([geometric_spread(d) for d in draws]))
        and result.draw_spread > 1.5
    )
    assert geometric_spread((1.0, 1.0)) == 1.0 and geometric_spread((1.0, float("inf"))) == float("inf")
    assert "length_draws" not in result.per_clip_dict()["c0"] and result.summary()["draw_spread"] == round(
        result.draw_spread, 4
    )
    assert result.choice_scores == {"c0": 5.0, "c1": 5.0, "c2": 5.0}


def test_duration_draws_are_seeded_and_the_first_matches_one_synthesis(prepared_demo):
    import torch

    from finetune.vits.inference import duration_draws, speak
    from tests.conftest import tiny_generator

    loaded = tiny_generator(prepared_demo)
    model, tokenizer = loaded.model.eval(), loaded.tokenizer
    ids = [np.asarray(tokenizer("ez baş im")["input_ids"]), np.asarray(tokenizer("av zelal e")["input_ids"])]
    first = duration_draws(model, ids, torch.device("cpu"), seed=5, draws=6)
    assert first.shape == (2, 6) and np.array_equal(first, duration_draws(model, ids, torch.device("cpu"), 5, 6))
    assert len(set(first[0].tolist())) > 1  # the draws differ
    one = speak(model, ids[:1], torch.device("cpu"), 5, [60.0])
    assert duration_draws(model, ids[:1], torch.device("cpu"), 5, 1)[0, 0] == one.requested_frames[0]


# ---------------------------------------------------------------- naturalness on hand-made cases


def test_naturalness_rates_a_recording_above_silence_and_noise():
    pytest.importorskip("speechmos", reason="the naturalness extra (requirements-naturalness.txt) is not installed")
    from finetune.reporting.naturalness import Naturalness

    recording, rate = sf.read(str(sorted((DEMO_CORPUS / "wavs").glob("*.mp3"))[0]), dtype="float32")
    judge_ = Naturalness()
    speech = judge_.score(recording, rate).overall
    silence = judge_.score(np.zeros(rate * 2, dtype=np.float32), rate).overall
    noise = judge_.score(np.random.default_rng(0).normal(0, 0.1, rate * 2).astype(np.float32), rate).overall
    assert speech > silence + 0.5 and speech > noise + 0.5
    assert 1.0 <= min(silence, noise) and speech <= 5.0


def test_a_resumed_run_checks_the_upload_its_checkpoint_asks_for(prepared_demo, tmp_path, monkeypatch, timed_work):
    """The first process had a Hub that answered; its checkpoint holds --push_to_hub. A resume that does not
    repeat the flag still uploads at the end, so it is checked before any training, on the resumed settings."""
    from finetune.system import hub_upload

    fake, _ = timed_work
    real_check = hub_upload.check_ready
    monkeypatch.setattr(hub_upload, "check_ready", lambda repo_id: "me")  # the Hub answered the first process

    def stop_at_2(loop):
        if loop.state.step == 2:
            loop.context.stop.request("SIGINT")

    assert (
        train_vits.main(
            args(prepared_demo, tmp_path, "--target_hours", "1", "--max_epochs", "3", "--push_to_hub", "me/voice"),
            clock=clock_for(fake),
            step_callback=stop_at_2,
        )
        == 130
    )
    monkeypatch.setattr(hub_upload, "check_ready", real_check)  # from now on against a Hub that cannot be reached
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{closed_port()}")
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_real_token")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    run = tmp_path / "checkpoints"
    before = sorted(p.name for p in run.glob("*.pt"))
    with pytest.raises(ConfigError, match="cannot be reached"):
        train_vits.main(["--checkpoint_dir", str(run), "--resume", "auto"], clock=clock_for(fake))
    assert sorted(p.name for p in run.glob("*.pt")) == before  # nothing trained, nothing written
