"""What the voice says of each correction, heard against its recording: the renders a round writes to listen/
(before and after), the distance of each synthesised frame to the recording (finetune/feedback/differences.py),
the words said differently, and what the corrections share kept where the voice says it differently (focus.py).
"""

from __future__ import annotations

from pathlib import Path

import torch

from finetune.data import audio
from finetune.feedback import differences
from finetune.feedback.corrections import FeedbackError
from finetune.feedback.focus import SAID_DIFFERENTLY, confirmed
from finetune.reporting import measures
from finetune.vits.inference import ceiling_for_text
from finetune.vits.inference import speak as speak_bounded


def render(voice, examples: list, folder: Path, suffix: str, features) -> dict[str, differences.Reading]:
    """<id><suffix>.wav of the voice saying each correction, and how far each of its frames is from the
    recording (differences.py)."""
    folder.mkdir(parents=True, exist_ok=True)
    found = {}
    for example in examples:
        ceiling_s = ceiling_for_text(len(example.token_ids)) / voice.model.speaking_rate
        speech = speak_bounded(voice.model, [example.token_ids], voice.device, 0, [ceiling_s], speaker=voice.speaker)
        wave = speech.waveforms[0]
        audio.write_pcm16(folder / f"{example.item_id}{suffix}.wav", wave, voice.sample_rate)
        mel = lambda a: features.mel(torch.from_numpy(a).float().unsqueeze(0).to(voice.device))[0].cpu().numpy()  # noqa: E731
        references = measures.warped_references(example.audio / 32768.0, voice.sample_rate, mel)
        found[example.item_id] = differences.Reading(
            measures.frame_distances(mel(wave), references), speech.token_frames[0]
        )
    return found


def words_said(readings: dict, examples: list, decoder) -> dict[str, list]:
    """Each correction's words with how far the voice says them from its recording (differences.py)."""
    return {
        e.item_id: differences.word_distances(
            readings[e.item_id].per_frame, readings[e.item_id].token_frames, e.token_ids, decoder
        )
        for e in examples
        if e.item_id in readings
    }


def heard_focus(focus, examples: list, readings: dict, decoder, logger):
    """What the texts suggest, kept where the voice says it further from the recordings than the rest of their
    sentences (focus.confirmed), said in the log with each item's figure."""
    relative = {
        item: [
            differences.relative_distance(
                readings[e.item_id].per_frame,
                readings[e.item_id].token_frames,
                focus.only(item).token_mask(e.token_ids, decoder),
            )
            for e in examples
            if e.item_id in readings
        ]
        for item in focus.items()
    }
    kept, medians = confirmed(focus, relative)
    heard = ", ".join(f"{item!r} x{median:.2f}" for item, median in medians.items())
    logger.info(
        f"what the corrections share, heard: {heard} the rest of their sentences (kept from x{SAID_DIFFERENTLY:g}): {kept.describe()}"
    )
    if focus and not kept:
        raise FeedbackError(
            f"the corrections share {focus.describe()}, but the voice says {'it' if len(focus.items()) == 1 else 'them'} "
            f"as the recordings do ({heard} further from them than the rest of their sentences; from x"
            f"{SAID_DIFFERENTLY:g} it counts as said differently): there is nothing to correct there that can be heard. "
            f"Name what the voice says wrong with --focus ({' '.join(focus.items())}) to correct it anyway"
        )
    return kept


def said_differently(examples: list, before: dict, after: dict) -> list[str]:
    """A line a correction: the words the voice said differently from its recording, before -> after."""
    return [
        f"  {e.item_id}: {differences.describe(differences.said_differently(before.get(e.item_id, [])))} -> "
        f"{differences.describe(differences.said_differently(after.get(e.item_id, [])))}"
        for e in examples
    ]
