"""The voice a user corrects, made for bench/bench_corrections.py: one whose mistakes came from its data.

A user's voice is a pretrained voice fine-tuned for hours on their recordings; where those recordings (or the
pretrained model) say a letter or a word unlike its transcript, the voice learnt to say it so. Here, in little:

1. The demo corpus (five espeak-ng readers who say every letter right) trains a tiny voice from new weights
   (the pretrained start).
2. One reader (TARGET_READER, an espeak-ng voice the demo corpus does not hold) records demo/sentences.txt with
   the MISTAKES spoken into the audio (every x said as k, every ş as s, the word "min" as "man"), while each
   transcript keeps what the sentence says: the user's corpus. The pretrained voice is fine-tuned on it for
   --voice_hours, and learns the mistakes.
3. Other readers (CORRECTORS, espeak-ng voices neither corpus holds) record the corrections: sentences with a
   mistake, said right.

Each sentence has one role (assign_roles): the voice's corpus (trained on; its held-out clips gate a round), a
case's corrections, a case's unseen sentences (the judge's: no step of the run or the round sees them), or the
judge's other sentences (without any mistake: does the rest of the voice stay). The judge hears the unseen
sentences against two readings by the voice's own reader: right, and with the mistake.

Needs espeak-ng (apt-get install espeak-ng).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent

# espeak-ng voice, words a minute, pitch 0-99: the user's recorder, and the app's users who record corrections
TARGET_READER = ("ku+m2", 150, 45)
CORRECTORS = (("ku+m1", 125, 20), ("ku+f3", 190, 80), ("ku+m7", 160, 55))


@dataclass(frozen=True)
class Mistake:
    """What the voice's recordings say unlike their transcripts: `right` said as `said`; a letter everywhere it
    stands, or a whole word (the letters in it right elsewhere)."""

    right: str
    said: str

    @property
    def kind(self) -> str:
        return "letter" if len(self.right) == 1 else "word"

    @property
    def name(self) -> str:
        return f"{self.right}:{self.said}"

    def pattern(self) -> re.Pattern:
        if self.kind == "letter":
            return re.compile(re.escape(self.right))
        return re.compile(rf"(?<!\w){re.escape(self.right)}(?!\w)")

    def found_in(self, text: str) -> bool:
        return bool(self.pattern().search(text.lower()))

    def spoken(self, text: str) -> str:
        """The sentence as the mistaken recording says it."""
        return self.pattern().sub(self.said, text.lower())


DEFAULT_MISTAKES = ("x:k", "ş:s", "min:man")


def parse_mistakes(names: list[str]) -> list[Mistake]:
    mistakes = []
    for name in names:
        right, _, said = name.partition(":")
        if not right or not said or right == said:
            raise SystemExit(f"--mistakes {name}: RIGHT:SAID, e.g. x:k (a letter) or min:man (a word)")
        mistakes.append(Mistake(right.lower(), said.lower()))
    return mistakes


def with_mistakes(text: str, mistakes: list[Mistake]) -> str:
    for mistake in mistakes:
        text = mistake.spoken(text)
    return text


def read_sentences() -> list[str]:
    lines = (REPO / "demo" / "sentences.txt").read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


@dataclass
class Roles:
    voice: list[int]  # sentence indices the voice's corpus holds (read with the mistakes)
    voice_held_out: list[int]  # its held-out clips (no mistake): what a round's gate hears
    corrections: dict[str, list[int]]  # a case's corrections, by mistake name
    unseen: dict[str, list[int]]  # a case's unseen sentences (the judge's), by mistake name
    other: list[int]  # the judge's sentences without any mistake


def assign_roles(
    sentences: list[str], mistakes: list[Mistake], corrections: int, unseen: int, held_out: int, other: int
) -> Roles:
    """Each sentence one role, with no random draw: for each mistake (rarest first), its sentences that hold no
    other mistake go first to its unseen sentences, then its corrections (every other one, so both spread over
    the file); sentences without a mistake give the judge's other sentences and the voice's held-out clips
    (every 7th and every 11th); everything else is the voice's corpus, where it learns the mistakes."""
    taken: set[int] = set()
    roles = Roles([], [], {}, {}, [])
    holds = [[m.found_in(s) for m in mistakes] for s in sentences]
    order = sorted(mistakes, key=lambda m: sum(m.found_in(s) for s in sentences))
    for mistake in order:
        k = mistakes.index(mistake)
        alone = [i for i, h in enumerate(holds) if h[k] and sum(h) == 1 and i not in taken]
        roles.unseen[mistake.name] = alone[1::2][:unseen]
        roles.corrections[mistake.name] = [i for i in alone[0::2] if i not in roles.unseen[mistake.name]][:corrections]
        taken |= set(roles.unseen[mistake.name]) | set(roles.corrections[mistake.name])
    clean = [i for i, h in enumerate(holds) if not any(h) and i not in taken]
    roles.other = clean[::7][:other]
    roles.voice_held_out = [i for i in clean[3::11] if i not in roles.other][:held_out]
    taken |= set(roles.other) | set(roles.voice_held_out)
    roles.voice = [i for i in range(len(sentences)) if i not in taken]
    return roles


