"""Whether the measure that decides a round sees, on the round's own voice and corrections, the kind of change it
is there to see, found before the round trains (as judge_check.py does for the judges).

The starting voice says each correction it will train on as it is and with what the round corrects said otherwise
(each of its letters replaced, one token for one, by the corrections' commonest letter outside it: a letter said
as another), each DRAWS times; the focus ratio (measures.focus_over_sentence: the focus frames' distance to the
recording over the sentence's median frame) of the swapped readings should be higher, beyond the noise, paired
clip by clip. A measure that cannot tell a letter said as another from the voice's own reading, on this voice by
these correctors, will likely reject the round whatever it learns: the round says so before it trains (its log,
at once, and its report), while the user can still stop it and record more.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from finetune.reporting import measures
from finetune.reporting.selection import paired
from finetune.system.time_limit import TimeLimit
from finetune.vits import synthesis
from finetune.vits.inference import ceiling_for_text, speak

DRAWS = 2  # readings of each sentence, as it is and swapped: their focus ratios averaged
SEED = 31_337  # the check's draws, apart from the evaluations'


@dataclass(frozen=True)
class MeasureCheck:
    sees: bool  # the swapped readings' focus ratio is higher beyond the noise
    done: bool  # every sentence was read in the time given (a check cut short says nothing either way)
    text: str  # what was found, in words


def substitute_letter(examples: list, masks: dict, decoder: dict) -> int | None:
    """The token of the commonest letter the corrections say outside what they correct (and that is not one of
    those letters); None when there is none."""
    focus_chars = {
        decoder.get(int(t), "")
        for e in examples
        if e.item_id in masks
        for t in np.asarray(e.token_ids)[np.asarray(masks[e.item_id], dtype=bool)]
    }
    counts = Counter(
        int(t)
        for e in examples
        for t, marked in zip(e.token_ids, masks.get(e.item_id, np.zeros(len(e.token_ids), dtype=bool)))
        if not marked and decoder.get(int(t), "").isalpha() and decoder.get(int(t), "") not in focus_chars
    )
    return counts.most_common(1)[0][0] if counts else None


def swapped(token_ids: np.ndarray, mask: np.ndarray, substitute: int, decoder: dict) -> np.ndarray:
    """The sentence's tokens with each letter `mask` marks replaced by `substitute` (blanks and the rest as they
    are: the same length, so the focus stays on the same tokens)."""
    ids = np.array(token_ids, copy=True)
    letters = np.asarray(mask, dtype=bool) & np.array([decoder.get(int(t), "").isalpha() for t in ids])
    ids[letters] = substitute
    return ids


def focus_ratio(voice, token_ids: np.ndarray, mask: np.ndarray, references: list, features, seed: int) -> float:
    """One draw of the voice saying `token_ids`: the focus ratio against a recording's warped references."""
    ceiling_s = ceiling_for_text(len(token_ids)) / voice.model.speaking_rate
    speech = speak(voice.model, [token_ids], voice.device, seed, [ceiling_s], speaker=voice.speaker)
    mel = features.mel(torch.from_numpy(speech.waveforms[0]).float().unsqueeze(0).to(voice.device))[0].cpu().numpy()
    if not np.isfinite(mel).all():
        return math.nan
    per_frame = measures.frame_distances(mel, references)
    return measures.focus_over_sentence(per_frame, np.repeat(np.asarray(mask, dtype=bool), speech.token_frames[0]))


def check(voice, examples: list, masks: dict, decoder: dict, features, limit: TimeLimit, stop=None) -> MeasureCheck:
    """The check on the corrections a round trains on (`examples`; `masks`: clip id -> the tokens it corrects),
    inside `limit`; `stop` (a StopRequest) is honoured between sentences."""
    substitute = substitute_letter(examples, masks, decoder)
    if substitute is None:
        return MeasureCheck(False, False, "not checked: the corrections hold no other letter to say instead")
    as_is, otherwise, done = {}, {}, True
    mel = lambda audio: features.mel(torch.from_numpy(audio).float().unsqueeze(0).to(voice.device))[0].cpu().numpy()  # noqa: E731
    for index, example in enumerate(examples):
        mask = masks.get(example.item_id)
        if mask is None or not np.asarray(mask, dtype=bool).any():
            continue
        if stop is not None:
            stop.check()
        if limit.left_s() <= 0:
            done = False
            break
        references = measures.warped_references(example.audio / 32768.0, voice.sample_rate, mel)
        changed = swapped(example.token_ids, mask, substitute, decoder)
        seeds = [SEED + 1_000 * draw + index for draw in range(DRAWS)]
        ratios = [
            [focus_ratio(voice, ids, mask, references, features, s) for s in seeds]
            for ids in (example.token_ids, changed)
        ]
        if all(math.isfinite(r) for pair in ratios for r in pair):
            as_is[example.item_id], otherwise[example.item_id] = (float(np.mean(r)) for r in ratios)
    letter = decoder.get(substitute, "?")
    if not done:
        return MeasureCheck(False, False, f"not checked in the time given ({len(as_is)} sentences read)")
    seen = paired(otherwise, as_is)  # how much lower the voice's own reading's ratio is than the swapped one's
    before = float(np.mean(list(as_is.values()))) if as_is else math.nan
    after = float(np.mean(list(otherwise.values()))) if otherwise else math.nan
    figures = f"x{before:.3f} -> x{after:.3f} the rest ({seen.describe().replace(' dB', '')})"
    if seen.beyond_noise:
        return MeasureCheck(
            True, True, f"the focus ratio sees what the corrections correct said as '{letter}' on this voice: {figures}"
        )
    return MeasureCheck(
        False,
        True,
        f"the focus ratio, which decides, cannot tell what the corrections correct said as '{letter}' from the voice's "
        f"own reading of it on this voice by these correctors ({figures})",
    )


SHARE, MOST_S = 0.1, 120.0  # of the round's budget left, at most


def before_training(round_, data, base: Path) -> None:
    """`check` for a round (a shared.Run; its round_data.RoundData; `base`: its starting voice's folder), before
    it trains, on its main process: said in the log at once (a measure that cannot tell, with what to do, while
    the user can still stop the round) and kept in `data` for the report. The decision stays the same test: a
    measure that cannot see the change makes a rejection likely, never an acceptance more likely than its 5%."""
    if not round_.dist.is_main:
        return
    clock = round_.budget.clock
    started = clock.now()
    found = check(
        synthesis.load_voice(base, round_.device),
        data.trained,
        data.masks,
        getattr(data.tokenizer, "decoder", {}),
        data.features,
        TimeLimit(clock.now, started + min(MOST_S, SHARE * round_.budget.left_s())),
        round_.stop,
    )
    took = f" ({clock.now() - started:.1f}s)"
    if found.sees or not found.done:
        round_.logger.info(f"the decision's measure, checked on this voice: {found.text}{took}")
    else:
        round_.logger.warning(
            f"warning: {found.text}{took}: the round will likely be rejected whatever it learns. Stop it now (Ctrl-C) "
            "and record more sentences with what they correct (more clips narrow the noise), by readers who say it "
            "plainly, or let it run"
        )
    data.measure_check = found.text
