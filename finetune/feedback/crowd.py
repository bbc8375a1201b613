"""train_feedback.py --find: the corpus's other readers heard against the voice, and what it says unlike them.

A sample of the clips the voice did not train on (other readers', spread over them; held-out clips first, and
the training clips of readers the voice's run left out), and of its own reader's held-out clips: the voice says
each sentence once (the same draw for every reader of it), each clip is compared with it (finding.py), and the
letters and words it says unlike most readers are ranked. Bounded: at most --find clips, at most
--find_minutes (what was heard by then is ranked), a progress bar, a stop request honoured between clips; the
time it will take is said once the first clips are timed.

Written to --find_dir: findings.json (every unit judged, with its figures), findings.html (those beyond the
noise first, each with the voice and up to three readers on the same sentence to listen to), review.txt (the
corpus's sentences that hold what was found, for `train_feedback.py --review`), corrections/ (the crowd's clips
that hold it, as a round's corrections) and audio/.
"""

from __future__ import annotations

import html
import json
import random
import shutil
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from finetune.data import audio
from finetune.data.metadata import read_rows
from finetune.feedback import finding
from finetune.feedback.corrections import FeedbackError
from finetune.reporting import measures
from finetune.vits.inference import ceiling_for_text
from finetune.vits.inference import speak as speak_bounded

OWN_SHARE = 0.25  # of the clips heard, at most this share the voice's own reader's held-out ones
OWN_AT_LEAST = 8  # and at least this many of them, where held out
TIMED_AFTER = 5  # clips heard before the time the rest will take is said
SHOWN_READERS = 3  # readers beside the voice on a finding's sentence in findings.html
BETWEEN_PAIRS = 3  # pairs of readers of one sentence compared with each other
PROGRESS_EVERY_S = 30.0  # without a terminal (no progress bar), a progress line this often


@dataclass(frozen=True)
class Clip:
    item_id: str
    reader: str
    text: str
    own: bool


def trained_readers(base: Path) -> set[str]:
    """The readers whose training clips the voice's run trained on besides its own: a conditioned run's (the
    speakers.json it exported beside the voice), else none."""
    names = base / "multi_speaker" / "speakers.json"
    if not names.is_file():
        return set()
    return set(json.loads(names.read_text(encoding="utf-8"))["speakers"])


def pick_clips(data_dir: Path, voice: str | None, trained: set[str], count: int, seed: int) -> list[Clip]:
    """Up to `count` clips: the voice's own reader's held-out ones (OWN_SHARE), then other readers' it did not
    train on, a reader at a time in turn (one reader's many clips do not fill the sample), each reader's sentences
    that other readers read too first (they compare the readers with each other)."""
    if voice is None:
        raise FeedbackError(
            f"--find compares the voice with the corpus's other readers: {data_dir}/metadata.csv names no speakers "
            "(one voice). Prepare a corpus with several readers (prepare_data.py --speaker_column) as --data_dir"
        )
    held = read_rows(data_dir / "metadata_val.csv") if (data_dir / "metadata_val.csv").is_file() else []
    trained_rows = read_rows(data_dir / "metadata.csv")
    rng = random.Random(seed)
    own = [Clip(i, s, t, True) for i, s, t in held if s == voice]
    rng.shuffle(own)
    if len(own) < 2:
        raise FeedbackError(
            f"--find needs at least 2 held-out clips of the voice's reader ({voice}) in {data_dir}/metadata_val.csv, "
            f"found {len(own)}: prepare the corpus with a larger --val_fraction"
        )
    by_reader: dict[str, list[Clip]] = defaultdict(list)
    for rows, untrained in ((held, lambda s: True), (trained_rows, lambda s: s not in trained)):
        for item_id, speaker, text in rows:
            if speaker != voice and untrained(speaker):
                by_reader[speaker].append(Clip(item_id, speaker, text, False))
    if not by_reader:
        raise FeedbackError(
            f"--find: {data_dir} holds no clips of other readers that the voice did not train on (its run trained on "
            "every reader's training clips, and none are held out): prepare the corpus with a larger --val_fraction"
        )
    own = own[: max(OWN_AT_LEAST, int(OWN_SHARE * count))]
    shared = defaultdict(set)  # a sentence's readers: those read by two or more are heard first (crowd.between_readers)
    for reader, clips in by_reader.items():
        for clip in clips:
            shared[clip.text].add(reader)
    for clips in by_reader.values():
        rng.shuffle(clips)
        clips.sort(key=lambda clip: len(shared[clip.text]) > 1)  # popped from the end: the shared ones first
    crowd, readers = [], sorted(by_reader)
    while len(crowd) < count - len(own) and any(by_reader.values()):
        for reader in readers:
            if by_reader[reader] and len(crowd) < count - len(own):
                crowd.append(by_reader[reader].pop())
    return own + crowd


