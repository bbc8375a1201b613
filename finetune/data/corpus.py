"""A prepared corpus (DATA_DIR/metadata*.csv + wavs/) read into RAM as Examples.

Clips are read as int16 (2 bytes a sample) and cut to a whole number of frames. A clip is left out,
named with its reason and counted, when its WAV is missing, damaged after preparation (unreadable,
emptied, overwritten) or holds no audio, or when its text has more tokens than its audio has frames
(alignment needs at least one frame per token). When more than half the clips are missing or damaged,
loading stops: the prepared folder itself is broken, and prepare_data.py rebuilds it. A WAV at another
sample rate than the model's is an error: preparation was run for another model.

Before reading, the RAM needed is estimated from the WAV sizes and checked against what is available
(psutil): precomputed features (linear + mel spectrograms, float16) take about 2.3 times the audio's
own size. When they do not fit, training falls back to computing features on the device per batch (and
says so); when even the audio does not fit, loading stops with the number of clips that would.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soundfile as sf
import torch

from finetune.data.audio import read_pcm16
from finetune.data.examples import Example, collate
from finetune.data.features import Features
from finetune.data.metadata import WAV_HEADER_BYTES, CorpusError, read_rows
from finetune.system.interrupt import StopRequest
from finetune.system.progress import Progress

EXAMPLE_OVERHEAD_BYTES = 1024  # Python objects and token ids per clip, roughly
RAM_SHARE = 0.8  # of the available RAM the corpus may take
MAX_DAMAGED_SHARE = 0.5  # more missing or damaged WAVs than this: the folder is broken, not a few clips
DAMAGED = ("missing wav", "damaged wav")  # the reasons that mean the prepared files are not what was prepared


@dataclass
class LoadReport:
    loaded: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason -> count
    examples_skipped: list[str] = field(default_factory=list)  # "id: reason (detail)", the first 50

    @property
    def damaged(self) -> int:
        return sum(self.skipped[reason] for reason in DAMAGED)

    def describe(self, name: str) -> str:
        """One line for the log: how many clips were left out, why, and which (the first ten)."""
        total = sum(self.skipped.values())
        shown = "; ".join(self.examples_skipped[:10]) + ("; ..." if total > 10 else "")
        fix = (
            " (to get them back: delete the damaged WAVs and run prepare_data.py again; it writes missing ones)"
            if self.damaged
            else ""
        )
        return (
            f"{name}: {total} clips left out ({', '.join(f'{n} {r}' for r, n in self.skipped.items())}): {shown}{fix}"
        )


def tokenize(tokenizer, text: str) -> np.ndarray:
    return np.asarray(tokenizer(text).input_ids, dtype=np.int32)


def load_examples(
    data_dir: Path,
    metadata_name: str,
    tokenizer,
    hop: int,
    sample_rate: int,
    max_samples: int = 0,
    only_ids: set[str] | None = None,
    stop: StopRequest | None = None,
    speakers: dict[str, int] | None = None,
) -> tuple[list[Example], LoadReport]:
    """Examples for the metadata file's rows (the first `max_samples`, or just `only_ids`), each with its
    speaker's index in `speakers` (rows of a speaker not in it are left out; None: all, as speaker 0). A
    stop request raises StopRequested between clips."""
    path = data_dir / metadata_name
    if not path.is_file():
        raise CorpusError(f"{path} not found: run prepare_data.py --data_dir {data_dir} first")
    rows = read_rows(path)
    if speakers is not None:
        rows = [row for row in rows if row[1] in speakers]
    if only_ids is not None:
        rows = [row for row in rows if row[0] in only_ids]
    if max_samples:
        rows = rows[:max_samples]
    examples, report = [], LoadReport()
    progress = Progress(f"load {metadata_name}", total=len(rows), unit="clips") if len(rows) > 2000 else None
    for item_id, speaker, text in rows:
        if stop is not None:
            stop.check()
        if progress is not None:
            progress.update()
        example, reason, detail = load_example(
            data_dir / "wavs" / f"{item_id}.wav", item_id, text, tokenizer, hop, sample_rate
        )
        if example is None:
            report.skipped[reason] += 1
            if len(report.examples_skipped) < 50:
                report.examples_skipped.append(f"{item_id}: {reason}" + (f" ({detail})" if detail else ""))
            continue
        example.speaker = speakers[speaker] if speakers is not None else 0
        examples.append(example)
    if progress is not None:
        progress.close()
    report.loaded = len(examples)
    check_damage(report, len(rows), path)
    return examples, report


def check_damage(report: LoadReport, rows: int, path: Path) -> None:
    """A few damaged clips are left out; more than half means the folder is broken: a CorpusError."""
    if rows and report.damaged > MAX_DAMAGED_SHARE * rows:
        raise CorpusError(
            f"{report.damaged} of the {rows} clips in {path} are missing or damaged "
            f"({'; '.join(report.examples_skipped[:3])}; ...): too few are left to train on. Prepare the "
            f"data again: delete {path.parent / 'wavs'} and run prepare_data.py --data_dir {path.parent} "
            "with the same input"
        )


def load_example(
    wav: Path, item_id: str, text: str, tokenizer, hop: int, sample_rate: int
) -> tuple[Example | None, str, str]:
    """(the example, "", "") or (None, a reason to count, a detail to name)."""
    if not wav.is_file():
        return None, "missing wav", str(wav)
    try:
        audio, rate = read_pcm16(wav)
    except (sf.LibsndfileError, RuntimeError, ValueError, EOFError) as error:  # noise, an emptied or cut file
        return None, "damaged wav", f"{wav.name} cannot be read: {str(error).strip()[:120]}"
    if len(audio) == 0:
        return None, "damaged wav", f"{wav.name} holds no audio"
    if rate != sample_rate:
        raise CorpusError(
            f"{wav} is {rate} Hz but the model runs at {sample_rate} Hz: prepare the data again "
            f"for this model (prepare_data.py --model_name ... or --sample_rate {sample_rate})"
        )
    token_ids = tokenize(tokenizer, text)
    frames = len(audio) // hop
    if len(token_ids) == 0:
        return None, "no tokens", ""
    if len(token_ids) > frames:
        return None, "more tokens than audio frames", f"{len(token_ids)} tokens, {frames} frames"
    return Example(item_id, token_ids, audio[: frames * hop]), "", ""


# ---------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryEstimate:
    clips: int
    audio_bytes: int  # int16 samples
    feature_bytes: int  # linear + mel spectrograms in float16, if precomputed
    available_bytes: int

    @property
    def fits_audio(self) -> bool:
        return self.audio_bytes + self.clips * EXAMPLE_OVERHEAD_BYTES <= RAM_SHARE * self.available_bytes

    @property
    def fits_features(self) -> bool:
        needed = self.audio_bytes + self.feature_bytes + self.clips * EXAMPLE_OVERHEAD_BYTES
        return needed <= RAM_SHARE * self.available_bytes

    def clips_that_fit(self) -> int:
        per_clip = (self.audio_bytes / max(1, self.clips)) + EXAMPLE_OVERHEAD_BYTES
        return int(RAM_SHARE * self.available_bytes / per_clip)


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"


def estimate_memory(
    data_dir: Path,
    rows: list[tuple[str, str]],
    linear_bins: int,
    n_mels: int,
    hop: int,
    available_bytes: int | None = None,
) -> MemoryEstimate:
    """RAM for these clips, from their WAV file sizes (16-bit PCM: 2 bytes a sample)."""
    import psutil

    samples = 0
    for item_id, _ in rows:
        try:
            samples += max(0, (data_dir / "wavs" / f"{item_id}.wav").stat().st_size - WAV_HEADER_BYTES) // 2
        except OSError:
            pass  # missing files are reported when loading
    frames = samples // hop
    available = psutil.virtual_memory().available if available_bytes is None else available_bytes
    return MemoryEstimate(
        clips=len(rows),
        audio_bytes=2 * samples,
        feature_bytes=2 * frames * (linear_bins + n_mels),
        available_bytes=available,
    )


def decide_precompute(estimate: MemoryEstimate, wanted: bool) -> tuple[bool, str]:
    """Whether to precompute features given the memory; raises CorpusError with a way out when the
    audio itself does not fit. Returns (precompute, a sentence for the log)."""
    if not estimate.fits_audio:
        raise CorpusError(
            f"the corpus needs about {gib(estimate.audio_bytes)} of RAM for its audio alone and "
            f"{gib(estimate.available_bytes)} is available: train on fewer clips with --max_samples "
            f"{estimate.clips_that_fit()} (about what fits), or free memory"
        )
    if wanted and not estimate.fits_features:
        return False, (
            f"precomputed features would need {gib(estimate.audio_bytes + estimate.feature_bytes)} of "
            f"{gib(estimate.available_bytes)} available: computing them on the device per batch instead"
        )
    needed = estimate.audio_bytes + (estimate.feature_bytes if wanted else 0)
    where = "precomputed" if wanted else "computed on the device per batch"
    return (
        wanted,
        f"RAM for the corpus: about {gib(needed)} of {gib(estimate.available_bytes)} available; features {where}",
    )


# ---------------------------------------------------------------- precomputed features


@torch.no_grad()
def precompute_features(
    examples: list[Example],
    features: Features,
    device: torch.device,
    hop: int,
    chunk: int = 16,
    stop: StopRequest | None = None,
) -> None:
    """Fill each example's linear and mel spectrograms (float16, on the CPU), computed on `device` in
    chunks of similar length.

    Longest first: each chunk's float32 temporaries then fit in the memory the previous, larger chunk
    freed. Shortest first made every chunk's temporaries slightly too large for the holes left between
    the kept spectrograms, and the process held twice the corpus (bench_scale: 20.5 GiB peak for a
    9.8 GiB corpus; 4.26 against 2.41 GiB for 8,000 clips)."""
    order = sorted(range(len(examples)), key=lambda i: len(examples[i].audio), reverse=True)
    for start in range(0, len(order), chunk):
        if stop is not None:
            stop.check()
        group = [examples[i] for i in order[start : start + chunk]]
        batch = collate(group, hop).to(device)
        linear = features.linear(batch.audio)
        mel = features.mel_from_linear(linear)
        for row, example in enumerate(group):
            frames = int(batch.frame_lengths[row])
            example.linear = linear[row, :, :frames].to("cpu", torch.float16)
            example.mel = mel[row, :, :frames].to("cpu", torch.float16)


@dataclass
class Corpus:
    examples: list[Example]
    report: LoadReport
    precomputed: bool
    load_s: float
    ram_bytes: int  # what the examples hold

    def lengths(self, hop: int) -> list[int]:
        return [e.frame_count(hop) for e in self.examples]

    def hours(self, sample_rate: int) -> float:
        return sum(len(e.audio) for e in self.examples) / sample_rate / 3600


def load_corpus(
    data_dir: Path,
    metadata_name: str,
    tokenizer,
    features: Features,
    sample_rate: int,
    max_samples: int,
    precompute: bool,
    device: torch.device,
    stop: StopRequest | None = None,
    speakers: dict[str, int] | None = None,
) -> Corpus:
    started = time.monotonic()
    examples, report = load_examples(
        data_dir,
        metadata_name,
        tokenizer,
        features.config.hop_length,
        sample_rate,
        max_samples,
        stop=stop,
        speakers=speakers,
    )
    if precompute and examples:
        precompute_features(examples, features, device, features.config.hop_length, stop=stop)
    return Corpus(
        examples=examples,
        report=report,
        precomputed=precompute,
        load_s=time.monotonic() - started,
        ram_bytes=sum(e.nbytes() for e in examples),
    )
