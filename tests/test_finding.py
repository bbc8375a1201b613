"""train_feedback.py --find: what the voice says unlike most readers (finetune/feedback/finding.py, crowd.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import train_feedback
from finetune.feedback.finding import LETTER, WORD, Heard, rank

pytestmark = pytest.mark.timeout(120)


def crowd_heard(planted: dict, accent: dict | None = None, seed: int = 0) -> list[Heard]:
    """Six readers and the voice's own, ten sentences each holding the letters a-h and the words w0-w3 (figures
    drawn around 0 with a spread of 0.2), and three pairs of the readers against each other; `planted` units stand
    out by their figure on every other reader, `accent` units on one reader alone (and on the pair with them)."""
    rng = np.random.default_rng(seed)
    units = [(LETTER, c) for c in "abcdefgh"] + [(WORD, f"w{i}") for i in range(4)]
    heard = []
    for sentence in range(10):
        for reader in ["own", *(f"r{i}" for i in range(6))]:
            own = reader == "own"
            figures = {unit: float(rng.normal(0.0, 0.2)) for unit in units}
            for unit, extra in planted.items():
                figures[unit] += 0.0 if own else extra
            for unit, extra in (accent or {}).items():
                figures[unit] += extra if reader == "r0" else 0.0
            heard.append(Heard(f"{reader}_{sentence}", reader, f"sentence {sentence}", own, figures))
        for a, b in (("r0", "r1"), ("r2", "r3"), ("r4", "r5")):  # readers against each other
            figures = {unit: float(rng.normal(0.0, 0.2)) for unit in units}
            for unit, extra in (accent or {}).items():
                figures[unit] += extra if "r0" in (a, b) else 0.0
            heard.append(Heard(f"{a}~{b}_{sentence}", f"{a}~{b}", f"sentence {sentence}", False, figures, True))
    return heard


def test_a_letter_and_a_word_said_unlike_every_other_reader_rank_first_beyond_the_noise():
    findings = rank(crowd_heard({(LETTER, "c"): 0.5, (WORD, "w2"): 0.5}))
    beyond = [(f.kind, f.unit) for f in findings if f.beyond_noise]
    assert sorted(beyond) == [(LETTER, "c"), (WORD, "w2")], [(f.unit, round(f.z, 1)) for f in findings]
    assert [(f.kind, f.unit) for f in findings[:2]] == beyond  # ranked first
    c = next(f for f in findings if f.unit == "c")
    assert c.readers == 6 and c.readers_further == 6 and c.sentences == 10 and c.own_clips == 10
    assert c.ratio == pytest.approx(np.exp(0.5), rel=0.15)


def test_what_any_two_readers_say_apart_is_not_reported():
    """A word every reader says unlike the own reader, and unlike each other as much (its reading follows each
    reader's pace): no mistake of the voice's."""
    heard = crowd_heard({(WORD, "w1"): 0.5})
    apart = [
        Heard(h.clip, h.reader, h.sentence, h.own, {**h.units, (WORD, "w1"): h.units[(WORD, "w1")] + 0.5}, True)
        for h in heard
        if h.between
    ]
    findings = rank([h for h in heard if not h.between] + apart)
    assert not any(f.beyond_noise for f in findings)
    assert rank(heard)[0].unit == "w1" and rank(heard)[0].beyond_noise  # against readers who agree, it is found


def test_nothing_planted_or_one_readers_accent_is_not_reported():
    """With nothing planted, nothing passes the bound; a letter one reader of six says otherwise, on every sentence
    (as large as a planted one a sentence), is that reader's: over readers it is one figure of six."""
    assert not any(f.beyond_noise for f in rank(crowd_heard({})))
    findings = rank(crowd_heard({}, accent={(LETTER, "e"): 3.0}))
    assert not any(f.beyond_noise for f in findings)
    e = next(f for f in findings if f.unit == "e")
    assert e.readers_further >= 1


def crafted_corpus(base: Path, data_dir: Path, letter: str | None, texts: list[str]) -> None:
    """The voice's own renders as recordings: "own" reads every sentence (held out) as the voice says it, under a
    little noise; six readers read them too, each as another speaker (the render resampled: its pitch, formants
    and tempo scaled by 0.9-1.1), with `letter`'s sound (its frames and the blanks beside it) replaced by a hiss:
    a letter each of them says otherwise, alike."""
    import soxr
    import torch

    from finetune.data.audio import write_pcm16
    from finetune.vits.inference import ceiling_for_text, speak
    from finetune.vits.synthesis import load_voice, prepare_lines

    voice = load_voice(base, torch.device("cpu"))
    decoder = {i: t for t, i in voice.tokenizer.encoder.items()}
    rng = np.random.default_rng(0)
    (data_dir / "wavs").mkdir(parents=True)
    held, trained = [], []
    for index, line in enumerate(prepare_lines(voice, [(str(i), t) for i, t in enumerate(texts)])):
        ceiling = ceiling_for_text(len(line.token_ids)) / voice.model.speaking_rate
        speech = speak(voice.model, [line.token_ids], voice.device, 0, [ceiling])  # the draw --find renders
        ends = np.cumsum(speech.token_frames[0]) * 256
        for reader, scale in (("own", 1.0), *((f"r{i}", 0.9 + 0.04 * i) for i in range(6))):
            wave = speech.waveforms[0].astype(np.float64).copy()
            for position, token in enumerate(line.token_ids):
                if reader != "own" and letter and decoder.get(int(token)) == letter:
                    start, end = int(ends[max(0, position - 2)]), int(ends[min(len(ends) - 1, position + 1)])
                    hiss = np.random.default_rng(1000 * index + position)  # each reader's alike, as the speech is
                    wave[start:end] = hiss.normal(0.0, 0.2, end - start)
            wave = soxr.resample(wave, 16000, 16000 * scale) if scale != 1.0 else wave
            wave = wave + rng.normal(0.0, 0.01, len(wave))
            item_id = f"{reader}_{index}"
            write_pcm16(data_dir / "wavs" / f"{item_id}.wav", wave.astype(np.float32), voice.sample_rate)
            held.append(f"{item_id}|{reader}|{line.text}")
        trained.append(f"own_t{index}|own|{line.text}")
    (data_dir / "metadata_val.csv").write_text("\n".join(held) + "\n", encoding="utf-8")
    (data_dir / "metadata.csv").write_text("\n".join(trained) + "\n", encoding="utf-8")


def find(base: Path, data_dir: Path, out: Path) -> dict:
    code = train_feedback.main(
        [
            "--base_model",
            str(base),
            "--data_dir",
            str(data_dir),
            "--target_speaker",
            "own",
            "--find",
            "200",
            "--find_dir",
            str(out),
            "--output_dir",
            str(out.parent / "voices"),
        ]
    )
    assert code == 0
    return json.loads((out / "findings.json").read_text(encoding="utf-8"))


def test_a_forced_mispronunciation_is_found_by_the_aligner(base_run, prepared_demo, tmp_path):
    """The voice's own renders as seven readers' recordings, six of them with one letter's sound replaced (where the
    voice timed it): --find hears each against the voice, letter by letter, and ranks that letter first among the
    letters, beyond the noise, with a page to listen to and the sentences to review; with nothing replaced,
    nothing is beyond the noise."""
    from finetune.data.metadata import read_metadata

    base = base_run / "checkpoints" / "best_model"
    texts = [text for _, text in read_metadata(prepared_demo / "metadata.csv")][:16]
    counts = {c: sum(c in t.lower() for t in texts) for c in set("".join(texts).lower()) if c.isalpha()}
    letter = max(sorted(counts), key=lambda c: (6 <= counts[c] <= 11, counts[c]))  # in some sentences, not all
    crafted_corpus(base, tmp_path / "planted", letter, texts)
    found = find(base, tmp_path / "planted", tmp_path / "find")
    letters = [f for f in found["findings"] if f["kind"] == LETTER]
    assert letters[0]["unit"] == letter and letters[0]["beyond_noise"], letters[:3]
    assert letters[0]["readers"] == 6 and found["own_clips"] == len(texts) and found["readers"] == 6
    page = (tmp_path / "find" / "findings.html").read_text(encoding="utf-8")
    assert f"<b>{letter}</b>" in page and page.count("<audio") >= 4
    review = (tmp_path / "find" / "review.txt").read_text(encoding="utf-8").splitlines()
    assert review and all(letter in line.lower() for line in review if line)
    corrections = (tmp_path / "find" / "corrections" / "metadata.csv").read_text(encoding="utf-8").splitlines()
    assert corrections and all(letter in line.split("|")[1].lower() for line in corrections)
    assert all(
        (tmp_path / "find" / "corrections" / "wavs" / f"{line.split('|')[0]}.wav").is_file() for line in corrections
    )
    # The same readers with nothing replaced: nothing beyond the noise.
    crafted_corpus(base, tmp_path / "nothing", None, texts)
    nothing = find(base, tmp_path / "nothing", tmp_path / "find_nothing")
    assert not any(f["beyond_noise"] for f in nothing["findings"]), nothing["findings"][:3]
    assert not (tmp_path / "find_nothing" / "corrections").exists()


def test_find_refuses_a_corpus_without_other_readers(base_run, tmp_path):
    """A corpus of one voice has no readers to compare with: refused, naming what to give, before anything is heard
    or written (the script prints the message and exits 1: finetune/cli.py, run_script)."""
    from finetune.feedback.corrections import FeedbackError

    single = tmp_path / "single"
    (single / "wavs").mkdir(parents=True)
    (single / "metadata.csv").write_text("a|Ez baş im.\nb|Tu çawa yî?\n", encoding="utf-8")
    argv = ["--base_model", str(base_run / "checkpoints" / "best_model"), "--data_dir", str(single)]
    argv += ["--find", "50", "--find_dir", str(tmp_path / "find"), "--output_dir", str(tmp_path / "voices")]
    with pytest.raises(FeedbackError, match=r"other readers.*--speaker_column"):
        train_feedback.main(argv)
    assert not (tmp_path / "find").exists()


def test_the_crowds_corrections_train_each_reader_under_a_speaker_id_of_their_own(tmp_path):
    """--find's corrections name each clip's reader (readers.csv): a round gives each reader its own speaker id, in
    the order of their names (the model's speaker_names after the voice's); a correction it does not name, and
    every correction of a folder without readers.csv, is 1; the voice's own recordings (--corrections_voice
    voice) stay 0."""
    from types import SimpleNamespace

    from finetune.feedback.round_data import mark_speaker, readers_of

    (tmp_path / "readers.csv").write_text("c1|ana\nc2|bo\nc 3.wav|ana\n", encoding="utf-8")
    readers = readers_of(tmp_path)
    assert readers == {"c1": "ana", "c2": "bo", "c_3": "ana"}
    examples = [SimpleNamespace(item_id=i, speaker=0) for i in ("c1", "c2", "c_3", "c4")]
    mark_speaker(examples, True, readers)
    assert [e.speaker for e in examples] == [1, 2, 1, 1]
    mark_speaker(examples, True, readers_of(tmp_path / "none"))
    assert [e.speaker for e in examples] == [1, 1, 1, 1]
    voice = [SimpleNamespace(item_id="c1", speaker=0)]
    mark_speaker(voice, False, readers)
    assert voice[0].speaker == 0


def test_the_time_it_takes_says_where_the_limit_ends_it_first():
    """Once the first clips are timed the user is told how long the whole will take; where --find_minutes ends it
    first, after about how many clips and which flag hears them all."""
    from finetune.feedback.crowd import time_it_takes

    within = time_it_takes(0.5, 300, 180.0)
    assert "about 2.5 min for the 300 clips" in within and "--find_minutes" not in within
    beyond = time_it_takes(2.0, 300, 180.0)
    assert "about 10.0 min for the 300 clips" in beyond
    assert "--find_minutes 3 ends it after about 90 of them" in beyond
