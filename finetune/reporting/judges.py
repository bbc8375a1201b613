"""Judges that hear what a listener hears, beside MCD-DTW: is it still the target's voice, and does it say the
words right. Each scores one synthesised clip against what it should be; `bench/bench_judges.py` validates
them on known degradations and checkpoint ladders, and only a judge whose rankings held there votes
(VOTES below, with the figures that decided; docs/training.md, "Judges").

    speaker     Resemblyzer's speaker encoder (GE2E, 256-d, 16 kHz; its 17 MB weights ship in the package):
                cosine similarity of the embedding of the clip's speech (webrtcvad's, as Resemblyzer
                prepares a clip) to the centroid of the voice's own held-out recordings (SECS, as YourTTS
                and seed-tts-eval report it), times the share of the clip's sound that is speech; higher is
                nearer, 0 for a clip with no speech. Language-free.
    phonetic, phone_errors, asr  what is said, whoever says it (finetune/reporting/content_judges.py)
    mcd         MCD-DTW, ranked on the same ladders; naturalness: DNSMOS, no reference

All are optional extras (requirements-judges.txt; pip installs Resemblyzer with --no-deps, since its
webrtcvad dependency does not build on new setuptools: webrtcvad-wheels stands in). Without them evaluation
runs as before and says once which judges are off. Input everywhere: a float waveform [samples] in [-1, 1].
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np

from finetune.reporting.content_judges import AsrJudge, PhoneErrorJudge, PhonemeRecogniser, PhoneticJudge
from finetune.reporting.judge_audio import JUDGE_RATE, AudioMemo, to_judge_rate

LOG = logging.getLogger(__name__)

INSTALL_HINT = "pip install --no-deps -r requirements-judges.txt"
KINDS = ("speaker", "phonetic", "asr", "naturalness", "spectral")

# Which judges vote, by bench/bench_judges.py's validation (the rule: judge_ladders.why_not_voting):
# bench/RESULTS.md has the figures. The others are reported only.
VOTES = {"speaker": False, "phonetic": False, "phone_errors": False, "asr": False}

REQUIRES = {
    "speaker": "resemblyzer",
    "phonetic": "hama",
    "phone_errors": "hama",
    "asr": "transformers",
    "mcd": "librosa",
    "naturalness": "speechmos",
}


def available(name: str) -> bool:
    """Whether the package a judge needs is importable."""
    try:
        __import__(REQUIRES[name])
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------- speaker identity


class NoSpeech(ValueError):
    """The speaker judge was given a voice's recordings with no speech in any: it has nothing to compare with."""


