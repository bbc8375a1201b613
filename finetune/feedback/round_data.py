"""What a round trains on and is judged on, assembled: the corrections (prepared like the corpus, each under the
corrections' own speaker id), what they correct (finetune/feedback/focus.py), which of them are held out (by
sentence; those a voice's earlier rounds held out, again), the voice's replayed clips and its held-out clips, and
each clip's token weights: a correction teaches its reading of what it corrects and nothing else; a replayed clip
holds the voice everywhere else (its own reading of what the round corrects is the mistake the round is for).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from transformers import VitsModel, VitsTokenizer

from finetune.data import corpus, sources, speakers
from finetune.data.features import Features
from finetune.data.metadata import read_rows
from finetune.feedback import corrections, hearing
from finetune.feedback.focus import Focus, find_focus
from finetune.recipes import shared
from finetune.system import model_source
from finetune.training import context
from finetune.vits import generator, speaker_layers, synthesis


@dataclass
class RoundData:
    model: VitsModel  # the generator, ready for training
    tokenizer: VitsTokenizer
    features: Features
    corrections: corpus.Corpus  # every usable correction (rendered before and after for listening)
    held: list  # Examples: the corrections held out of the round's training, which decide
    trained: list  # Examples: the corrections it trains on
    originals: corpus.Corpus  # held-out clips of the original
    replay: list  # Examples of the original corpus
    corpus_texts: list[str]  # the voice's own sentences (its corpus's transcripts): what the text anchor holds
    prepare_report: dict
    voice: str | None  # the speaker of a multi-speaker corpus whose clips are replayed and judged
    focus: Focus  # what the corrections correct (empty: nothing shared, or a mode that does not look)
    masks: dict[str, np.ndarray]  # clip id -> [tokens] bool: the tokens that say what the round corrects
    before: dict = field(default_factory=dict)  # clip id -> differences.Reading of the start (when the focus was heard)
    before_s: float = 0.0  # seconds those renders took (what the "after" renders will take again)
    letters_later: tuple | None = None  # --timbre_first: (the embeddings' gradient mask, the rows it lets learn later)
    measure_check: str = ""  # what the check of the decision's measure on this voice found (measure_check.py)

    @property
    def hop(self) -> int:
        return self.features.config.hop_length

    @property
    def rate(self) -> int:
        return self.features.config.sample_rate


def corpus_sentences(data_dir: Path, voice: str | None) -> list[str]:
    """The voice's own transcripts (metadata.csv; its speaker's alone in a multi-speaker corpus)."""
    path = data_dir / "metadata.csv"
    if not path.is_file():
        return []
    return [text for _, who, text in read_rows(path) if voice is None or who == voice]


def texts_by_id(folder: Path) -> dict[str, str]:
    return {item: text for item, _, text in read_rows(folder / "metadata.csv")}


def token_masks(examples: list, focus: Focus, decoder: dict[int, str]) -> dict[str, np.ndarray]:
    return {e.item_id: focus.token_mask(e.token_ids, decoder) for e in examples}


def weigh_tokens(trained: list, replay: list, masks: dict[str, np.ndarray], focus: Focus, decoder) -> None:
    """Each clip's token weights for the prior's loss: a correction's on what it corrects (1) and nowhere else
    (0); a replayed clip's everywhere else (1), not on what the round corrects (0): there its recording says what
    the voice learnt wrong."""
    for example in trained:
        example.token_weights = masks[example.item_id].astype(np.float32)
    for example in replay:
        example.token_weights = (~focus.token_mask(example.token_ids, decoder)).astype(np.float32)


def enough_to_decide(focus: Focus, held: list[str], trained: list[str], count: int) -> list[str]:
    """What is too thin to learn or to decide on, each with how many more sentences to record: every focus item
    must stand in at least MIN_HELD_OUT held-out corrections and as many trained ones (texts in, by their side)."""
    problems = []
    needed = corrections.MIN_HELD_OUT
    sentences = len({corrections.sentence_key(text) for text in [*held, *trained]})
    if sentences < 2 * needed:
        return [
            f"the {count} corrections hold {sentences} different sentence{'s' if sentences != 1 else ''}: a round "
            f"learns from some and decides on others, never one sentence on both sides, so it needs at least "
            f"{2 * needed}: record {2 * needed - sentences} or more other sentences with what the voice says wrong"
        ]
    for item in focus.items():
        in_held = sum(item in focus.in_text(text) for text in held)
        in_trained = sum(item in focus.in_text(text) for text in trained)
        if in_held < needed or in_trained < needed:
            short = max(needed - in_held, 0) + max(needed - in_trained, 0)
            problems.append(
                f"{item!r} stands in {in_trained} of the corrections the round would train on and {in_held} of those "
                f"held out to decide on (at least {needed} each): record {max(short, 1)} or more sentences with "
                f"{item!r}"
            )
    if not focus:
        problems.append(
            f"the {count} corrections share no word or letter the voice's own sentences hold less often, so no "
            "mistake they correct can be learnt or judged on sentences the round did not train on: record several "
            f"sentences (at least {2 * needed}) with each word the voice says wrong"
        )
    return problems


def decide_focus(corrections_texts: list[str], corpus_texts: list[str], looks: bool, named: list[str]) -> Focus:
    """What the round corrects: as the user named it (--focus: words, and single letters), else found from the
    texts (focus.py), when the round's mode looks for it."""
    if not looks:
        return Focus()
    if named:  # a single character is a letter; name a one-letter word as "word:û"
        items = [item.lower() for item in named]
        words = tuple(i.removeprefix("word:") for i in items if len(i) > 1)
        return Focus(words, tuple(i for i in items if len(i) == 1))
    return find_focus(corrections_texts, corpus_texts)


