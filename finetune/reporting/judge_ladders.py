"""Whether a judge may vote on a voice, found on that voice: each judge of judges.py scores ladders whose order is
known (the voice's recordings with more and more noise, less and less of the band, shifted further in pitch; the
voice saying its sentences with more and more letters swapped or words dropped) and votes only where it ranks every
ladder of its kind right and scores two draws of the same voice nearer each other than neighbouring rungs
(votes, below). bench/bench_judges.py adds the ladders that need other models (new weights, an early checkpoint);
a feedback round validates the judges it is asked for on its own voice with these (validate_on_voice), once a
voice, and keeps the result beside it (CACHE)."""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from finetune.system.time_limit import TimeLimit

LOG = logging.getLogger("finetune")

LADDERS_OF = {  # the ladders each kind of judge is ranked on
    "speaker": ("checkpoints", "noise", "lowpass", "pitch", "other_speaker"),
    "phonetic": ("checkpoints", "noise", "lowpass", "text_swaps", "words_dropped"),
    "asr": ("checkpoints", "noise", "lowpass", "text_swaps", "words_dropped"),
    "spectral": ("checkpoints", "noise", "lowpass", "text_swaps", "words_dropped"),
    "naturalness": ("checkpoints", "noise", "lowpass"),
}
TAU_TO_VOTE = 0.8  # each ladder ranked at least this right (Kendall's tau) for a judge to vote
PAIRWISE = ("phonetic", "spectral")  # kinds that compare a clip with its own recording
CACHE = "judges_validation.json"  # beside the voice it was found on
CLIPS = 8  # held-out clips of the voice on every rung (bench_judges.py --clips)


@dataclass
class Clip:
    """One rung's rendering of one held-out clip: the audio to judge, and what it should be."""

    item_id: str
    wave: np.ndarray
    rate: int
    reference: tuple  # (waveform, rate) of the clip's recording
    text: str


@dataclass
class Rung:
    label: str
    clips: list
    is_recording: bool = False  # the recordings themselves: no test for a judge comparing a clip with its own


@dataclass
class Ladder:
    name: str
    kind_of: str  # which LADDERS_OF entry it belongs to ("checkpoints" for checkpoints/V)
    voice: str  # whose centroid the speaker judge measures against
    rungs: list  # worst first


def held_out(data_dir: Path, speaker: str | None, count: int) -> list[tuple[str, str, np.ndarray, int]]:
    """(id, text, recording, rate) of `count` held-out clips of `speaker` (all speakers' when None)."""
    import soundfile as sf

    from finetune.data.metadata import read_rows

    rows = [r for r in read_rows(data_dir / "metadata_val.csv") if speaker is None or r[1] == speaker][:count]
    return [(item, text, *sf.read(data_dir / "wavs" / f"{item}.wav", dtype="float32")) for item, _, text in rows]


def render(voice, clips: list, texts: list[str] | None = None, seed: int = 0) -> list[Clip]:
    """The voice (synthesis.Voice) saying each clip's text (or `texts`), one seeded request a clip."""
    from finetune.vits.synthesis import numbered, prepare_lines, speak

    said = []
    for index, (item, text, audio, rate) in enumerate(clips):
        line = prepare_lines(voice, numbered([texts[index] if texts else text]))[0]
        wave = speak(voice, line.token_ids, seed + index) if line.token_ids is not None else np.zeros(1600, np.float32)
        said.append(Clip(item, wave, voice.sample_rate, (audio, rate), text))
    return said


def as_recorded(clips: list, change=None) -> list[Clip]:
    """The recordings themselves, each through `change(audio, rate)` when given."""
    return [
        Clip(item, change(audio, rate) if change else audio, rate, (audio, rate), text)
        for item, text, audio, rate in clips
    ]


# ---------------------------------------------------------------- degradations


def with_noise(snr_db: float, seed: int):
    def change(audio, rate):
        power = float(np.mean(audio**2)) or 1e-8
        noise = np.random.default_rng(seed).standard_normal(len(audio)).astype(np.float32)
        return np.clip(audio + noise * np.sqrt(power / 10 ** (snr_db / 10)), -1, 1).astype(np.float32)

    return change


def low_passed(cutoff_hz: float):
    def change(audio, rate):
        from scipy.signal import butter, sosfiltfilt

        return sosfiltfilt(butter(8, min(cutoff_hz, 0.45 * rate), fs=rate, output="sos"), audio).astype(np.float32)

    return change


def pitch_shifted(semitones: float):
    def change(audio, rate):
        import librosa

        return librosa.effects.pitch_shift(audio, sr=rate, n_steps=semitones).astype(np.float32)

    return change


def tempo(length_factor: float):
    def change(audio, rate):
        import librosa

        return librosa.effects.time_stretch(audio, rate=1.0 / length_factor).astype(np.float32)

    return change