class SpeakerJudge:
    """Similarity to the voice: cosine of Resemblyzer embeddings, against the centroid of its recordings."""

    name, kind, higher_is_better = "speaker", "speaker", True

    def __init__(self):
        from resemblyzer import VoiceEncoder

        self.encoder = VoiceEncoder("cpu", verbose=False)
        self.centroid: np.ndarray | None = None
        self.embeddings: dict[str, np.ndarray] = {}
        self.memo = AudioMemo()

    def embed(self, waveform: np.ndarray, sample_rate: int) -> tuple[np.ndarray, float] | None:
        """([256] unit vector of the clip's speech, the share of its audible part that is speech), or None when
        it has no speech (embed_speech, remembered)."""
        return self.memo.get(waveform, sample_rate, self.embed_speech)

    def embed_speech(self, waveform: np.ndarray, sample_rate: int) -> tuple[np.ndarray, float] | None:
        """Resemblyzer's own preprocessing first (preprocess_wav: the volume raised to -30 dBFS, the silences
        webrtcvad hears cut to 0.2 s), as the encoder was trained; a voiced part shorter than the encoder's 1.6 s
        window is tiled to fill one. The share: what webrtcvad kept over the audible part of the clip (its
        30 ms frames within AUDIBLE_DB of the loudest), at most 1: silence does not count against a clip,
        sound that is not speech does (a new model's hiss: 0.43 of it kept, a recording's 1.00)."""
        from resemblyzer import preprocess_wav

        audio = to_judge_rate(waveform, sample_rate)
        if not np.any(audio):  # its loudness is -inf dBFS: preprocess_wav would scale it by nan
            return None
        speech = preprocess_wav(audio)
        if not len(speech):
            return None
        share = min(1.0, len(speech) / audible_samples(audio))
        window = int(1.6 * JUDGE_RATE)
        if len(speech) < window:
            speech = np.tile(speech, -(-window // len(speech)))
        embedding = np.asarray(self.encoder.embed_utterance(speech), dtype=np.float64)
        embedding.setflags(write=False)  # remembered: read-only, as the memo keeps its arrays
        return embedding, share

    def set_voice(self, recordings: dict[str, tuple[np.ndarray, int]]) -> None:
        """The voice's recordings (id -> (waveform, rate)): their embeddings and centroid (those with speech)."""
        embedded = {item: self.embed(wave, rate) for item, (wave, rate) in recordings.items()}
        self.embeddings = {item: e[0] for item, e in embedded.items() if e is not None}
        if not self.embeddings:
            raise NoSpeech("none of the voice's held-out recordings has speech webrtcvad hears: no reference")
        self.centroid = unit(np.mean(list(self.embeddings.values()), axis=0))

    def centroid_without(self, item_id: str | None) -> np.ndarray:
        """The centroid of the voice's recordings but `item_id`'s (a recording is not judged against itself)."""
        others = [e for item, e in self.embeddings.items() if item != item_id]
        return unit(np.mean(others, axis=0)) if others else self.centroid

    def score(self, waveform: np.ndarray, sample_rate: int, item_id: str | None = None, **_) -> float:
        """Cosine similarity of the clip's speech to the voice, times the share of the clip that is speech: a
        clip that is half hiss sounds half like the voice; 0.0 for a clip with no speech in it. Without the
        share, a new model's hiss (webrtcvad hears some of it as speech) scored above a 90 s model's buzz
        (0.415 against 0.392 on the demo crowd's axin, bench/log/2026-12-02.md)."""
        if self.centroid is None:
            raise ValueError("SpeakerJudge.set_voice first: the voice's recordings are its reference")
        embedded = self.embed(waveform, sample_rate)
        if embedded is None:
            return 0.0
        embedding, share = embedded
        return share * float(embedding @ self.centroid_without(item_id))


AUDIBLE_DB = 40.0  # a 30 ms frame this far below the clip's loudest is silence, not sound


def audible_samples(audio: np.ndarray, frame: int = 480) -> int:
    """Samples of `audio` (16 kHz) in 30 ms frames within AUDIBLE_DB of its loudest frame (at least one frame)."""
    frames = audio[: len(audio) // frame * frame].reshape(-1, frame)
    if not len(frames):
        return max(1, len(audio))
    level = np.sqrt(np.mean(frames.astype(np.float64) ** 2, axis=1)) + 1e-12
    return frame * max(1, int(np.sum(20 * np.log10(level / level.max()) > -AUDIBLE_DB)))


def unit(vector: np.ndarray) -> np.ndarray:
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


class SpectralJudge:
    """MCD-DTW (finetune/reporting/measures.py), the measure every decision rested on before the others: here so
    that the validation ranks it on the same ladders."""

    name, kind, higher_is_better = "mcd", "spectral", False

    def __init__(self):
        from finetune.data.features import FeatureConfig, Features

        self.features = Features(FeatureConfig(sample_rate=JUDGE_RATE))
        self.references: dict = {}

    def log_mel(self, waveform: np.ndarray, sample_rate: int) -> np.ndarray:
        import torch

        audio = torch.from_numpy(to_judge_rate(waveform, sample_rate)).unsqueeze(0)
        return self.features.mel(audio)[0].numpy()

    def score(self, waveform: np.ndarray, sample_rate: int, reference: tuple, item_id: str = "", **_) -> float:
        from finetune.reporting.measures import mcd_dtw

        key = item_id or str(id(reference))
        if key not in self.references:
            self.references[key] = self.log_mel(*reference)
        return mcd_dtw(self.log_mel(waveform, sample_rate), self.references[key])


class NaturalnessJudge:
    """DNSMOS OVRL (finetune/reporting/naturalness.py): no reference; higher is more natural."""

    name, kind, higher_is_better = "naturalness", "naturalness", True

    def __init__(self):
        from finetune.reporting.naturalness import Naturalness

        self.predictor = Naturalness()

    def score(self, waveform: np.ndarray, sample_rate: int, **_) -> float:
        return self.predictor.overall(waveform, sample_rate)


@dataclass
class Panel:
    """The judges an evaluation asks about each clip (name -> judge), the voice they judge identity against,
    and the clips' texts (for the asr judge). evaluation.py scores every clip with each; those in VOTES
    take part in decisions (selection.py, a feedback round's verdict)."""

    judges: dict
    texts: dict = field(default_factory=dict)  # clip id -> its text
    votes: dict = field(default_factory=lambda: dict(VOTES))  # name -> whether it votes (validated_votes may add)
    why: dict = field(default_factory=dict)  # name -> why it does not vote, where a validation on the voice said

    def set_voice(self, recordings: dict[str, tuple[np.ndarray, int]]) -> None:
        """The voice's own recordings (id -> (waveform, rate)): the speaker judge's reference."""
        for judge in self.judges.values():
            if hasattr(judge, "set_voice"):
                judge.set_voice(recordings)

    def score(self, waveform: np.ndarray, sample_rate: int, item_id: str, recording: np.ndarray) -> dict[str, float]:
        """Each judge's score of one synthesised clip against its recording (float waveform, `sample_rate`)."""
        return {
            name: judge.score(
                waveform,
                sample_rate,
                item_id=item_id,
                reference=(recording, sample_rate),
                text=self.texts.get(item_id, ""),
            )
            for name, judge in self.judges.items()
        }

    @property
    def voting(self) -> list[str]:
        return [name for name in self.judges if self.votes.get(name)]

    def why_not(self, name: str) -> str:
        """Why `name` does not vote, in words ("" when it does)."""
        if name in self.voting:
            return ""
        return self.why.get(name) or ("it never decides" if name not in CAN_VOTE else "not found voting on this voice")

    def higher_is_better(self, name: str) -> bool:
        return self.judges[name].higher_is_better


def validated_votes(path: str) -> dict[str, bool]:
    """Which judges bench/bench_judges.py found voting on a voice (its results.json; --judges_validation): a
    judge validated on the user's own voice votes in their runs."""
    import json
    from pathlib import Path

    results = json.loads(Path(path).read_text(encoding="utf-8"))
    return {name: bool(entry.get("votes")) for name, entry in results.get("judges", {}).items()}


DEFAULT = ("speaker", "phonetic")  # what a run asks for when the extra is installed (asr: with --asr_model)
CAN_VOTE = ("speaker", "phonetic", "phone_errors", "asr")  # by name in a run (--judges); MCD is its own measure


def load_judges(names: list[str], asr_model: str | None = None) -> dict:
    """The judges asked for that can run here (name -> judge); one line for each that cannot, with the fix."""
    made, recogniser = {}, None
    for name in names:
        if name == "asr" and not asr_model:
            continue
        if not available(name):
            hint = "pip install -r requirements-naturalness.txt" if name == "naturalness" else INSTALL_HINT
            LOG.info(f"judge {name} not measured: its optional extra is not installed ({hint})")
            continue
        if name == "speaker":
            made[name] = SpeakerJudge()
        elif name in ("phonetic", "phone_errors"):
            recogniser = recogniser or PhonemeRecogniser()
            made[name] = PhoneticJudge(recogniser) if name == "phonetic" else PhoneErrorJudge(recogniser)
        elif name == "asr":
            made[name] = AsrJudge(asr_model)
        elif name == "mcd":
            made[name] = SpectralJudge()
        elif name == "naturalness":
            made[name] = NaturalnessJudge()
    return made
