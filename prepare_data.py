#!/usr/bin/env python3
"""Prepare a speech corpus for fine-tuning: clips -> 16 kHz mono WAVs, metadata and a report.

    python prepare_data.py                                   # the default hub dataset -> training/
    python prepare_data.py --input_dir my_ljspeech_folder    # wavs/ + metadata.csv (id|text)
    python prepare_data.py --dataset saved_dataset_dir       # save_to_disk folder or audiofolder
    python prepare_data.py --dataset clips.tsv               # CSV/TSV manifest (Common Voice TSVs work)

Writes DATA_DIR/wavs/<id>.wav, DATA_DIR/metadata.csv and metadata_val.csv (id|text) and
DATA_DIR/prepare_report.json, which lists every dropped clip with its reason. Running it again reuses
finished clips. Exit status: 0 when at least one clip was kept, 1 when none was, 2 for a wrong source
or wrong flags.
"""

from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from finetune.cli import ConfigError, config_to_dict, flag, parse_config
from finetune.data.prepare import ClipSettings, Preparer
from finetune.data.prepared_folder import write_outputs
from finetune.data.quality import QualityLimits
from finetune.data.sources import SourceError, open_source
from finetune.data.text import TextNormalizer
from finetune.reporting.prepare_page import write_page
from finetune.system.errors import ToolError
from finetune.system.model_source import ModelSourceError, model_sample_rate, model_vocabulary, resolve_model


@dataclass
class PrepareConfig:
    dataset: str = flag(
        "amedcj/kurmanji-commonvoice", "hub id, save_to_disk folder, audiofolder, or .csv/.tsv manifest"
    )
    input_dir: str | None = flag(None, "LJSpeech-style folder (wavs/ + metadata.csv); used instead of --dataset")
    split: str = flag("train", "split to take from a dataset with several")
    audio_column: str | None = flag(None, "audio column (default: the first of audio, path, file, ...)")
    text_column: str | None = flag(None, "text column (default: the first of sentence, text, transcription, ...)")
    id_column: str | None = flag(None, "column to name clips by (default: the audio file name, else the row)")
    speaker_column: str | None = flag(
        None,
        "the column naming each clip's speaker (default: client_id, speaker_id or "
        "speaker when the source has one; Common Voice's client_id is found)",
    )
    speaker: str | None = flag(
        None, "keep only this speaker's clips (default: every speaker, each named in metadata.csv)"
    )
    data_dir: str = flag("training", "output folder")
    model_name: str = flag(
        "facebook/mms-tts-kmr-script_latin",
        "model whose vocabulary and sample rate the text and audio must fit: hub id, "
        "local folder, or scratch[:tiny|small|mms] (open vocabulary, 16 kHz)",
    )
    sample_rate: int = flag(0, "output sample rate in Hz (0: the model's)")
    val_fraction: float = flag(0.02, "share of kept clips held out for validation (at least one)")
    min_seconds: float = flag(0.5, "drop clips shorter than this after trimming (seconds)")
    max_seconds: float = flag(15.0, "drop clips longer than this after trimming (seconds; 0: no limit)")
    trim_db: float = flag(40.0, "trim leading/trailing audio this many dB below the clip's loudest part")
    trim_margin_seconds: float = flag(0.05, "silence kept at each end after trimming (seconds)")
    peak: float = flag(0.95, "peak level after normalisation (fraction of full scale)")
    num_workers: int = flag(
        os.cpu_count() or 1, "parallel worker processes for audio (under 100 clips: this process alone)"
    )
    max_samples: int = flag(0, "use only the first N items of the source (0: all)")
    min_snr_db: float = flag(
        0.0,
        "drop clips whose noise estimate (loud frames over the noise floor) is below this, "
        "in dB (0: keep all; 15-20 drops noisy recordings)",
    )
    max_clipping: float = flag(0.0, "drop clips with more than this share of clipped samples (0: keep all; e.g. 0.001)")
    max_silence: float = flag(0.0, "drop clips that are more than this share silence (0: keep all; e.g. 0.6)")
    max_rate_deviation: float = flag(
        0.0,
        "drop clips whose characters a second differ from their speaker's median by "
        "more than this share (0: keep all; 0.5 drops likely mismatched transcripts)",
    )
    dnsmos: bool = flag(
        False,
        "also measure each kept clip's DNSMOS (needs requirements-naturalness.txt; about 0.1 s a clip on a CPU core)",
    )
    min_dnsmos: float = flag(
        0.0, "with --dnsmos: drop clips whose DNSMOS overall is below this (0: keep all; e.g. 2.5)"
    )

    def __post_init__(self):
        problems = []
        if not 0 <= self.val_fraction <= 0.5:
            problems.append(f"--val_fraction {self.val_fraction}: use a value from 0 to 0.5")
        if self.min_seconds < 0:
            problems.append(f"--min_seconds {self.min_seconds}: must be 0 or more")
        if self.max_seconds and self.max_seconds <= self.min_seconds:
            problems.append(f"--max_seconds {self.max_seconds} must exceed --min_seconds {self.min_seconds} (or be 0)")
        if self.sample_rate and self.sample_rate < 8000:
            problems.append(f"--sample_rate {self.sample_rate}: use 8000 Hz or more (or 0 for the model's)")
        if self.trim_db <= 0:
            problems.append(f"--trim_db {self.trim_db}: must be positive")
        if not 0 < self.peak <= 1:
            problems.append(f"--peak {self.peak}: use a value in (0, 1]")
        if self.num_workers < 1:
            problems.append(f"--num_workers {self.num_workers}: must be 1 or more")
        if self.max_samples < 0:
            problems.append(f"--max_samples {self.max_samples}: must be 0 (all) or more")
        for name in ("min_snr_db", "max_clipping", "max_silence", "max_rate_deviation", "min_dnsmos"):
            if getattr(self, name) < 0:
                problems.append(f"--{name} {getattr(self, name)}: must be 0 (off) or more")
        if self.min_dnsmos and not self.dnsmos:
            problems.append("--min_dnsmos needs --dnsmos (the measure it reads)")
        if problems:
            raise ConfigError(problems)