class Renders:
    """The voice saying each sentence once (seeded: the same draw for every reader of it), kept for the page."""

    def __init__(self, voice, features, folder: Path):
        self.voice, self.features, self.folder, self.made = voice, features, folder, {}

    def mel(self, wave):
        samples = torch.from_numpy(wave).float().unsqueeze(0).to(self.voice.device)
        return self.features.mel(samples)[0].cpu().numpy()

    def of(self, token_ids) -> tuple:
        key = tuple(int(t) for t in token_ids)
        if key not in self.made:
            voice = self.voice
            ceiling_s = ceiling_for_text(len(token_ids)) / voice.model.speaking_rate
            speech = speak_bounded(voice.model, [token_ids], voice.device, 0, [ceiling_s], speaker=voice.speaker)
            name = f"voice_{len(self.made):04d}.wav"
            audio.write_pcm16(self.folder / name, speech.waveforms[0], voice.sample_rate)
            self.made[key] = (self.mel(speech.waveforms[0]), speech.token_frames[0], name)
        return self.made[key]


def hear(clip: Clip, data_dir: Path, renders: Renders, token_ids, decoder) -> tuple[finding.Heard, str, tuple]:
    """One clip against the voice saying its sentence; the voice's render's file name; where the clip's frames
    fell on the voice's, and the sentence's tokens (for the comparisons between readers)."""
    samples, rate = audio.read_pcm16(data_dir / "wavs" / f"{clip.item_id}.wav")
    mel, token_frames, name = renders.of(token_ids)
    references = measures.warped_references(samples.astype("float32") / 32768.0, rate, renders.mel)
    per_frame, paired, cepstra = measures.aligned_frames(mel, references)
    units = finding.units_heard(per_frame, token_frames, token_ids, decoder)
    heard = finding.Heard(clip.item_id, clip.reader, clip.text, clip.own, units)
    return heard, name, (paired, cepstra, token_frames, token_ids)


def between_readers(heard: list[finding.Heard], placed: dict, decoder) -> list[finding.Heard]:
    """Two readers of one sentence compared with each other on the voice's frames (each placed where its own path to
    the voice put it): how far any two people say each letter and word apart (BETWEEN_PAIRS a sentence at most)."""
    by_sentence: dict[str, list[finding.Heard]] = defaultdict(list)
    for h in heard:
        if not h.own:
            by_sentence[h.sentence].append(h)
    found = []
    for sentence, readers in by_sentence.items():
        pairs = [(a, b) for i, a in enumerate(readers) for b in readers[i + 1 :] if a.reader != b.reader]
        for a, b in pairs[:BETWEEN_PAIRS]:
            (paired_a, cepstra_a, token_frames, token_ids), (paired_b, cepstra_b, *_) = placed[a.clip], placed[b.clip]
            per_frame = measures.MCD_SCALE * np.linalg.norm(cepstra_a[:, paired_a] - cepstra_b[:, paired_b], axis=0)
            units = finding.units_heard(per_frame, token_frames, token_ids, decoder)
            found.append(finding.Heard(f"{a.clip}~{b.clip}", f"{a.reader}~{b.reader}", sentence, False, units, True))
    return found


