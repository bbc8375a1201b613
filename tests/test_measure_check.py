"""The check of the decision's measure on the round's own voice, before it trains (finetune/feedback/measure_check.py)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from finetune.data.examples import Example
from finetune.feedback import measure_check
from finetune.system.time_limit import TimeLimit

DECODER = {0: "_", 1: "a", 2: "b", 3: "s", 4: "ş", 5: " ", 6: "e"}


def example(item_id: str, text_ids: list[int]) -> Example:
    """Tokens with blanks between the characters (as the VITS tokenizer adds them), a second of quiet audio."""
    ids = [0]
    for t in text_ids:
        ids += [t, 0]
    return Example(item_id, np.array(ids, dtype=np.int32), np.zeros(16000, dtype=np.int16))


def test_the_ladder_swaps_the_commonest_letter_outside_the_focus_for_the_next_and_keeps_the_length():
    examples = [example("c0", [1, 4, 1, 5, 2]), example("c1", [6, 4, 1, 1])]  # "aşa b", "eşaa"
    masks = {e.item_id: np.isin(np.arange(len(e.token_ids)), [2, 3, 4]) for e in examples}  # ş and its blanks
    letter, instead = measure_check.letter_pair(examples, masks, DECODER)
    assert DECODER[letter] == "a" and DECODER[instead] in ("b", "e")  # letters outside the focus (a space is none)
    marked = examples[0].token_ids == letter
    changed = measure_check.swapped(examples[0].token_ids, marked, instead)
    assert len(changed) == len(examples[0].token_ids)
    assert [DECODER[int(t)] for t in changed[1::2]] == [DECODER[instead], "ş", DECODER[instead], " ", "b"]
    assert changed[0::2].tolist() == examples[0].token_ids[0::2].tolist()  # the blanks as they were
    only_focus = [example("c2", [4, 4, 1])]
    assert measure_check.letter_pair(only_focus, {"c2": np.isin(np.arange(7), [1, 2, 3, 4])}, DECODER) is None


def forced_ratios(monkeypatch, gap: float) -> None:
    """The voice's focus ratio on a sentence: 1.2 as it is, 1.2 + `gap` with the ladder's letter swapped, each
    clip and draw a little apart (the state the check reads, forced; the synthesis is not what is tested here)."""
    calls = {"n": 0}

    def ratio(voice, token_ids, mask, references, features, seed):
        calls["n"] += 1
        swapped = any(DECODER[int(t)] != "a" for t in token_ids[np.asarray(mask, dtype=bool)])  # the ladder's letter
        return 1.2 + (gap if swapped else 0.0) + float(np.random.default_rng(calls["n"]).uniform(0.0, 0.05))

    monkeypatch.setattr(measure_check, "focus_ratio", ratio)
    monkeypatch.setattr(measure_check.measures, "warped_references", lambda audio, rate, mel: [])


def sentences(count: int) -> tuple[list[Example], dict]:
    examples = [example(f"c{i}", [1 + (i % 2), 4, 1, 5, 6, 3][: 4 + i % 3]) for i in range(count)]
    masks = {e.item_id: np.isin(np.arange(len(e.token_ids)), [2, 3, 4]) for e in examples}
    return examples, masks


VOICE = SimpleNamespace(device=torch.device("cpu"), sample_rate=16000)


class Features:
    @staticmethod
    def mel(audio):
        return torch.zeros(1, 80, 10)


def test_the_check_sees_a_letter_said_as_another_only_beyond_the_noise():
    """Forced readings: a swapped letter 0.3 further than the voice's own reading, on 8 sentences, is seen; one
    0.005 further (within the draws' spread) is not, said with its figures; out of time, nothing is claimed."""
    examples, masks = sentences(8)
    with pytest.MonkeyPatch.context() as patch:
        forced_ratios(patch, 0.3)
        seen = measure_check.check(VOICE, examples, masks, DECODER, Features(), TimeLimit.none())
    assert seen.sees and seen.done and "sees 'a' said as '" in seen.text
    assert "on 8 clips" in seen.text and " dB" not in seen.text
    with pytest.MonkeyPatch.context() as patch:
        forced_ratios(patch, 0.005)
        blind = measure_check.check(VOICE, examples, masks, DECODER, Features(), TimeLimit.none())
    assert not blind.sees and blind.done and "cannot tell" in blind.text and "noise bound" in blind.text
    with pytest.MonkeyPatch.context() as patch:
        forced_ratios(patch, 0.3)
        late = measure_check.check(VOICE, examples, masks, DECODER, Features(), TimeLimit(lambda: 10.0, 5.0))
    assert not late.sees and not late.done and "not checked in the time given" in late.text


def test_the_check_on_a_real_voice_reads_every_sentence_on_two_draws_and_gives_a_finite_figure(prepared_demo):
    """The tiny voice, unforced: each sentence that holds the ladder's letter read as it is and swapped, two draws
    each (4 syntheses a sentence), and a paired figure either way."""
    from finetune.data.corpus import load_examples
    from finetune.data.features import FeatureConfig
    from finetune.data.features import Features as MelFeatures
    from tests.conftest import tiny_generator

    loaded = tiny_generator(prepared_demo)
    examples, _ = load_examples(
        prepared_demo, "metadata.csv", loaded.tokenizer, hop=256, sample_rate=16000, max_samples=4
    )
    decoder = loaded.tokenizer.decoder
    letter = next(t for t in examples[0].token_ids[1::2] if decoder.get(int(t), "").isalpha())
    masks = {e.item_id: e.token_ids == letter for e in examples if (e.token_ids == letter).any()}
    spoken = []
    real_speak = measure_check.speak

    def counted(*args, **kwargs):
        spoken.append(args[1][0])
        return real_speak(*args, **kwargs)

    voice = SimpleNamespace(model=loaded.model.eval(), device=torch.device("cpu"), sample_rate=16000, speaker=None)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measure_check, "speak", counted)
        found = measure_check.check(voice, examples, masks, decoder, MelFeatures(FeatureConfig()), TimeLimit.none())
    assert found.done and spoken and len(spoken) % 4 == 0
    assert "clips" in found.text and not math.isnan(float(found.text.split("x")[1].split(" ")[0]))
