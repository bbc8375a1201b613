"""What a round of corrections is about: the words and letters its corrections share that the voice's own corpus
holds less often, and, in each clip, the tokens that say them (what a round learns from and is judged on).

A user records corrections of what the voice says wrong: many sentences with the word or the letter it gets
wrong, each otherwise ordinary. So what the corrections hold far more often than the voice's own sentences is
what they correct:

    a word    in at least MIN_SENTENCES corrections and MIN_WORD_SHARE of them, and in a share of the corrections
              at least WORD_RATIO times its share of the corpus's sentences (a function word in every fifth sentence
              of both is not one)
    a letter  in at least MIN_SENTENCES corrections and MIN_LETTER_SHARE of them, its share of their letters at
              least LETTER_RATIO times its share of the corpus's; counted with the focus words taken out, so that a
              corrected word does not make its letters look corrected everywhere

Token ids in, as the VITS tokenizer makes them (a blank between characters): `decoder` maps an id to its character.
A letter's tokens are its own and the blanks either side (the transitions into and out of it); a word's, every
token from the blank before it to the blank after it.

What the texts suggest is then heard (`confirmed`): the voice says each correction, and an item stays only where
the voice says it further from the recordings than the rest of their sentences (finetune/feedback/differences.py:
across speakers, so the correctors' timbre raises every frame alike): a word that merely comes with the corrected
one ("li" beside "ser") is said as the correctors say it, and falls out.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass

import numpy as np

MIN_SENTENCES = 3  # fewer corrections cannot show anything shared (nor hold some out to decide on)
SAID_DIFFERENTLY = 1.2  # an item the voice says this many times further from the recordings than the rest of a
# sentence (its median over the corrections that hold it) is one it says wrong
MIN_WORD_SHARE = 0.2
WORD_RATIO = 3.0
MIN_LETTER_SHARE = 0.8  # a letter the corrections are about stands in nearly every one of them
LETTER_RATIO = 2.0
WORD = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*")  # letters, with inner apostrophes and hyphens


def words_of(text: str) -> list[str]:
    return WORD.findall(text.lower())


@dataclass(frozen=True)
class Focus:
    """The words and letters a round's corrections are about (each a string of the text's characters)."""

    words: tuple[str, ...] = ()
    letters: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.words or self.letters)

    def describe(self) -> str:
        parts = [f"the word{'s' if len(self.words) > 1 else ''} {', '.join(repr(w) for w in self.words)}"] * bool(
            self.words
        ) + [f"the letter{'s' if len(self.letters) > 1 else ''} {', '.join(repr(c) for c in self.letters)}"] * bool(
            self.letters
        )
        return " and ".join(parts) or "nothing shared"

    def items(self) -> list[str]:
        return [*self.words, *self.letters]

    def only(self, item: str) -> "Focus":
        """The focus on one of its items (a word stays a word, however short)."""
        return Focus((item,), ()) if item in self.words else Focus((), (item,))

    def carriers(self, text: str) -> set[str]:
        """The words of a sentence that say a focus item: a focus word, or a word with a focus letter in it."""
        return {
            w for w in words_of(text) if w in self.words or any(c in strip_words(w, self.words) for c in self.letters)
        }

    def in_text(self, text: str) -> list[str]:
        """The focus items a sentence holds."""
        words = set(words_of(text))
        return [w for w in self.words if w in words] + [c for c in self.letters if c in strip_words(text, self.words)]

    def token_mask(self, token_ids: np.ndarray, decoder: dict[int, str]) -> np.ndarray:
        """[tokens] bool: the tokens that say a focus word or letter (with the blanks around them)."""
        chars = [decoder.get(int(t), "") for t in token_ids]
        mask = np.zeros(len(token_ids), dtype=bool)
        text_positions = [i for i, c in enumerate(chars) if c and c != "<pad>"]
        text = "".join(chars[i] for i in text_positions).lower()
        for word in self.words:
            for match in re.finditer(rf"(?<!\w){re.escape(word)}(?!\w)", text):
                first, last = text_positions[match.start()], text_positions[match.end() - 1]
                mask[max(0, first - 1) : min(len(mask), last + 2)] = True
        in_words = mask.copy()
        for letter in self.letters:
            for position in text_positions:
                if chars[position].lower() == letter and not in_words[position]:
                    mask[max(0, position - 1) : min(len(mask), position + 2)] = True
        return mask


def strip_words(text: str, words: tuple[str, ...]) -> str:
    """The text, lower case, with the given words taken out."""
    text = text.lower()
    for word in words:
        text = re.sub(rf"(?<!\w){re.escape(word)}(?!\w)", " ", text)
    return text


def find_focus(corrections: list[str], corpus: list[str]) -> Focus:
    """The words, then the letters, that `corrections` (their texts) hold far more often than `corpus` does."""
    if len(corrections) < MIN_SENTENCES:
        return Focus()
    words = shared_words(corrections, corpus)
    letters = shared_letters([strip_words(t, words) for t in corrections], [strip_words(t, words) for t in corpus])
    return Focus(words, letters)


def shared_words(corrections: list[str], corpus: list[str]) -> tuple[str, ...]:
    held = Counter(w for text in corrections for w in set(words_of(text)))
    usual = Counter(w for text in corpus for w in set(words_of(text)))
    count, total = len(corrections), max(1, len(corpus))
    found = [
        w
        for w, n in held.items()
        if n >= MIN_SENTENCES and n / count >= MIN_WORD_SHARE and n / count >= WORD_RATIO * usual[w] / total
    ]
    return tuple(sorted(found, key=lambda w: (-held[w], w)))


def shared_letters(corrections: list[str], corpus: list[str]) -> tuple[str, ...]:
    def letter_shares(texts: list[str]) -> dict[str, float]:
        counts = Counter(c for text in texts for c in text if c.isalpha())
        total = sum(counts.values()) or 1
        return {c: n / total for c, n in counts.items()}

    held_in = Counter(c for text in corrections for c in set(text) if c.isalpha())
    wanted, usual = letter_shares(corrections), letter_shares(corpus)
    count = len(corrections)
    found = [
        c
        for c, share in wanted.items()
        if held_in[c] >= MIN_SENTENCES
        and held_in[c] / count >= MIN_LETTER_SHARE
        and share >= LETTER_RATIO * usual.get(c, 0.0)
    ]
    return tuple(sorted(found, key=lambda c: (-held_in[c], c)))


def confirmed(focus: Focus, relative: dict[str, list[float]], ratio: float = SAID_DIFFERENTLY) -> tuple[Focus, dict]:
    """The items the voice says differently (the median of their relative distances, differences.py, at least
    `ratio`), and each item's median, for the log."""
    medians = {item: float(np.nanmedian(values)) if values else float("nan") for item, values in relative.items()}
    keep = {item for item, median in medians.items() if median >= ratio}
    return Focus(tuple(w for w in focus.words if w in keep), tuple(c for c in focus.letters if c in keep)), medians
