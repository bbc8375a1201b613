"""Whether the measure that decides a round sees, on the round's own voice and by the round's own correctors, a
letter said as another, found before the round trains (as judge_check.py does for the judges; the rung pair of
bench/deciding_measures.py's letter ladders).

The starting voice says each correction it will train on as it is and with one common letter said as another:
the corrections' commonest letter outside what they correct (the voice says it right, or the recordings would be
correcting it) replaced, one token for one, by their next commonest, each DRAWS times. The focus ratio on that
letter's frames (measures.focus_over_sentence: their distance to the recording over the sentence's median frame)
should be higher on the swapped readings, beyond the noise, paired clip by clip. A measure that cannot tell a
letter said right from one said as another, on this voice by these correctors, is not shown to see a fix either:
the round says so before it trains (its log, at once, and its report), while the user can still stop it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from finetune.reporting import measures
from finetune.system.time_limit import TimeLimit
from finetune.training.selection import paired
from finetune.vits import synthesis
from finetune.vits.inference import ceiling_for_text, speak

DRAWS = 2  # readings of each sentence, as it is and swapped: their focus ratios averaged
SEED = 31_337  # the check's draws, apart from the evaluations'


@dataclass(frozen=True)
class MeasureCheck:
    sees: bool  # the swapped readings' focus ratio on the ladder's letter is higher beyond the noise
    done: bool  # every sentence was read in the time given (a check cut short says nothing either way)
    text: str  # what was found, in words


def letter_pair(examples: list, masks: dict, decoder: dict) -> tuple[int, int] | None:
    """(the token of the commonest letter the corrections say outside what they correct, the token of the next
    commonest, said instead of it); None when they say fewer than two such letters."""
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
    common = [token for token, _ in counts.most_common(2)]
    return (common[0], common[1]) if len(common) == 2 else None


def swapped(token_ids: np.ndarray, mask: np.ndarray, substitute: int) -> np.ndarray:
    """The sentence's tokens with each one `mask` marks replaced by `substitute` (the same length, so the mask
    stays on the same tokens)."""
    ids = np.array(token_ids, copy=True)
    ids[np.asarray(mask, dtype=bool)] = substitute
    return ids


def log_mel(features, audio: np.ndarray, device) -> np.ndarray:
    """Audio [samples] in [-1, 1] as a log-mel [n_mels, frames]."""
    return features.mel(torch.from_numpy(audio).float().unsqueeze(0).to(device))[0].cpu().numpy()


def focus_ratio(voice, token_ids: np.ndarray, mask: np.ndarray, references: list, features, seed: int) -> float:
    """One draw of the voice saying `token_ids`: the focus ratio against a recording's warped references."""
    ceiling_s = ceiling_for_text(len(token_ids)) / voice.model.speaking_rate
    speech = speak(voice.model, [token_ids], voice.device, seed, [ceiling_s], speaker=voice.speaker)
    mel = log_mel(features, speech.waveforms[0], voice.device)
    if not np.isfinite(mel).all():
        return math.nan
    per_frame = measures.frame_distances(mel, references)
    return measures.focus_over_sentence(per_frame, np.repeat(np.asarray(mask, dtype=bool), speech.token_frames[0]))


def check(
    voice, examples: list, masks: dict, decoder: dict, features, limit: TimeLimit, stop=None, references=None
) -> MeasureCheck:
    """The check on the corrections a round trains on (`examples`; `masks`: clip id -> the tokens it corrects),
    inside `limit`; `stop` (a StopRequest) is honoured between sentences. `references(example)`: its recording's
    warped cepstra (the round's evaluator keeps them for its evaluations: made once); made here without it."""
    pair = letter_pair(examples, masks, decoder)
    if pair is None:
        return MeasureCheck(False, False, "not checked: the corrections hold too few other letters to swap")
    letter, instead = pair
    said = f"'{decoder.get(letter, '?')}' said as '{decoder.get(instead, '?')}'"
    as_is, otherwise, done = {}, {}, True
    for index, example in enumerate(examples):
        marked = np.asarray(example.token_ids) == letter
        if example.item_id in masks:
            marked &= ~np.asarray(masks[example.item_id], dtype=bool)
        if not marked.any():
            continue
        if stop is not None:
            stop.check()
        if limit.left_s() <= 0:
            done = False
            break
        warped = (
            references(example)
            if references
            else measures.warped_references(
                example.audio / 32768.0, voice.sample_rate, lambda audio: log_mel(features, audio, voice.device)
            )
        )
        changed = swapped(example.token_ids, marked, instead)
        seeds = [SEED + 1_000 * draw + index for draw in range(DRAWS)]
        ratios = [
            [focus_ratio(voice, ids, marked, warped, features, s) for s in seeds]
            for ids in (example.token_ids, changed)
        ]
        if all(math.isfinite(r) for pair in ratios for r in pair):
            as_is[example.item_id], otherwise[example.item_id] = (float(np.mean(r)) for r in ratios)
    if not done:
        return MeasureCheck(False, False, f"not checked in the time given ({len(as_is)} sentences read)")
    seen = paired(otherwise, as_is)  # how much lower the voice's own reading's ratio is than the swapped one's
    before = float(np.mean(list(as_is.values()))) if as_is else math.nan
    after = float(np.mean(list(otherwise.values()))) if otherwise else math.nan
    figures = f"x{before:.3f} -> x{after:.3f} the rest ({seen.describe().replace(' dB', '')})"
    if seen.beyond_noise:
        return MeasureCheck(True, True, f"the focus ratio, which decides, sees {said} on this voice: {figures}")
    return MeasureCheck(
        False,
        True,
        f"the focus ratio, which decides, cannot tell {said} from the voice's own reading on this voice by these "
        f"correctors ({figures})",
    )


SHARE, MOST_S = 0.1, 120.0  # of the round's budget left, at most


def before_training(round_, data, base: Path, references=None) -> None:
    """`check` for a round (a context.Run; its round_data.RoundData; `base`: its starting voice's folder;
    `references`: as `check` takes them), before it trains, on its main process: said in the log at once (a
    measure that cannot tell, with what to do, while the user can still stop the round) and kept in `data` for
    the report. The decision stays the same test: a measure that cannot see a change makes a rejection likelier,
    never an acceptance likelier than its 5%."""
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
        references,
    )
    took = f" ({clock.now() - started:.1f}s)"
    if found.sees or not found.done:
        round_.logger.info(f"the decision's measure, checked on this voice: {found.text}{took}")
    else:
        round_.logger.warning(
            f"warning: {found.text}{took}: a fix may go unseen and the round be rejected whatever it learns. Stop it "
            "now (Ctrl-C) and record more sentences with what they correct (more clips narrow the noise), or let it run"
        )
    data.measure_check = found.text
