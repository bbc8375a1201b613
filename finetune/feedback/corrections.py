"""A feedback round's data: the user's corrected recordings, prepared like the corpus, and a replay
sample of the original corpus against forgetting (train_feedback.py).

Corrections come as a recording app saves them, pairs `<name>.wav` + `<name>.txt` (any audio format and
rate), or in the LJSpeech layout (`wavs/` + `metadata.csv`). They are prepared with the starting model's
vocabulary and rate, into the round's folder; a bad one is dropped with its reason, as in preparation.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import numpy as np

from finetune.data import prepare, prepared_folder, sources
from finetune.data.corpus import load_examples
from finetune.data.metadata import read_rows
from finetune.data.speakers import clip_hours
from finetune.data.text import TextNormalizer
from finetune.system import model_source
from finetune.system.errors import ToolError

FEEDBACK_DIRS = ("training/feedback", "feedback")  # where corrections are looked for, in order


class FeedbackError(ToolError):
    """A round (or a rollback) cannot run as asked; the message says what to do."""


def feedback_folder(feedback_dir: str | None) -> Path:
    """--feedback_dir, else the first of FEEDBACK_DIRS that exists."""
    if feedback_dir:
        return Path(feedback_dir)
    for candidate in FEEDBACK_DIRS:
        if Path(candidate).is_dir():
            return Path(candidate)
    raise FeedbackError(
        f"no corrections: record them into {FEEDBACK_DIRS[0]}/ as pairs <name>.wav + <name>.txt "
        "(or wavs/ + metadata.csv), or pass --feedback_dir"
    )


def corrections_source(folder: Path) -> sources.Source:
    """The corrections in either layout: LJSpeech (metadata.csv + wavs/) or audio + .txt pairs."""
    try:
        if (folder / "metadata.csv").is_file() or not folder.is_dir():
            source = sources.ljspeech_source(folder, flag="--feedback_dir")
        elif sources.looks_like_pairs(folder):
            source = sources.pairs_source(folder, flag="--feedback_dir")
        else:
            raise FeedbackError(
                f"{folder} holds no corrections: expected pairs <name>.wav + <name>.txt, or wavs/ + "
                "metadata.csv (see train_feedback.py --review)"
            )
    except sources.SourceError as error:
        raise FeedbackError(str(error)) from error
    if source.count == 0:
        raise FeedbackError(
            f"{folder}/metadata.csv lists no corrections: record some first (see train_feedback.py --review)"
        )
    return source


def prepare_corrections(
    folder: Path, out: Path, base_model: Path, min_seconds: float, max_seconds: float, logger
) -> dict:
    """The corrections in `folder` prepared like the corpus (the base model's vocabulary and rate) into
    `out`; returns the preparation report. FeedbackError when none is usable."""
    source = corrections_source(folder)
    model = model_source.resolve_model(str(base_model))
    settings = prepare.ClipSettings(
        sample_rate=model_source.model_sample_rate(model),
        trim_db=40.0,
        trim_margin_s=0.05,
        peak=0.95,
        min_seconds=min_seconds,
        max_seconds=max_seconds,
    )
    preparer = prepare.Preparer(out, TextNormalizer(model_source.model_vocabulary(model)), settings, num_workers=1)
    report = prepared_folder.write_outputs(out, preparer.run(source), 0.0, {"source": source.description})
    logger.info(
        f"corrections: {report['counts']['kept']} of {report['counts']['items']} usable"
        + "".join(f"; {d['id']} dropped: {d['reason']} ({d['detail']})" for d in report["dropped"])
    )
    if not report["counts"]["kept"]:
        raise FeedbackError(
            f"none of the corrections in {folder} can be used; reasons are in {out}/prepare_report.json"
        )
    return report


MIN_HELD_OUT = 3  # corrections held out to decide on, and left to train on: fewer cannot tell their noise


def sentence_key(text: str) -> str:
    """A sentence as the split compares it: lower case, its words alone (punctuation and spacing aside)."""
    return " ".join(re.findall(r"\w+", text.lower()))


def hold_out(
    texts: list[str], share: float, seed: int, held_before: set[str] = frozenset(), carriers=None
) -> tuple[list[int], list[int]]:
    """(held out, trained): indices of the corrections (their texts), split by sentence, never one sentence on both
    sides. Sentences the voice's earlier rounds held out (`held_before`, sentence_keys) are held out again; then
    sentences drawn with `seed` until `share` of the corrections (at least MIN_HELD_OUT) are held out, as many at
    least left to train on. `carriers(text)`: the words of a sentence that say what the round corrects; the share
    is of the corrections with some (--find's corrections of a letter and a word, a round on the word: a share of
    all 96 held out all 36 with the word, and none was left to learn it from), those sentences are drawn first
    (the held-out ones must show the fix), and a sentence is held out only while each of those words that other
    corrections hold too stays held out in about `share` of its sentences, the rest left to train on, as a split
    stratified by word would (drawn as they came, the bench's 24 corrections of x held out all four with "xwe", the
    commonest word with x, and the round never learnt it: bench/log/2026-12-05.md); where that leaves too few held
    out, the others drawn follow in the same order. None held out (`share` 0, or too few sentences): the round then
    decides on those it trained on, which says they were learnt, not that the fix carries."""
    groups: dict[str, list[int]] = {}
    for index, text in enumerate(texts):
        groups.setdefault(sentence_key(text), []).append(index)
    held_keys = [key for key in groups if key in held_before]  # held out once, held out for good
    if share > 0:
        fresh = [key for key in groups if key not in held_before]
        words = {key: carriers(key) if carriers else set() for key in groups}
        relevant = [key for key in fresh if carriers is None or words[key]] or fresh
        # the share of the corrections that can show the fix: those of other mistakes decide nothing here
        showing = sum(len(groups[key]) for key in groups if carriers is None or words[key]) or len(texts)
        wanted = max(MIN_HELD_OUT, round(share * showing))
        sentences = Counter(w for key in groups for w in words[key])
        most = {w: min(n - 1, max(1, round(share * n))) for w, n in sentences.items()}  # held out of a word's n
        held_with = Counter(w for key in held_keys for w in words[key])
        kept_back = []
        for position in np.random.default_rng(seed).permutation(len(relevant)):
            key = relevant[position]
            if sum(len(groups[k]) for k in held_keys) >= wanted:
                break
            if any(sentences[w] > 1 and held_with[w] >= most[w] for w in words[key]):  # the word's share is out
                kept_back.append(key)
                continue
            held_keys.append(key)
            held_with.update(words[key])
        for key in kept_back:  # too few held out that way: the others drawn, in the same order
            if sum(len(groups[k]) for k in held_keys) >= wanted:
                break
            held_keys.append(key)
    held = {i for key in held_keys for i in groups[key]}
    if len(held) < MIN_HELD_OUT or len(texts) - len(held) < MIN_HELD_OUT:  # too few to decide on, or to learn from
        held = {i for key in groups if key in held_before for i in groups[key]}
    return sorted(held), [i for i in range(len(texts)) if i not in held]


def replay_sample(item_ids: list[str], corrections: int, ratio: float, seed: int) -> list[str]:
    """`ratio` original clips per correction (all of them when there are fewer), drawn with `seed`."""
    wanted = min(len(item_ids), int(round(ratio * corrections)))
    chosen = np.random.default_rng(seed).choice(len(item_ids), size=wanted, replace=False)
    return [item_ids[i] for i in sorted(chosen)]


def replay_clips(
    data_dir: Path,
    corrections: int,
    ratio: float,
    seed: int,
    tokenizer,
    hop: int,
    sample_rate: int,
    logger,
    speaker: str | None = None,
) -> list:
    """The original corpus's replay sample as examples (none with `ratio` 0, said as a warning): clips of
    `speaker` only when the corpus has several."""
    if ratio == 0:
        logger.warning("warning: --replay_ratio 0: training on the corrections alone risks forgetting the rest")
        return []
    if not (data_dir / "metadata.csv").is_file():
        raise FeedbackError(
            f"{data_dir}/metadata.csv not found: the original corpus is needed for replay "
            "(--data_dir), or pass --replay_ratio 0"
        )
    rows = [(i, text) for i, who, text in read_rows(data_dir / "metadata.csv") if speaker is None or who == speaker]
    chosen = set(replay_sample([i for i, _ in rows], corrections, ratio, seed))
    examples, _ = load_examples(data_dir, "metadata.csv", tokenizer, hop, sample_rate, only_ids=chosen)
    return examples


def held_out_originals(data_dir: Path, speaker: str | None = None) -> None:
    """The original corpus's held-out clips (of `speaker`, when it has several) must exist: they show whether
    a round damaged the rest, or moved the voice."""
    path = data_dir / "metadata_val.csv"
    if not path.is_file() or not [r for r in read_rows(path) if speaker is None or r[1] == speaker]:
        whose = f" of speaker {speaker}" if speaker else ""
        raise FeedbackError(
            f"{path} is missing or has no clips{whose}: held-out original clips are needed to check "
            "that nothing else got worse (prepare the corpus with --val_fraction > 0)"
        )


def voice_speaker(data_dir: Path, asked: str | None, exported_for: str | None, sample_rate: int = 16000) -> str | None:
    """Whose clips of a multi-speaker corpus are the voice's: --target_speaker, else the speaker the base
    model was exported for; None for a single-speaker corpus. A FeedbackError when neither names one of
    its speakers."""
    path = data_dir / "metadata.csv"
    if not path.is_file():
        return None  # replay_clips says what is missing
    rows = read_rows(path)
    clips = Counter(speaker for _, speaker, _ in rows)
    if set(clips) == {""}:
        if asked:
            raise FeedbackError(f"--target_speaker {asked}: {path} names no speakers (one voice); leave it out")
        return None
    wanted = asked or exported_for
    if wanted not in clips:
        hours = clip_hours(data_dir, rows, sample_rate)  # ranked as train_vits.py picks its default target
        by_hours = sorted(clips, key=lambda name: (-hours.get(name, 0.0), name))
        top = ", ".join(f"{s} ({hours.get(s, 0.0):.2f} h, {clips[s]} clips)" for s in by_hours[:5])
        why = (
            f"--target_speaker {asked} is not one of them"
            if asked
            else f"the base model was exported for {exported_for}, not one of them"
            if exported_for
            else "the base model names none of them"
        )
        raise FeedbackError(
            f"{path} has {len(clips)} speakers and {why}: name the voice with --target_speaker (most hours, the "
            f"one a default train_vits.py run speaks as first: {top})"
        )
    return wanted