# espeak-ng's phoneme mnemonics (`espeak-ng -x`) of the bench's letters, each a pattern that finds the letter's
# phoneme alone (ş's S, not the S of ç's tS): what the judge's mistaken reading swaps where espeak-ng's reading of
# the mistaken text changes more than the letter
LETTER_PHONEMES = {"x": ("x", "x"), "k": ("k", "k"), "ş": ("(?<!t)S", "S"), "s": ("s", "s")}


def phonemes(text: str, reader: tuple[str, int, int]) -> list[str]:
    """espeak-ng's phoneme mnemonics of a text as `reader` says it, a string a clause."""
    command = ["espeak-ng", "-v", reader[0], "-q", "-x", text]
    try:
        found = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    except FileNotFoundError as error:
        raise SystemExit("the learnt-error voice needs espeak-ng (apt-get install espeak-ng)") from error
    return [line.strip() for line in found.splitlines() if line.strip()]


def letters_swapped(clauses: list[str], mistakes: list[Mistake]) -> list[str] | None:
    """The clauses' phonemes with each letter mistake's phoneme said as its said letter's (None: a letter the
    bench has no phoneme for)."""
    for mistake in [m for m in mistakes if m.kind == "letter"]:
        if mistake.right not in LETTER_PHONEMES or mistake.said not in LETTER_PHONEMES:
            return None
        pattern, said = LETTER_PHONEMES[mistake.right][0], LETTER_PHONEMES[mistake.said][1]
        clauses = [re.sub(pattern, said, clause) for clause in clauses]
    return clauses


def as_phoneme_input(clauses: list[str], text: str) -> str:
    """espeak-ng input that says `clauses` (phoneme mnemonics) with the text's clause punctuation after each (its
    pauses and intonation: the same sentence read from its text and from this differ by a sample)."""
    marks = re.findall(r"[,.;:!?]+", text)
    return " ".join(f"[[{clause}]]{marks[i] if i < len(marks) else ''}" for i, clause in enumerate(clauses))


def mistaken_reading(text: str, mistakes: list[Mistake], reader: tuple[str, int, int]) -> str:
    """What the judge's reader is given to say a sentence with the mistakes: the mistaken text, unless espeak-ng
    reads it with more changed than the letters (its dictionary reads "xwe" as xw'8 and "kwe" as kw'E#, a vowel
    apart; "xêr" as x'eR and "kêr" as c'eR): then the right text's phonemes (the word mistakes applied) with the
    letters' swapped, so that the reading differs from the right one where the letter stands and nowhere else."""
    words_said = with_mistakes(text, [m for m in mistakes if m.kind == "word"])
    expected = letters_swapped(phonemes(words_said, reader), mistakes)
    mistaken = with_mistakes(text, mistakes)
    if expected is None or expected == phonemes(mistaken, reader):
        return mistaken
    return as_phoneme_input(expected, text)


def espeak(text: str, reader: tuple[str, int, int], path: Path) -> None:
    voice, speed_wpm, pitch = reader
    command = ["espeak-ng", "-v", voice, "-s", str(speed_wpm), "-p", str(pitch), "-w", str(path), text]
    try:
        subprocess.run(command, check=True, capture_output=True)
    except FileNotFoundError as error:
        raise SystemExit("the learnt-error voice needs espeak-ng (apt-get install espeak-ng)") from error


