"""The inference settings fitted to held-out recordings: one request speaks at their tempo, steadily, and
the exported config.json carries them (stock transformers reads them)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from finetune.vits.inference import duration_draws
from finetune.vits.tempo_fit import MAX_RATE, MIN_RATE, fit_tempo
from tests.conftest import tiny_generator

TEXTS = ["ez baş im", "av zelal e", "rojbaş", "tu çawa yî", "ez diçim malê", "baran dibare"]


@pytest.fixture(scope="module")
def voice(prepared_demo):
    loaded = tiny_generator(prepared_demo, size="tiny")
    ids = [np.asarray(loaded.tokenizer(text)["input_ids"]) for text in TEXTS]
    return loaded.model.eval(), loaded.tokenizer, ids


def test_the_fit_makes_the_typical_request_as_long_as_the_recordings(voice):
    model, _, ids = voice
    cpu = torch.device("cpu")
    at_own = np.median(duration_draws(model, ids, cpu, seed=3, draws=16), axis=1)
    recorded = [int(f) for f in np.round(0.8 * at_own)]  # the recordings are faster than the model speaks them
    fit = fit_tempo(model, ids, recorded, cpu, seed=0)
    assert fit.before.length_ratio == pytest.approx(1.25, rel=0.15)
    assert 0.95 <= fit.after.length_ratio <= 1.05
    # Fresh draws at the fitted settings (another seed), one a sentence as an app makes them: the same tempo.
    heard = (
        duration_draws(
            model,
            ids,
            cpu,
            seed=99,
            draws=16,
            noise_scale_duration=fit.noise_scale_duration,
            speaking_rate=fit.speaking_rate,
        )
        / np.asarray(recorded)[:, None]
    )
    assert 0.9 <= np.median(heard) <= 1.1
    assert (model.speaking_rate, model.noise_scale_duration) == (
        fit.own["speaking_rate"],
        fit.own["noise_scale_duration"],
    )
    assert fit.noise_scale == model.noise_scale and "->" in fit.describe()
    assert not fit.after_in_sample and "not fitted on" in fit.describe()  # 6 clips: each half fitted on the other


def test_the_after_figure_is_out_of_sample_or_says_it_is_not(voice, monkeypatch):
    """On the clips it was fitted on, the length is x1.00 by construction: each half of the clips is heard at
    settings fitted on the other half instead (the config gets the fit on all of them). Too few clips to
    split: the figure is in-sample, and says so."""
    from finetune.vits import tempo_fit

    model, _, ids = voice
    cpu = torch.device("cpu")
    recorded = [int(f) for f in np.round(0.8 * np.median(duration_draws(model, ids, cpu, seed=3, draws=16), axis=1))]
    fits, real = [], tempo_fit.settings_for
    monkeypatch.setattr(tempo_fit, "settings_for", lambda clips, *a: fits.append(list(clips)) or real(clips, *a))
    fit = tempo_fit.fit_tempo(model, ids, recorded, cpu, seed=0)
    assert fits == [[0, 1, 2, 3, 4, 5], [1, 3, 5], [0, 2, 4]]  # the config's fit, then each half's for the other
    assert not fit.after_in_sample and 0.9 <= fit.after.length_ratio <= 1.1
    assert fit.to_dict()["after_measured_on"].startswith("clips it was not fitted on")
    fits.clear()
    few = tempo_fit.fit_tempo(model, ids[:3], recorded[:3], cpu, seed=0)
    assert fits == [[0, 1, 2]] and few.after_in_sample and "fitted on (too few" in few.describe()


def test_the_noise_is_narrowed_only_as_far_as_the_spread_needs(voice):
    model, _, ids = voice
    cpu = torch.device("cpu")
    recorded = [int(f) for f in np.median(duration_draws(model, ids, cpu, seed=3, draws=16), axis=1)]
    loose = fit_tempo(model, ids, recorded, cpu, seed=0, max_spread=100.0)
    assert loose.noise_scale_duration == 0.8  # any spread passes: the widest draw (MMS's default) is kept
    tight = fit_tempo(model, ids, recorded, cpu, seed=0, max_spread=1.0001)
    assert tight.noise_scale_duration < loose.noise_scale_duration  # none passes: the steadiest
    assert tight.after.draw_spread <= loose.after.draw_spread


def test_a_voice_far_from_its_recordings_is_held_at_the_limit_and_said(voice):
    model, _, ids = voice
    recorded = [10 * len(i) * 40 for i in ids]  # recordings far longer than any setting makes it
    fit = fit_tempo(model, ids, recorded, torch.device("cpu"), seed=0)
    assert fit.speaking_rate == MIN_RATE and "needs more training" in fit.note
    assert MIN_RATE < MAX_RATE and fit_tempo(model, [], [], torch.device("cpu"), seed=0) is None


def test_the_exported_config_speaks_with_the_fitted_settings(voice, tmp_path):
    from transformers import VitsModel

    from finetune.vits.voice_on_disk import export_model

    model, tokenizer, _ = voice
    export_model(
        model,
        tokenizer,
        tmp_path / "voice",
        inference={"speaking_rate": 0.83, "noise_scale_duration": 0.5, "noise_scale": model.noise_scale},
    )
    config = json.loads((tmp_path / "voice" / "config.json").read_text())
    assert (config["speaking_rate"], config["noise_scale_duration"]) == (0.83, 0.5)
    loaded = VitsModel.from_pretrained(tmp_path / "voice")
    assert (loaded.speaking_rate, loaded.noise_scale_duration) == (0.83, 0.5)
    assert model.config.speaking_rate == 1.0 and model.speaking_rate == 1.0  # the training model is untouched


def test_the_sampler_draws_what_the_stock_predictor_draws(voice):
    """DurationSampler encodes the texts once and draws a grid of settings in one pass: with one setting, its
    draws are duration_draws' (transformers' own predictor) for the same seed; with several, each setting's
    are draws at that setting, and a subset of the clips is measured as if alone."""
    from finetune.vits.inference import DurationSampler

    model, _, ids = voice
    cpu = torch.device("cpu")
    sampler = DurationSampler(model, ids, cpu, draws=6)
    for clips, noise, rate in (([0, 1, 2, 3, 4, 5], 0.8, 1.0), ([1, 3], 0.333, 1.3), ([4], 0.5, 0.7)):
        stock = duration_draws(
            model, [ids[i] for i in clips], cpu, 11, 6, noise_scale_duration=noise, speaking_rate=rate
        )
        mine = sampler.frames(clips, [noise], rate, 11)
        assert mine.shape == (1, len(clips), 6)
        np.testing.assert_allclose(mine[0], stock, atol=1.0)  # a frame apart at most: a ceil on float noise
    grid = sampler.frames([0, 1, 2, 3, 4, 5], [0.8, 0.2, 0.0], 1.0, 11)
    spread = [np.median(np.std(np.log(g), axis=1)) for g in grid]
    assert spread[0] > spread[1] > spread[2] == 0.0  # narrower noise, steadier draws; none: every draw alike
    deterministic = duration_draws(model, ids, cpu, 11, 1, noise_scale_duration=0.0)
    np.testing.assert_allclose(grid[2][:, 0], deterministic[:, 0], atol=1.0)