READERS_FILE = "readers.csv"  # beside a corrections folder: id|reader, each correction's reader (--find writes it)


def readers_of(folder: Path) -> dict[str, str]:
    """Each correction's reader, by its prepared id, from READERS_FILE in the corrections folder ({}: none)."""
    path = folder / READERS_FILE
    if not path.is_file():
        return {}
    pairs = [line.split("|", 1) for line in path.read_text(encoding="utf-8").splitlines() if "|" in line]
    return {sources.safe_id(item): reader.strip() for item, reader in pairs}


def reader_names(readers: dict[str, str]) -> list[str]:
    """The readers in the order of their speaker ids (1, 2, ...): the model's speaker_names after the voice's."""
    return sorted(set(readers.values()))


def mark_speaker(examples: list, own: bool, readers: dict[str, str] | None = None) -> None:
    """The corrections under speaker ids of their own, the voice being 0: each reader `readers` names its own (1, 2,
    ... as reader_names orders them), every other correction 1."""
    names = reader_names(readers or {})
    for example in examples if own else []:
        reader = (readers or {}).get(example.item_id)
        example.speaker = 1 + names.index(reader) if reader in names else 1


def load_originals(data_dir: Path, tokenizer, features: Features, count: int, voice: str | None, run) -> corpus.Corpus:
    """The voice's held-out clips of its corpus (metadata_val.csv; its speaker's, in a multi-speaker corpus)."""
    corrections.held_out_originals(data_dir, voice)
    return corpus.load_corpus(
        data_dir,
        "metadata_val.csv",
        tokenizer,
        features,
        features.config.sample_rate,
        count,
        False,
        run.device,
        run.stop,
        speakers={voice: speakers.TARGET_SPEAKER} if voice else None,
    )