def print_summary(report: dict, data_dir: Path) -> None:
    counts, hours = report["counts"], report["hours"]
    print(
        f"kept {counts['kept']} of {counts['items']} clips ({hours['kept']:.2f} h): "
        f"{counts['train']} train ({hours['train']:.2f} h), {counts['val']} validation; "
        f"{counts['reused']} reused from an earlier run, {counts['processed']} processed now"
    )
    for reason, count in report["dropped_by_reason"].items():
        print(f"  dropped {count:5d}  {reason}: {report['drop_reasons'][reason]}")
    if report["out_of_vocabulary_characters"]:
        chars = ", ".join(f"{c!r} x{n}" for c, n in list(report["out_of_vocabulary_characters"].items())[:15])
        print(f"  characters the vocabulary lacks: {chars}")
    speakers = report["speakers"]
    if len(speakers) > 1:
        top = ", ".join(
            f"{name} ({entry['clips']} clips, {entry['hours']:.2f} h, {entry['val_clips']} held out)"
            for name, entry in list(speakers.items())[:3]
        )
        target, entry = next(iter(speakers.items()))
        others_h = sum(e["hours"] for e in speakers.values()) - entry["hours"]
        print(
            f"{len(speakers)} speakers; most hours: {top}. train_vits.py speaks as {target} (the most hours) "
            "unless given --target_speaker; from a pretrained voice a default run (--speakers auto: target_only) "
            f"trains on {target}'s {entry['hours']:.2f} h alone and leaves out the other {len(speakers) - 1} "
            f"speakers' {others_h:.2f} h (--speakers conditioned trains on every clip)"
        )
    print(
        f"wrote {data_dir}/metadata.csv, metadata_val.csv, quality.csv, wavs/; every drop is listed in "
        f"{data_dir}/prepare_report.json, each speaker and the clips' quality in {data_dir}/prepare_report.html"
    )
    warning = held_out_warning(report)
    if warning:
        print(warning, file=sys.stderr)


