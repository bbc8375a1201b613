"""Bounded synthesis: the same speech as stock transformers below the ceilings, bounded work above them."""

import numpy as np
import pytest
import torch

from finetune.system.model_source import resolve_model
from finetune.vits.generator import load_generator
from finetune.vits.inference import cap_durations, ceiling_for_text, speak, speak_tokens
from tests.conftest import KURMANJI_LETTERS

TEXTS = ["ez baş im", "rojbaş tu çawa yî li vir"]


def tiny_model(stochastic: bool = True):
    from finetune.vits.generator import SCRATCH_CONFIGS

    saved = dict(SCRATCH_CONFIGS["tiny"])
    SCRATCH_CONFIGS["tiny"] = {**saved, "use_stochastic_duration_prediction": stochastic}
    try:
        torch.manual_seed(0)
        loaded = load_generator(resolve_model("scratch:tiny"), list(KURMANJI_LETTERS + " "), 16000)
    finally:
        SCRATCH_CONFIGS["tiny"] = saved
    ids = [np.array(loaded.tokenizer(t).input_ids, dtype=np.int32) for t in TEXTS]
    return loaded.model.eval(), ids


def blow_up(model) -> None:
    """Make the duration predictor ask for about e^12 (160,000) frames per token: the last flow applied at
    inference is the elementwise affine, whose translation shifts the log-duration."""
    with torch.no_grad():
        if model.config.use_stochastic_duration_prediction:
            model.duration_predictor.flows[0].translate[0] = -12.0
        else:
            model.duration_predictor.proj.bias.fill_(12.0)


@pytest.mark.parametrize("stochastic", [True, False])
def test_below_the_ceilings_the_speech_is_stock_transformers_speech(stochastic):
    model, ids = tiny_model(stochastic)
    padded = torch.zeros(2, max(map(len, ids)), dtype=torch.long)
    mask = torch.zeros_like(padded)
    for i, row in enumerate(ids):
        padded[i, : len(row)] = torch.from_numpy(row.astype(np.int64))
        mask[i, : len(row)] = 1
    torch.manual_seed(3)
    with torch.no_grad():
        stock = model(input_ids=padded, attention_mask=mask)
    torch.manual_seed(3)
    ours = speak_tokens(model, ids, torch.device("cpu"), [60.0, 60.0])
    for i in range(2):
        expected = stock.waveform[i, : int(stock.sequence_lengths[i])].numpy()
        assert np.array_equal(ours.waveforms[i], expected)
        assert ours.rendered_frames[i] * 256 == len(expected) and not ours.capped[i]


@pytest.mark.parametrize("stochastic", [True, False])
def test_a_runaway_duration_predictor_is_spoken_within_the_ceilings(stochastic):
    model, ids = tiny_model(stochastic)
    blow_up(model)
    torch.manual_seed(5)
    state = torch.get_rng_state()
    speech = speak(model, ids, torch.device("cpu"), seed=1, max_clip_s=[2.0, 3.0])
    assert torch.equal(torch.get_rng_state(), state)  # the caller's random state is untouched
    frames_per_s = 16000 / 256
    for i, ceiling_s in enumerate((2.0, 3.0)):
        assert speech.rendered_frames[i] <= ceiling_s * frames_per_s and speech.capped[i]
        assert len(speech.waveforms[i]) == speech.rendered_frames[i] * 256
        # What the model asked for is kept in full: about e^12 frames for each token.
        assert speech.requested_frames[i] > 1e5 * len(ids[i])
    # Per-token ceiling: no token longer than a second, whatever the clip's ceiling.
    long_clip = speak(model, ids[:1], torch.device("cpu"), seed=1, max_clip_s=[1000.0])
    assert long_clip.token_frames[0].max() <= int(frames_per_s)


def test_durations_are_capped_per_token_then_scaled_per_clip():
    mask = torch.ones(2, 1, 4)
    frames = torch.tensor([[[2.2, 3.0, 500.0, float("nan")]], [[1.0, 2.0, 3.0, 4.0]]])
    capped = cap_durations(frames, mask, max_token_frames=10.0, max_clip_frames=torch.tensor([12.0, 100.0]))
    # Clip 0: ceil -> 3, 3, then 10 and 10 (the per-token ceiling; NaN counts as the ceiling) = 26 > 12, so
    # every token is scaled by 12/26 and rounded down; clip 1 fits and is unchanged.
    assert capped[0, 0].tolist() == [1.0, 1.0, 4.0, 4.0] and capped[0].sum() <= 12
    assert capped[1, 0].tolist() == [1.0, 2.0, 3.0, 4.0]
    padded = cap_durations(frames[1:], torch.tensor([[[1.0, 1.0, 0.0, 0.0]]]), 10.0, torch.tensor([100.0]))
    assert padded[0, 0].tolist() == [1.0, 2.0, 0.0, 0.0]  # padding speaks for no time


def test_a_text_ceiling_grows_with_the_text():
    assert ceiling_for_text(4) == 5.0 and ceiling_for_text(400) == 100.0


def test_a_runaway_model_is_evaluated_as_broken_within_the_ceilings(prepared_demo):
    """The scenario that used to hang a feedback test for 20 minutes at 19 GB: a duration predictor that
    asks for minutes a clip. Scored (and its validation losses computed) within the caps, as broken."""
    from finetune.data.corpus import load_examples
    from finetune.data.features import FeatureConfig, Features
    from finetune.reporting.evaluation import Evaluator
    from tests.conftest import tiny_generator

    loaded = tiny_generator(prepared_demo, size="tiny")
    model = loaded.model.eval()
    blow_up(model)
    examples, _ = load_examples(prepared_demo, "metadata_val.csv", loaded.tokenizer, 256, 16000)
    result = Evaluator(examples, Features(FeatureConfig()), torch.device("cpu"), 16000, batch_size=1).evaluate(model, 0)
    assert len(result.per_clip) == len(examples)
    assert all(score.capped for score in result.per_clip.values())
    assert result.length_ratio > 1000 and not result.eligible
    assert "median length ratio" in result.ineligible_reason
    assert np.isfinite(result.val_losses["duration"])  # the training loss survives it too (spline interval)
