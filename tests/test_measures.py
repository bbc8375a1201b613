"""The evaluation's measures and its timing rule, on hand-made cases."""

import math

import numpy as np
import pytest

from finetune.reporting.evaluation import ClipScore, judge
from finetune.reporting.measures import TimingRule, duration_error, length_ratio, mcd_dtw


def test_length_ratio_and_duration_error():
    assert length_ratio(150, 100) == 1.5 and length_ratio(float("inf"), 100) == math.inf
    aligned = np.array([2, 5, 9, 14])
    assert duration_error(aligned, aligned) == 0.0
    assert duration_error(np.array([3, 5, 9, 13]), aligned) == pytest.approx(2 / 30)  # 2 of 30 frames misplaced
    assert duration_error(aligned * 2, aligned) == pytest.approx(1.0)


def test_the_timing_rule_accepts_0_8_to_1_25_by_default():
    rule = TimingRule()
    assert rule.accepts(0.8) and rule.accepts(1.0) and rule.accepts(1.25)
    assert not rule.accepts(0.79) and not rule.accepts(1.26) and not rule.accepts(math.inf)
    assert TimingRule(2.0).accepts(0.5) and not TimingRule(2.0).accepts(0.49)
    with pytest.raises(ValueError):
        TimingRule(0.9)


def test_an_evaluation_is_eligible_only_with_its_median_timing_inside_the_rule():
    def scores(*ratios):
        return {f"clip{i}": ClipScore(5.0, r, 0.1, False) for i, r in enumerate(ratios)}

    assert judge(1, scores(0.9, 1.0, 1.1), {}, 0.0, TimingRule()).eligible
    # One runaway clip does not decide it (the median does); most clips too fast do.
    assert judge(1, scores(1.0, 1.1, math.inf), {}, 0.0, TimingRule()).eligible
    slow = judge(1, scores(0.5, 0.6, 1.0), {}, 0.0, TimingRule())
    assert not slow.eligible and "median length ratio 0.60 is outside 0.80-1.25" in slow.ineligible_reason
    edge = judge(1, scores(0.7996, 0.7996, 1.0), {}, 0.0, TimingRule())  # shown precisely enough to see why
    assert not edge.eligible and "median length ratio 0.7996 is outside 0.80-1.25" in edge.ineligible_reason
    broken = judge(1, {"a": ClipScore(float("nan"), 1.0, 0.0, False)}, {}, 0.0, TimingRule())
    assert not broken.eligible


def test_mcd_of_a_recording_with_itself_is_zero_and_nan_for_nan_speech():
    rng = np.random.default_rng(0)
    log_mel = rng.normal(size=(80, 50))
    assert mcd_dtw(log_mel, log_mel) == pytest.approx(0.0, abs=1e-9)
    broken = log_mel.copy()
    broken[0, 3] = np.nan
    assert math.isnan(mcd_dtw(broken, log_mel))


def test_an_evaluation_reports_its_own_noise_as_the_standard_error_of_its_mean_mcd():
    scores = {f"c{i}": ClipScore(mcd, 1.0, 0.1, False) for i, mcd in enumerate([6.0, 7.0, 8.0, 9.0])}
    result = judge(10, scores, {}, 1.0, TimingRule())
    assert result.mcd_se_db == pytest.approx(np.std([6, 7, 8, 9], ddof=1) / 2)
    assert result.summary()["mcd_se_db"] == pytest.approx(0.6455, abs=1e-4)
    from finetune.reporting.evaluation import Evaluator

    assert Evaluator.describe(result).startswith("MCD 7.500 ±0.645 dB, length x1.00")
    one = judge(10, {"c0": ClipScore(6.0, 1.0, 0.1, False)}, {}, 1.0, TimingRule())
    assert "mcd_se_db" not in one.summary() and Evaluator.describe(one).startswith("MCD 6.000 dB")  # unknown


def test_a_held_out_split_too_small_to_decide_is_said_with_the_flag_that_fixes_it():
    import prepare_data

    def report(kept, val, speakers=None):
        return {"counts": {"kept": kept, "val": val}, "speakers": speakers or {"": {"clips": kept, "val_clips": val}}}

    # 121 clips at the default --val_fraction 0.02: a tenth, 12, held out (tests/test_prepare.py prepares them).
    warning = prepare_data.held_out_warning(report(121, 12))
    assert "12 held-out clips judge every evaluation" in warning and "--val_fraction 0.14" in warning
    assert prepare_data.held_out_warning(report(1000, 20)) is None
    assert prepare_data.held_out_warning(report(121, 0)) is None  # --val_fraction 0: asked for
    crowd = {"axin": {"clips": 125, "val_clips": 12}, "ciya": {"clips": 54, "val_clips": 5}}
    assert "12 held-out clips of axin (the default --target_speaker" in prepare_data.held_out_warning(
        report(179, 17, crowd)
    )  # the default target's
    assert "record more clips" in prepare_data.held_out_warning(report(20, 1))  # 16 of 20 would be over half