def held_out_warning(report: dict) -> str | None:
    """When the clips that will judge training (the held-out ones; with several speakers, those of the
    speaker with most hours, the default target) are too few to tell close models apart."""
    from finetune.reporting.measures import MIN_DECIDING_CLIPS, few_held_out

    counts, speakers = report["counts"], report["speakers"]
    if not counts["val"] or not counts["kept"]:
        return None  # --val_fraction 0 is a choice; training says what it judges on instead
    several = len(speakers) > 1
    name, first = next(iter(speakers.items())) if several else ("", {})
    judged, share = (first["val_clips"], first["clips"]) if several else (counts["val"], counts["kept"])
    wanted = min(0.5, math.ceil(100 * MIN_DECIDING_CLIPS / max(1, share)) / 100)
    return few_held_out(
        judged,
        f"prepare again with --val_fraction {wanted:g}"
        if wanted < 0.5
        else "record more clips of the voice, or prepare with a larger --val_fraction",
        f" of {name} (the default --target_speaker; another's are in prepare_report.html)" if several else "",
    )


def measure_dnsmos(tally, data_dir: Path) -> None:
    """DNSMOS overall of each kept clip, into its quality (the optional speechmos extra)."""
    from finetune.data.audio import read_pcm16
    from finetune.reporting import naturalness
    from finetune.system.progress import Progress

    if not naturalness.available():
        raise ConfigError([f"--dnsmos: its optional extra is not installed ({naturalness.INSTALL_HINT})"])
    scorer = naturalness.load_naturalness(True)
    progress = Progress("dnsmos", total=len(tally.kept), unit="clips")
    for item_id, clip in tally.kept.items():
        if clip.quality.get("dnsmos") is None:
            samples, rate = read_pcm16(data_dir / "wavs" / f"{item_id}.wav")
            clip.quality["dnsmos"] = round(scorer.overall(samples.astype("float32") / 32768.0, rate), 3)
        progress.update()
    progress.close()


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    config = parse_config(PrepareConfig, argv, __doc__)
    data_dir = Path(config.data_dir)

    # Model: its vocabulary decides which texts are sayable; its rate is the output rate.
    model = resolve_model(config.model_name)
    normalizer = TextNormalizer(model_vocabulary(model))
    sample_rate = config.sample_rate or model_sample_rate(model)

    # Source: the corpus to read, as (id, text, audio) items.
    source = open_source(
        config.input_dir,
        config.dataset,
        split=config.split,
        audio_column=config.audio_column,
        text_column=config.text_column,
        id_column=config.id_column,
        speaker_column=config.speaker_column,
        speaker=config.speaker,
        max_samples=config.max_samples,
    )
    print(f"source: {source.description}, {source.count} items -> {data_dir} at {sample_rate} Hz")

    # Work: every clip processed or reused; every drop recorded with its reason.
    settings = ClipSettings(
        sample_rate=sample_rate,
        trim_db=config.trim_db,
        trim_margin_s=config.trim_margin_seconds,
        peak=config.peak,
        min_seconds=config.min_seconds,
        max_seconds=config.max_seconds,
    )
    preparer = Preparer(data_dir, normalizer, settings, config.num_workers)
    tally = preparer.run(source)
    if config.dnsmos:
        measure_dnsmos(tally, data_dir)

    # Outputs: train/validation metadata, each clip's quality, the report and its page.
    limits = QualityLimits(
        config.min_snr_db, config.max_clipping, config.max_silence, config.max_rate_deviation, config.min_dnsmos
    )
    report = write_outputs(
        data_dir,
        tally,
        config.val_fraction,
        {
            "source": source.description,
            "config": config_to_dict(config),
            "settings": asdict(settings),
            "vocabulary": "open (scratch model)"
            if normalizer.vocabulary is None
            else "".join(sorted(normalizer.vocabulary)),
            **source.notes,
            "elapsed_s": round(time.monotonic() - started, 2),
        },
        limits,
    )
    write_page(data_dir, report, tally)
    print_summary(report, data_dir)
    if not report["counts"]["kept"]:
        print("error: no clip survived preparation; the reasons are above and in prepare_report.json", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except (ModelSourceError, SourceError) as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except ToolError as error:  # a full disk (finetune/data/prepare.py NotWritten)
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    except KeyboardInterrupt:
        print("\ninterrupted: finished clips are cached; run the same command again to continue", file=sys.stderr)
        sys.exit(130)