def swap_letters(text: str, share: float, seed: int) -> str:
    """`share` of the text's letters each replaced by another letter of the text."""
    rng = np.random.default_rng(seed)
    letters = sorted({c for c in text if c.isalpha()})
    chars = list(text)
    positions = [i for i, c in enumerate(chars) if c.isalpha()]
    for i in rng.choice(positions, size=int(round(share * len(positions))), replace=False) if positions else []:
        others = [c for c in letters if c != chars[i]] or letters
        chars[i] = others[rng.integers(len(others))]
    return "".join(chars)


def drop_words(text: str, share: float, seed: int) -> str:
    words = text.split()
    drop = set(np.random.default_rng(seed).choice(len(words), size=int(share * len(words)), replace=False))
    kept = [w for i, w in enumerate(words) if i not in drop]
    return " ".join(kept or words[:1])


# ---------------------------------------------------------------- the ladders a voice alone gives


def recording_ladders(clips: list, voice: str, seed: int, kinds: set[str]) -> list[Ladder]:
    """The voice's recordings degraded (the ladders of `kinds` among noise, lowpass, pitch), worst rung first."""

    def degraded(label, changes):
        return [Rung(f"{label} {c}", as_recorded(clips, f)) for c, f in changes] + [
            Rung("as recorded", as_recorded(clips))
        ]

    made = {
        "noise": lambda: degraded("SNR dB", [(s, with_noise(s, seed)) for s in (0, 10, 20, 30)]),
        "lowpass": lambda: degraded("Hz", [(c, low_passed(c)) for c in (1000, 2000, 4000)]),
        "pitch": lambda: degraded("+semitones", [(s, pitch_shifted(s)) for s in (6, 4, 2)]),
    }
    return [Ladder(name, name, voice, build()) for name, build in made.items() if name in kinds]


def text_ladders(say, clips: list, voice: str, seed: int, kinds: set[str]) -> list[Ladder]:
    """`say(clips, texts, seed)` saying the clips' texts with 40, 20, 10, 0 % of their letters swapped and with 50,
    25, 0 % of their words dropped (the ladders of `kinds` among text_swaps, words_dropped), worst rung first."""
    texts = [text for _, text, _, _ in clips]
    ladders = []
    if "text_swaps" in kinds:
        rungs = [
            Rung(
                f"{int(100 * s)}% swapped",
                say(clips, [swap_letters(t, s, seed + i) for i, t in enumerate(texts)], seed),
            )
            for s in (0.4, 0.2, 0.1, 0.0)
        ]
        ladders.append(Ladder("text_swaps", "text_swaps", voice, rungs))
    if "words_dropped" in kinds:
        rungs = [
            Rung(
                f"{int(100 * s)}% dropped", say(clips, [drop_words(t, s, seed + i) for i, t in enumerate(texts)], seed)
            )
            for s in (0.5, 0.25, 0.0)
        ]
        ladders.append(Ladder("words_dropped", "words_dropped", voice, rungs))
    return ladders


def score_rung(judge, rung: Rung) -> list[float]:
    return [judge.score(c.wave, c.rate, item_id=c.item_id, reference=c.reference, text=c.text) for c in rung.clips]


def rank_ladder(judge, ladder: Ladder) -> dict:
    """The judge's mean on each rung (those it can be tested on) and its Kendall tau against the rungs' order."""
    rungs = [r for r in ladder.rungs if not (r.is_recording and judge.kind in PAIRWISE)]
    means = [float(np.mean(score_rung(judge, r))) for r in rungs]
    oriented = means if judge.higher_is_better else [-m for m in means]
    return {
        "kendall_tau": kendall_tau(oriented),
        "clips": len(rungs[0].clips) if rungs else 0,
        "rungs": [r.label for r in rungs],
        "means": [round(m, 4) for m in means],
    }


def retest_sd(judge, draws: tuple[Rung, Rung]) -> float:
    """The standard deviation of the per-clip difference between the judge's scores of two draws of one voice."""
    differences = np.array(score_rung(judge, draws[0])) - np.array(score_rung(judge, draws[1]))
    return float(np.std(differences, ddof=1)) if len(differences) > 1 else float("nan")


def set_reference(judge, clips: list) -> None:
    """The speaker judge's reference: the voice's held-out recordings."""
    if hasattr(judge, "set_voice"):
        judge.set_voice({item: (audio, rate) for item, _, audio, rate in clips})


# ---------------------------------------------------------------- a feedback round's own validation


class OutOfTime(Exception):
    """The validation's time ran out before a judge was ranked on every ladder."""


