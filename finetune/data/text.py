"""Text normalisation the way the model's tokenizer expects it, with nothing deleted silently.

The MMS tokenizer lower-cases and then drops every character outside its `vocab.json`. Dropping
punctuation is harmless, but dropping a letter or a digit changes what the clip says: the model would
learn to say "2024" as nothing. So this normaliser:

- applies Unicode NFC and maps typographic variants (curly quotes, dashes) to the vocabulary's forms;
- lower-cases characters the vocabulary does not hold in upper case;
- removes punctuation, symbols and control characters (counted, so reports can show them);
- reports every letter or digit the vocabulary lacks (`oov`), so the caller can drop the clip and say
  why, or the user can extend the vocabulary.

A vocabulary of None is the "open" vocabulary used when training from scratch: every lower-case letter
is allowed, plus space, apostrophe and hyphen; digits are still reported (they need writing out as words).
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

# Typographic variants and the plain character they stand for.
TYPOGRAPHIC = {"’": "'", "‘": "'", "ʼ": "'", "`": "'", "´": "'", "–": "-", "—": "-", "‐": "-", "‑": "-"}
OPEN_VOCABULARY_EXTRAS = frozenset(" '-")


@dataclass(frozen=True)
class TextCheck:
    """What normalisation did to one text."""

    text: str  # normalised text ('' when nothing sayable is left)
    oov: tuple[str, ...]  # letters/digits the vocabulary lacks, in order of first appearance
    removed: tuple[str, ...]  # punctuation and symbols removed, one entry per occurrence


def _is_letter(char: str) -> bool:
    return unicodedata.category(char)[0] in ("L", "M")


def _is_digit(char: str) -> bool:
    return unicodedata.category(char)[0] == "N"


class TextNormalizer:
    """Callable: raw text -> TextCheck. `vocabulary` is the set of single characters the model knows."""

    def __init__(self, vocabulary: set[str] | frozenset[str] | None):
        self.vocabulary = frozenset(vocabulary) if vocabulary is not None else None

    def knows(self, char: str) -> bool:
        if self.vocabulary is None:  # lower-case letters only, as MMS vocabularies are
            return (_is_letter(char) and char == char.lower()) or char in OPEN_VOCABULARY_EXTRAS
        return char in self.vocabulary

    def _map_char(self, char: str) -> str:
        if self.knows(char):
            return char
        plain = TYPOGRAPHIC.get(char)
        if plain is not None and self.knows(plain):
            return plain
        if char.isspace():
            return " "
        lower = char.lower()
        return lower if len(lower) == 1 else char

    def __call__(self, raw: str) -> TextCheck:
        text = unicodedata.normalize("NFC", raw)
        kept, oov, removed = [], [], []
        for char in text:
            char = self._map_char(char)
            if self.knows(char):
                kept.append(char)
            elif _is_letter(char) or _is_digit(char):
                if char not in oov:
                    oov.append(char)
            elif char == " ":
                kept.append(" ")  # a separator even when the vocabulary has no space
            else:
                removed.append(char)  # deleted, as the tokenizer does at inference: same text both ways
        joined = re.sub(r"\s+", " ", "".join(kept)).strip()
        if self.vocabulary is not None and " " not in self.vocabulary:
            joined = joined.replace(" ", "")
        return TextCheck(text=joined, oov=tuple(oov), removed=tuple(removed))


def describe_oov(chars: tuple[str, ...] | list[str]) -> str:
    """('7', 'x') -> "digits '7' (write numbers out as words); letters 'x' (U+0078)"."""
    digits = [c for c in chars if _is_digit(c)]
    others = [c for c in chars if not _is_digit(c)]
    parts = []
    if digits:
        parts.append("digits " + ", ".join(repr(c) for c in digits) + " (write numbers out as words)")
    if others:
        parts.append("letters " + ", ".join(f"{c!r} (U+{ord(c):04X})" for c in others))
    return "; ".join(parts)


def vocabulary_from_texts(texts: list[str]) -> list[str]:
    """The sorted set of characters in already-normalised texts (for a model trained from scratch)."""
    return sorted(set("".join(texts)))