def find(config, base: Path, voice, features, voice_name: str | None, stop, logger=print) -> int:
    """--find: hear, rank, write; 0 done, 1 when nothing could be heard."""
    from finetune.vits.synthesis import prepare_lines

    data_dir, out = Path(config.data_dir), Path(config.find_dir)
    clips = pick_clips(data_dir, voice_name, trained_readers(base), config.find, config.seed)
    lines = {line.item_id: line for line in prepare_lines(voice, [(c.item_id, c.text) for c in clips])}
    sayable = [c for c in clips if lines[c.item_id].token_ids is not None]
    readers = len({c.reader for c in sayable if not c.own})
    logger(
        f"find: {len(sayable)} clips of {data_dir} the voice did not train on ({sum(c.own for c in sayable)} of its own "
        f"reader {voice_name}, the rest from {readers} other readers), each heard against the voice saying its "
        f"sentence; at most {config.find_minutes:g} min (--find_minutes)"
    )
    (out / "audio").mkdir(parents=True, exist_ok=True)
    renders, decoder = Renders(voice, features, out / "audio"), {i: t for t, i in voice.tokenizer.encoder.items()}
    heard, voice_file, placed, started = [], {}, {}, time.monotonic()
    said_at = started
    limit_s, why = 60.0 * config.find_minutes, "every clip heard"
    bar = tqdm(total=len(sayable), unit="clip", disable=not sys.stderr.isatty())
    for index, clip in enumerate(sayable):
        stop.check()  # Ctrl-C: stopped between clips, nothing written
        if time.monotonic() - started > limit_s:
            why = f"the time limit ({config.find_minutes:g} min, --find_minutes) after {index} clips"
            break
        found, voice_file[clip.text], placed[clip.item_id] = hear(
            clip, data_dir, renders, lines[clip.item_id].token_ids, decoder
        )
        heard.append(found)
        bar.update(1)
        if bar.disable and time.monotonic() - said_at >= PROGRESS_EVERY_S:  # in a log or a pipe: a line now and then
            said_at = time.monotonic()
            logger(f"find: {index + 1}/{len(sayable)} clips heard, {said_at - started:.0f}s")
        if index + 1 == TIMED_AFTER:
            logger(time_it_takes((time.monotonic() - started) / TIMED_AFTER, len(sayable), limit_s))
    bar.close()
    if not any(not h.own for h in heard):
        logger(f"find: no other reader's clip was heard ({why}): nothing to rank; raise --find_minutes")
        return 1
    findings = finding.rank(heard + between_readers(heard, placed, decoder))
    write_findings(out, findings, heard, voice_file, data_dir, base, voice_name, why, time.monotonic() - started)
    beyond = [f for f in findings if f.beyond_noise]
    said = ", ".join(
        f"{f.kind} {f.unit!r} (x{f.ratio:.2f}, z {f.z:.1f}, {f.readers_further}/{f.readers} readers)" for f in beyond
    )
    logger(
        f"find: {len(heard)} clips heard ({why}); {len(findings)} letters and words judged; beyond the noise: "
        f"{said or 'nothing'} -> {out}/findings.html, findings.json, review.txt"
        + (f"; the crowd's clips of it as corrections: {out}/corrections/" if beyond else "")
    )
    return 0


def time_it_takes(each_s: float, clips: int, limit_s: float) -> str:
    """What the user is told once the first clips are timed: how long the whole will take, and where the time
    limit ends it first, after about how many clips."""
    said = f"find: about {each_s * clips / 60:.1f} min for the {clips} clips ({each_s:.2f}s a clip on this machine)"
    if each_s * clips > limit_s:
        said += (
            f"; --find_minutes {limit_s / 60:g} ends it after about {int(limit_s / each_s)} of them (what was heard "
            "by then is ranked; raise it to hear them all)"
        )
    return said