def weights_key(folder: Path) -> dict:
    """What says the voice is still the one the cache was found on: its weights file's size and time."""
    for name in ("model.safetensors", "pytorch_model.bin"):
        path = folder / name
        if path.is_file():
            stat = path.stat()
            return {"weights": name, "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
    return {}


def cached(folder: Path) -> dict:
    """The validations kept beside `folder` (name -> {"votes", "why", ...}) while the voice is unchanged since."""
    try:
        record = json.loads((folder / CACHE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return record.get("judges", {}) if record.get("voice") == weights_key(folder) else {}


def keep(folder: Path, found: dict, clips: int) -> None:
    """`found` (name -> validation) kept beside the voice with those already there."""
    record = {"voice": weights_key(folder), "clips": clips, "judges": {**cached(folder), **found}}
    try:
        (folder / CACHE).write_text(json.dumps(record, indent=2, ensure_ascii=False), encoding="utf-8")
    except OSError as error:  # a read-only voice folder: validated again next time
        LOG.warning(f"judges' validation not kept beside {folder} ({error})")


def validate_on_voice(voice, clips: list, judges: dict, limit: TimeLimit, seed: int = 0) -> dict:
    """Each of `judges` (name -> judge) ranked on the ladders `voice` (synthesis.Voice) and its held-out `clips`
    give, with its test-retest noise from two draws of the voice: name -> {"votes", "why", "ladders",
    "retest_sd"}, or {"votes": False, "why", "incomplete": True} for a judge not ranked before `limit`."""
    given_s = limit.left_s()
    if len(clips) < 3:
        why = f"{len(clips)} held-out clips of the voice: at least 3 are needed to rank a ladder"
        return {name: {"votes": False, "why": why, "incomplete": True} for name in judges}
    kinds = {ladder for judge in judges.values() for ladder in LADDERS_OF.get(judge.kind, ())}

    def say(clips_, texts=None, seed_=seed):
        if not limit.fits(0.0):
            raise OutOfTime
        return render(voice, clips_, texts, seed_)

    try:
        ladders = recording_ladders(clips, "voice", seed, kinds) + text_ladders(say, clips, "voice", seed, kinds)
        draws = (Rung("a", say(clips, seed_=seed + 1000)), Rung("b", say(clips, seed_=seed + 2000)))
    except OutOfTime:
        ladders, draws = None, None
    results = {}
    for name, judge in judges.items():
        wanted = [ladder for ladder in ladders or [] if ladder.kind_of in LADDERS_OF.get(judge.kind, ())]
        ranked = {}
        if ladders is not None:
            set_reference(judge, clips)
            for ladder in wanted:
                if not limit.fits(0.0):
                    break
                ranked[ladder.name] = rank_ladder(judge, ladder)
        if ladders is None or len(ranked) < len(wanted):
            why = f"not validated on this voice in the {given_s:.0f}s given to it"
            results[name] = {"votes": False, "why": why, "incomplete": True}
            continue
        noise = retest_sd(judge, draws)
        why = why_not_voting(ranked, noise)
        results[name] = {"votes": not why, "why": why, "ladders": ranked, "retest_sd": round(noise, 4)}
    return results


# ---------------------------------------------------------------- the rule by which a judge votes


def kendall_tau(order: list[float]) -> float:
    """Kendall's tau-b between the rungs' intended order (0 worst, 1, 2, ...) and `order`, the judge's scores
    of those rungs made "higher is better": 1 when the judge ranks every rung as intended, -1 reversed."""
    concordant = discordant = ties = 0
    n = len(order)
    for i in range(n):
        for j in range(i + 1, n):
            difference = order[j] - order[i]
            if difference > 0:
                concordant += 1
            elif difference < 0:
                discordant += 1
            else:
                ties += 1
    pairs = n * (n - 1) / 2
    denominator = np.sqrt(pairs * (pairs - ties)) if pairs else 0.0
    return float((concordant - discordant) / denominator) if denominator else float("nan")


def votes(ladders: dict[str, dict], retest_sd: float, tau: float = TAU_TO_VOTE) -> bool:
    """Whether a judge may decide (why_not_voting finds nothing against it)."""
    return not why_not_voting(ladders, retest_sd, tau)


def why_not_voting(ladders: dict[str, dict], retest_sd: float, tau: float = TAU_TO_VOTE) -> str:
    """Why a judge may not decide, in words ("" when it may): each of its ladders must be ranked with Kendall tau
    >= `tau`, and its test-retest noise small against the steps it is asked to tell apart (below half the smallest
    gap between neighbouring rungs of each ladder: the same model drawn twice must score nearer itself than the
    nearest rungs score to each other). A noise merely measured (finite) says nothing: any two clips give one."""
    if not ladders:
        return "no ladder ranked"
    for name, ladder in ladders.items():
        t = ladder["kendall_tau"]
        if not (np.isfinite(t) and t >= tau):
            return f"its {name} ladder ranked wrong (Kendall tau {t:+.2f}, at least {tau:g} needed)"
    if not np.isfinite(retest_sd):
        return "its test-retest noise could not be measured"
    for name, ladder in ladders.items():
        gap = smallest_gap(ladder["means"])
        if not retest_sd < 0.5 * gap:
            return (
                f"two draws of the voice differ by {retest_sd:.3g} (test-retest), not below half the smallest step "
                f"of its {name} ladder ({gap:.3g})"
            )
    return ""


def smallest_gap(means: list[float]) -> float:
    """The smallest difference between neighbouring rungs' mean scores (nan with fewer than two)."""
    finite = [m for m in means if np.isfinite(m)]
    return float(min(abs(b - a) for a, b in zip(finite, finite[1:]))) if len(finite) > 1 else float("nan")