def load_round_data(config, round_: context.Run, base: Path, versions) -> RoundData:
    """Corrections prepared like the corpus (finetune/feedback/corrections.py), what they correct, which are
    held out (by sentence), the voice's held-out clips and a replay sample of its corpus. What is too thin to
    learn or to decide on stops the round here, before any training, saying how many more to record."""
    out = round_.folder / "corrections"
    prepared = (
        corrections.prepare_corrections(
            corrections.feedback_folder(config.feedback_dir),
            out,
            base,
            config.min_seconds,
            config.max_seconds,
            round_.logger,
        )
        if round_.dist.is_main
        else None
    )
    prepare_report = round_.dist.broadcast(prepared)  # the others wait for the main one's
    loaded = generator.load_generator(model_source.resolve_model(str(base)), [])
    round_.stop.check()  # loading a model takes seconds: a stop asked for meanwhile is honoured here
    model, tokenizer = generator.ready_for_training(loaded.model), loaded.tokenizer
    data_dir = Path(config.data_dir)
    voice = corrections.voice_speaker(
        data_dir, config.target_speaker, getattr(model.config, "speaker", None), int(model.config.sampling_rate)
    )
    own = config.corrections_voice == "own"
    readers = readers_of(corrections.feedback_folder(config.feedback_dir)) if own else {}
    names = reader_names(readers)
    if own:  # other people's recordings: their own speaker id (each reader's, where named), the voice its own
        model = speaker_layers.add_speakers(model, 1 + max(1, len(names)), seed=config.seed)
        speaker_layers.pin_target_speaker(model)  # the voice's own path: only the shared parts can move it
        model.config.speaker_names = [voice or "voice", *(names or ["corrections"])]
        whose = f"each of their {len(names)} readers ({READERS_FILE})" if names else "the corrections"
        round_.logger.info(
            f"speakers: {whose} train under a speaker id of their own, the replayed clips as "
            f"the voice ({voice or 'the corpus'}); the voice is judged and exported "
            "(--corrections_voice voice: the corrections are the voice's own)"
        )
    features = shared.features_for(model, round_.device)
    fixed = corpus.load_corpus(
        out, "metadata.csv", tokenizer, features, features.config.sample_rate, 0, False, round_.device, round_.stop
    )
    mark_speaker(fixed.examples, own, readers)
    texts = texts_by_id(out)
    corpus_texts = corpus_sentences(data_dir, voice)
    focus = decide_focus(
        [texts[e.item_id] for e in fixed.examples], corpus_texts, config.acoustics == "focus", config.focus
    )
    split_texts = [texts[e.item_id] for e in fixed.examples]
    before, before_s = {}, 0.0
    if focus and not config.focus:  # what the texts suggest, heard: the voice saying each correction
        if round_.dist.is_main:
            listen, started = round_.folder / "listen", round_.budget.used_s()
            before = hearing.render(
                synthesis.load_voice(base, round_.device), fixed.examples, listen, "_1_before", features
            )
            before_s = round_.budget.used_s() - started
            focus = hearing.heard_focus(focus, fixed.examples, before, getattr(tokenizer, "decoder", {}), round_.logger)
        focus = round_.dist.broadcast(focus)
    held_at, trained_at = corrections.hold_out(
        split_texts,
        config.holdout_share,
        config.seed,
        versions.held_out_sentences(),
        focus.carriers if focus else None,
    )
    held, trained = [fixed.examples[i] for i in held_at], [fixed.examples[i] for i in trained_at]
    if config.acoustics == "focus" and (config.holdout_share > 0 or not focus):
        problems = enough_to_decide(
            focus, [split_texts[i] for i in held_at], [split_texts[i] for i in trained_at], len(fixed.examples)
        )
        if problems:
            raise corrections.FeedbackError(
                f"not enough corrections to learn or to decide on what they correct ({focus.describe()}): "
                + "; ".join(problems)
            )
    if round_.dist.is_main:  # held out once, held out in every later round of this voice
        versions.hold_out_sentences({corrections.sentence_key(split_texts[i]) for i in held_at})
    originals = load_originals(data_dir, tokenizer, features, config.val_samples, voice, round_)
    replay = corrections.replay_clips(
        data_dir,
        len(trained),
        config.replay_ratio,
        config.seed,
        tokenizer,
        features.config.hop_length,
        features.config.sample_rate,
        round_.logger,
        voice,
    )
    decoder = getattr(tokenizer, "decoder", {})  # VitsTokenizer's id -> character
    masks = token_masks(fixed.examples, focus, decoder) if focus else {}
    if focus:
        weigh_tokens(trained, replay, masks, focus, decoder)
    showing = sum(bool(focus.carriers(text)) for text in split_texts) if focus else len(split_texts)
    among = f" of the {showing} that hold it" if 0 < showing < len(split_texts) else ""
    round_.logger.info(
        (f"the corrections correct {focus.describe()} (finetune/feedback/focus.py); " if focus else "")
        + f"training data: {len(trained)} corrections + {len(replay)} replayed original clips; "
        + (
            f"{len(held)} corrections{among} held out of the training to decide on, by sentence (--holdout_share "
            f"{config.holdout_share:g}; {len(versions.held_out_sentences())} sentences held out for good by this "
            "voice's rounds, this one's included)"
            if held
            else f"no correction held out ({len(fixed.examples)} came; {2 * corrections.MIN_HELD_OUT} are needed to "
            "hold some out): the round decides on those it trains on, which says they were learnt, not that the fix "
            "carries to other sentences"
        )
        + f"; {len(originals.examples)} held-out originals scored"
    )
    return RoundData(
        model,
        tokenizer,
        features,
        fixed,
        held,
        trained,
        originals,
        replay,
        corpus_texts,
        prepare_report,
        voice,
        focus,
        masks,
        before,
        before_s,
    )