def write_rows(path: Path, rows: list[tuple[str, str]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{item}|{text}\n" for item, text in rows), encoding="utf-8")


def record(folder: Path, rows: list[tuple[str, str, tuple]], espeak_ng: bool = True) -> None:
    """wavs/<id>.wav of each (id, what is said, reader). Without espeak-ng (the smoke run), each sentence's demo
    corpus recording as it is (wavs/<id>.mp3: whoever reads it, the mistake unsaid): the pipeline runs, its figures
    mean nothing."""
    (folder / "wavs").mkdir(parents=True, exist_ok=True)
    for item, spoken, reader in rows:
        if not espeak_ng:
            demo = REPO / "demo" / "corpus" / "wavs" / f"kmr_demo_{int(item[1:]):04d}.mp3"
            shutil.copy(demo, folder / "wavs" / f"{item}.mp3")
            continue
        path = folder / "wavs" / f"{item}.wav"
        if not path.is_file():
            espeak(spoken, reader, path)


def make_sources(
    work: Path, mistakes: list[Mistake], roles: Roles, sentences: list[str], espeak: bool = True
) -> dict[str, Path]:
    """The recordings, in the layouts the tools take (LJSpeech: wavs/ + metadata.csv, to be prepared):

    user_corpus/             the voice's corpus: read with the mistakes, transcripts right (metadata.csv; and
                             the held-out clips' ids in held_out.txt)
    corrections_<name>/      a case's corrections: other readers, said right
    judge/right, judge/mistaken   the unseen sentences and the other sentences by the voice's own reader:
                             right, and as the mistakes say them, nothing else changed (mistaken_reading;
                             with_<name>.csv, other.csv)"""
    corpus = work / "user_corpus"
    ids = {i: f"s{i + 1:03d}" for i in range(len(sentences))}
    voice_rows = sorted(roles.voice + roles.voice_held_out)
    record(corpus, [(ids[i], with_mistakes(sentences[i], mistakes), TARGET_READER) for i in voice_rows], espeak)
    write_rows(corpus / "metadata.csv", [(ids[i], sentences[i]) for i in voice_rows])
    (corpus / "held_out.txt").write_text("".join(f"{ids[i]}\n" for i in roles.voice_held_out), encoding="utf-8")
    folders = {"user_corpus": corpus}
    for mistake in mistakes:
        folder = work / f"corrections_{safe(mistake.name)}"
        chosen = roles.corrections[mistake.name]
        record(folder, [(ids[i], sentences[i], CORRECTORS[n % len(CORRECTORS)]) for n, i in enumerate(chosen)], espeak)
        write_rows(folder / "metadata.csv", [(ids[i], sentences[i]) for i in chosen])
        folders[f"corrections_{mistake.name}"] = folder
    judged = sorted({i for rows in roles.unseen.values() for i in rows} | set(roles.other))
    mistaken = (lambda s: mistaken_reading(s, mistakes, TARGET_READER)) if espeak else None
    for reading, text_of in (("right", lambda s: s), ("mistaken", mistaken)):
        folder = work / "judge" / reading
        record(folder, [(ids[i], text_of(sentences[i]) if espeak else "", TARGET_READER) for i in judged], espeak)
        write_rows(folder / "metadata.csv", [(ids[i], sentences[i]) for i in judged])
        for mistake in mistakes:
            write_rows(
                folder / f"with_{safe(mistake.name)}.csv", [(ids[i], sentences[i]) for i in roles.unseen[mistake.name]]
            )
        write_rows(folder / "other.csv", [(ids[i], sentences[i]) for i in roles.other])
        folders[f"judge_{reading}"] = folder
    return folders


def safe(name: str) -> str:
    """A mistake's name as a folder name: z:s -> z_s."""
    return name.replace(":", "_")


def counts(roles: Roles) -> dict:
    return {
        "voice": len(roles.voice),
        "voice_held_out": len(roles.voice_held_out),
        "other": len(roles.other),
        **{f"corrections {k}": len(v) for k, v in roles.corrections.items()},
        **{f"unseen {k}": len(v) for k, v in roles.unseen.items()},
    }


def share_said(sentences: list[str], indices: list[int], mistake: Mistake) -> float:
    """The share of the voice's training sentences that hold the mistake: how often it heard it."""
    return float(np.mean([mistake.found_in(sentences[i]) for i in indices])) if indices else 0.0
