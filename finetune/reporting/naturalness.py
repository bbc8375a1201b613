"""How natural synthesised speech sounds, predicted offline: DNSMOS (Microsoft's non-intrusive MOS
predictor, ITU-T P.835), whose ONNX weights ship inside the `speechmos` package (about 10 MB, MIT). No
recording is needed and nothing is downloaded at run time.

    overall   DNSMOS P.835 OVRL, 1 (bad) .. 5 (excellent): the overall quality a listener would rate

It is an optional extra (requirements-naturalness.txt: speechmos, whose onnxruntime the ONNX export
installs too). Without it evaluation runs as before and says once that the measure is off.

What it is for, by the evidence (bench/bench_naturalness.py, bench/RESULTS.md): it separates the
recordings and a trained voice from early ones, but rated an untrained demo voice above a 25-step one
and is blind to tempo (length_scale 0.7 and 1.4 scored as 1.0). So it is reported (the eval line,
metrics.jsonl, TensorBoard, report.html, the model card) and takes no part in choosing best_model
(finetune/training/selection.py).

Input: a float waveform in [-1, 1] at 16 kHz (MMS voices' rate; others are resampled first). DNSMOS
scores 9.01 s windows; a shorter clip is repeated to fill one, as the package's own runner does.
Cost: two small ONNX networks over each 9 s window, on one CPU thread.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

LOG = logging.getLogger(__name__)

DNSMOS_RATE = 16_000
WINDOW_S = 9.01  # DNSMOS's input length
INSTALL_HINT = "pip install -r requirements-naturalness.txt"


@dataclass(frozen=True)
class NaturalnessScore:
    overall: float  # DNSMOS OVRL (what evaluation reports)
    signal: float  # DNSMOS SIG: the speech itself
    background: float  # DNSMOS BAK: the absence of noise
    p808: float  # the P.808 single-number MOS predictor shipped beside it (NaN when not asked for)


def _model_dir() -> Path:
    import speechmos

    return Path(speechmos.__file__).resolve().parent / "dnsmos_models"


def available() -> bool:
    """Whether the optional extra is installed (speechmos and onnxruntime importable)."""
    try:
        import onnxruntime  # noqa: F401
        import speechmos  # noqa: F401
    except ImportError:
        return False
    return True


class Naturalness:
    """DNSMOS P.835 and P.808 on one CPU thread (evaluation shares the machine with training)."""

    name = "DNSMOS OVRL"

    def __init__(self):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        folder = _model_dir()
        self.p835 = ort.InferenceSession(str(folder / "sig_bak_ovr.onnx"), options, providers=["CPUExecutionProvider"])
        self.p808 = ort.InferenceSession(str(folder / "model_v8.onnx"), options, providers=["CPUExecutionProvider"])

    def score(self, waveform: np.ndarray, sample_rate: int, p808: bool = True) -> NaturalnessScore:
        """One clip [samples] (float, any rate) -> its scores, averaged over 9 s windows hopped by 1 s.
        p808=False skips the P.808 network (evaluation reports OVRL only; it is most of the cost)."""
        audio = self._prepared(waveform, sample_rate)
        window = int(WINDOW_S * DNSMOS_RATE)
        starts = range(0, len(audio) - window + 1, DNSMOS_RATE)
        rows = [self._window(audio[s : s + window], p808) for s in starts]
        return NaturalnessScore(*(float(np.mean(column)) for column in zip(*rows)))

    def overall(self, waveform: np.ndarray, sample_rate: int) -> float:
        """DNSMOS OVRL alone: what evaluation reports."""
        return self.score(waveform, sample_rate, p808=False).overall

    @staticmethod
    def _prepared(waveform: np.ndarray, sample_rate: int) -> np.ndarray:
        audio = np.nan_to_num(np.asarray(waveform, dtype=np.float32))
        if sample_rate != DNSMOS_RATE:
            import librosa

            audio = librosa.resample(audio, orig_sr=sample_rate, target_sr=DNSMOS_RATE)
        audio = np.clip(audio, -1.0, 1.0)
        if len(audio) == 0:
            audio = np.zeros(DNSMOS_RATE, dtype=np.float32)
        window = int(WINDOW_S * DNSMOS_RATE)
        return np.tile(audio, -(-window // len(audio))) if len(audio) < window else audio

    def _window(self, segment: np.ndarray, with_p808: bool) -> tuple[float, float, float, float]:
        sig, bak, ovr = self.p835.run(None, {"input_1": segment[np.newaxis, :]})[0][0]
        p808 = (
            self.p808.run(None, {"input_1": _p808_features(segment[:-160])[np.newaxis]})[0][0][0]
            if with_p808
            else float("nan")
        )
        # The published polynomial mapping of raw P.835 outputs to the MOS scale (DNSMOS, not personalised).
        ovr, sig = (
            np.polyval([-0.06766283, 1.11546468, 0.04602535], ovr),
            np.polyval([-0.08397278, 1.22083953, 0.0052439], sig),
        )
        bak = np.polyval([-0.13166888, 1.60915514, -0.39604546], bak)
        return float(ovr), float(sig), float(bak), float(p808)


def _p808_features(audio: np.ndarray) -> np.ndarray:
    """The P.808 model's input: 120 mel bands in dB, [frames, 120], scaled as it was trained."""
    import librosa

    mel = librosa.feature.melspectrogram(y=audio, sr=DNSMOS_RATE, n_fft=321, hop_length=160, n_mels=120)
    return ((librosa.power_to_db(mel, ref=np.max) + 40) / 40).T.astype(np.float32)


def load_naturalness(wanted: bool = True) -> Naturalness | None:
    """The predictor, or None (logged once, with how to install it) when the extra is missing or it is off."""
    if not wanted:
        return None
    if not available():
        LOG.info(f"naturalness (DNSMOS) not measured: its optional extra is not installed ({INSTALL_HINT})")
        return None
    return Naturalness()