def test_across_speakers_a_voice_gains_nothing_by_sounding_like_the_corrector_and_wrong_words_still_show():
    """A demo clip X, its correction C read by a lower, slower voice (X played 1.4x longer), X moved half way
    toward that voice (D, 1.2x), and another sentence O. Plain MCD-DTW finds D nearer C than X is (it rewards
    the drift); across speakers it does not, and O stays far."""
    import soundfile as sf
    import soxr
    import torch

    from finetune.data.features import FeatureConfig, Features
    from finetune.reporting.measures import mcd_across_speakers, warped_references
    from tests.conftest import DEMO_CORPUS

    features = Features(FeatureConfig())

    def clip(name: str) -> np.ndarray:
        audio, rate = sf.read(DEMO_CORPUS / "wavs" / f"{name}.mp3", dtype="float32")
        return soxr.resample(audio, rate, 16000)

    def log_mel(audio: np.ndarray) -> np.ndarray:
        return features.mel(torch.from_numpy(audio).float().unsqueeze(0))[0].numpy()

    def played(audio: np.ndarray, times: float) -> np.ndarray:
        return soxr.resample(audio, 16000, 16000 * times)

    for name, other in (("kmr_demo_0005", "kmr_demo_0006"), ("kmr_demo_0040", "kmr_demo_0041")):
        x, o = clip(name), clip(other)
        c, d = played(x, 1.4), played(x, 1.2)
        assert mcd_dtw(log_mel(d), log_mel(c)) < mcd_dtw(log_mel(x), log_mel(c)) - 1.0  # plain MCD rewards the drift
        references = warped_references(c, 16000, log_mel)
        voice, drifted, wrong = (mcd_across_speakers(log_mel(a), references) for a in (x, d, o))
        assert drifted >= voice  # no reward for sounding like the corrector
        assert wrong > voice + 3.0 and wrong > drifted + 3.0  # what was said still decides
    assert math.isnan(mcd_across_speakers(np.full((80, 20), np.nan), references))


def test_focus_frames_are_the_frames_that_speak_the_focus_tokens_widened():
    from finetune.reporting.measures import focus_frames

    tokens, frames = np.array([0, 5, 0, 7, 0]), np.array([2, 3, 1, 2, 4])  # token 7 spoken at frames 6-7
    mask = focus_frames(tokens == 7, frames, 13, widen=1)
    assert np.flatnonzero(mask).tolist() == [5, 6, 7, 8]
    assert focus_frames(tokens == 9, frames, 13) is None


def test_the_focus_distance_counts_only_the_focus_frames():
    from finetune.reporting.measures import MCD_SCALE, cepstral_distance

    rng = np.random.default_rng(0)
    real = rng.normal(size=(25, 40))
    synthesised = real.copy()
    synthesised[:, 30:] += 1.0  # the last ten frames differ, by 1 on each of 25 coefficients
    assert cepstral_distance(synthesised, real, np.arange(40) < 20) == 0.0
    focus = np.arange(40) >= 30
    assert abs(cepstral_distance(synthesised, real, focus) - MCD_SCALE * 5.0) < MCD_SCALE * 1.0


def test_the_focus_ratio_is_the_focus_frames_distance_over_the_sentences_median_frame():
    from finetune.reporting.measures import focus_over_sentence

    per_frame = np.array([2.0, 2.0, 1.0, 3.0, 6.0, 6.0])  # median 2.5
    assert focus_over_sentence(per_frame, np.array([0, 0, 0, 0, 1, 1], dtype=bool)) == pytest.approx(6.0 / 2.5)
    assert focus_over_sentence(per_frame * 3.0, np.array([0, 0, 0, 0, 1, 1], dtype=bool)) == pytest.approx(2.4)
    assert math.isnan(focus_over_sentence(per_frame, np.zeros(6, dtype=bool)))


def test_a_clips_frame_distances_to_its_own_recording_are_zero_and_a_changed_stretch_stands_out():
    from finetune.reporting.measures import focus_over_sentence, frame_distances, normalised_cepstrum

    rng = np.random.default_rng(1)
    log_mel = rng.normal(size=(80, 60))
    references = [normalised_cepstrum(log_mel)]
    assert np.allclose(frame_distances(log_mel, references), 0.0)
    changed = log_mel.copy()
    changed[:, 40:50] = rng.normal(size=(80, 10)) * 3.0  # ten frames said otherwise
    per_frame = frame_distances(changed, references)
    assert focus_over_sentence(per_frame, np.arange(60) >= 40) > 1.5  # that stretch, against the sentence's median