def write_findings(out: Path, findings, heard, voice_file, data_dir, base, voice_name, why, seconds) -> None:
    """findings.json, findings.html (with audio) and review.txt (see the module docstring)."""
    tested = {kind: sum(f.kind == kind for f in findings) for kind in (finding.LETTER, finding.WORD)}
    summary = {
        "voice": str(base),
        "reader": voice_name,
        "data_dir": str(data_dir),
        "clips_heard": len(heard),
        "own_clips": sum(h.own for h in heard),
        "readers": len({h.reader for h in heard if not h.own}),
        "ended": why,
        "seconds": round(seconds, 1),
        "bound_z": {kind: round(finding.bound_z(n, finding.FALSE_ALARM / 2), 2) for kind, n in tested.items()},
        "findings": [f.to_dict() for f in findings],
    }
    (out / "findings.json").write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    by_clip = {h.clip: h for h in heard}
    shown = [f for f in findings if f.beyond_noise] or findings[:5]
    sentences, rows = [], []
    for f in shown:
        first = by_clip[f.clips[0]]
        same = [h for h in heard if h.sentence == first.sentence and not h.own][:SHOWN_READERS]
        players = [player(f"audio/{voice_file[first.sentence]}", "the voice")]
        for h in same:
            shutil.copyfile(data_dir / "wavs" / f"{h.clip}.wav", out / "audio" / f"{h.clip}.wav")
            players.append(player(f"audio/{h.clip}.wav", f"reader {h.reader}"))
        rows.append(
            f"<tr><td>{f.kind}</td><td><b>{html.escape(f.unit)}</b></td><td>x{f.ratio:.2f}</td><td>{f.z:.1f}</td>"
            f"<td>{f.sentences}</td><td>{f.readers_further}/{f.readers}</td><td>{'yes' if f.across_readers else 'no'}</td>"
            f"<td>{'yes' if f.beyond_noise else 'no'}</td><td>{html.escape(first.sentence)}<br>{''.join(players)}</td></tr>"
        )
        sentences += [by_clip[c].sentence for c in f.clips[:5] if f.beyond_noise]
    title = "beyond the noise" if any(f.beyond_noise for f in findings) else "nothing beyond the noise; the nearest"
    (out / "findings.html").write_text(
        "<!doctype html><meta charset='utf-8'><title>What the voice says unlike its corpus's readers</title>"
        f"<h1>What {html.escape(str(base))} says unlike the readers of {html.escape(str(data_dir))}</h1>"
        f"<p>{len(heard)} clips heard ({html.escape(why)}); {title}. ratio: how many times further from the crowd "
        "than from the voice's own reader; z: in standard errors (the bound in findings.json); readers: those "
        "the voice says it further from than from its own reader.</p><table border=1 cellpadding=4>"
        "<tr><th>kind</th><th>what</th><th>ratio</th><th>z</th><th>sentences</th><th>readers</th>"
        "<th>checked against the readers between them</th>"
        f"<th>beyond the noise</th><th>a sentence that holds it</th></tr>{''.join(rows)}</table>\n",
        encoding="utf-8",
    )
    unique = list(dict.fromkeys(sentences))
    (out / "review.txt").write_text("".join(f"{s}\n" for s in unique), encoding="utf-8")
    write_corrections(out / "corrections", [f for f in findings if f.beyond_noise], by_clip, data_dir)


def write_corrections(folder: Path, found: list, by_clip: dict, data_dir: Path) -> None:
    """The crowd's clips that hold what was found, as corrections in the LJSpeech layout (wavs/ + metadata.csv
    id|text; readers.csv id|reader beside it): `train_feedback.py --feedback_dir find/corrections --focus UNIT`
    runs a round on them, its held-out sentences deciding it as any round's. Nothing found: no folder."""
    shutil.rmtree(folder, ignore_errors=True)
    clips = list(dict.fromkeys(clip for f in found for clip in f.clips))
    if not clips:
        return
    (folder / "wavs").mkdir(parents=True)
    for clip in clips:
        shutil.copyfile(data_dir / "wavs" / f"{clip}.wav", folder / "wavs" / f"{clip}.wav")
    (folder / "metadata.csv").write_text("".join(f"{c}|{by_clip[c].sentence}\n" for c in clips), encoding="utf-8")
    (folder / "readers.csv").write_text("".join(f"{c}|{by_clip[c].reader}\n" for c in clips), encoding="utf-8")


def player(source: str, label: str) -> str:
    return f"<div>{html.escape(label)}: <audio controls preload=none src='{html.escape(source)}'></audio></div>"


def run(config, base: Path) -> int:
    """--find with the current voice (`base`) on --data_dir's readers; a stop request ends it with nothing written."""
    from finetune.feedback.corrections import voice_speaker
    from finetune.recipes.shared import features_for
    from finetune.system import interrupt
    from finetune.training.assembly import pick_device
    from finetune.vits.synthesis import load_voice

    voice = load_voice(base, pick_device(config.device))
    features = features_for(voice.model, voice.device)
    exported_for = getattr(voice.model.config, "speaker", None)
    name = voice_speaker(Path(config.data_dir), config.target_speaker, exported_for, voice.sample_rate)
    stop = interrupt.StopRequest()
    with stop.installed():
        try:
            return find(config, base, voice, features, name, stop)
        except interrupt.StopRequested as request:
            print(f"interrupted ({request.signal_name}): --find wrote nothing; run it again", file=sys.stderr)
            return stop.exit_status
