#!/usr/bin/env python3
"""Regenerate the bundled demo corpus from demo/sentences.txt with espeak-ng.

The corpus is what the demo and the tests train on: Kurmanji sentences written for this project, spoken
by five "speakers", each an espeak-ng Kurdish voice (`-v ku` and its variants) with a speed and pitch of
its own and, for two of them, a noise floor (SPEAKERS below): a small crowd, as Common Voice is, where
the demo's target speaker (ciya) reads 15% of the clips. Kept at espeak's native 22.05 kHz so that
preparation really resamples. Two views of the same clips:

    demo/corpus/metadata.csv        id|text: the LJSpeech layout, every clip as one voice (the tests)
    demo/corpus/validated.tsv       client_id, path, sentence, up_votes, down_votes: Common Voice's, with
                                    the speakers (make demo: --dataset demo/corpus/validated.tsv)
    demo/corpus/wavs/<id>.mp3       22.05 kHz mono MP3
    demo/corpus/unspoken.txt        sentences past the size budget: text no clip contains, for test synthesis
    demo/corpus/SHA256SUMS          checksums of the above, for --check

Why MP3: FLAC fits about 4 minutes of this audio in the ~5 MB the repository can carry, MP3 about 16;
Ogg Vorbis would fit as much but libsndfile writes a random stream serial number, so its bytes differ
on every run. MP3 through libsndfile is byte-for-byte repeatable.

Byte-for-byte regeneration holds for the same espeak-ng and libsndfile versions (recorded below and
checked at start). Usage:

    python demo/make_corpus.py            # rewrite demo/corpus
    python demo/make_corpus.py --check    # regenerate into a temp folder, compare with SHA256SUMS
"""

from __future__ import annotations

import argparse
import hashlib
import io
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import soundfile as sf

DEMO_DIR = Path(__file__).resolve().parent
SENTENCES = DEMO_DIR / "sentences.txt"
CORPUS_DIR = DEMO_DIR / "corpus"

# The versions the committed corpus was made with; other versions still work but may differ in bytes.
ESPEAK_VERSION = "1.51"
LIBSNDFILE_VERSION = "1.2.2"

# name -> (espeak-ng voice, words a minute, pitch 0-99, noise floor in dB below the speech or None)
SPEAKERS = {
    "axin": ("ku", 160, 40, None),
    "baran": ("ku+m3", 175, 28, None),
    "ciya": ("ku+f2", 140, 62, None),  # the demo's target: a minority
    "dilan": ("ku+klatt", 165, 50, 30.0),
    "evin": ("ku+f4", 150, 72, 26.0),
}
# Who reads clip i: PATTERN[i % 20] (axin 7 of 20, baran 5, ciya 3, dilan 3, evin 2), no RNG involved.
PATTERN = "abacdabeabdacbadbeca"
NAMES = {name[0]: name for name in SPEAKERS}
MP3_COMPRESSION = 0.8  # libsndfile's 0 (best) .. 1 (smallest); 0.8 is about 39 kbit/s here
MAX_CORPUS_BYTES = 5_000_000


def read_sentences(path: Path) -> list[str]:
    lines = path.read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def speaker_of(index: int) -> str:
    return NAMES[PATTERN[index % len(PATTERN)]]


def voice_settings(index: int) -> tuple[str, int, int, float | None]:
    """Voice, speed (words per minute), pitch (0-99) and noise floor for clip `index`: its speaker's, with a
    fixed spread of its own (speed +-12, pitch +-6), no RNG involved."""
    voice, speed_wpm, pitch, noise_db = SPEAKERS[speaker_of(index)]
    return voice, speed_wpm - 12 + (index * 37) % 25, pitch - 6 + (index * 23) % 13, noise_db


def speak(text: str, voice: str, speed_wpm: int, pitch: int, noise_db: float | None, seed: int) -> tuple[bytes, int]:
    """Run espeak-ng, add the noise floor (seeded: the same bytes every time), return MP3 bytes and the rate."""
    cmd = ["espeak-ng", "-v", voice, "-s", str(speed_wpm), "-p", str(pitch), "--stdout", text]
    wav_bytes = subprocess.run(cmd, check=True, capture_output=True).stdout
    samples, sample_rate = sf.read(io.BytesIO(wav_bytes), dtype="int16")
    if noise_db is not None:
        speech = samples.astype(np.float64)
        level = np.sqrt(np.mean(speech**2)) / 10 ** (noise_db / 20)
        noisy = speech + level * np.random.default_rng(seed).standard_normal(len(speech))
        samples = np.clip(np.round(noisy), -32768, 32767).astype(np.int16)
    out = io.BytesIO()
    sf.write(out, samples, sample_rate, format="MP3", subtype="MPEG_LAYER_III", compression_level=MP3_COMPRESSION)
    return out.getvalue(), sample_rate


def espeak_version() -> str:
    try:
        out = subprocess.run(["espeak-ng", "--version"], check=True, capture_output=True, text=True).stdout
    except FileNotFoundError:
        sys.exit("espeak-ng is not installed: `sudo apt-get install espeak-ng` (Debian/Ubuntu).")
    # "eSpeak NG text-to-speech: 1.51  Data at: ..."
    return out.split(":")[1].split()[0]


def build(out_dir: Path) -> None:
    """Speak sentences in file order until the next clip would pass MAX_CORPUS_BYTES."""
    sentences = read_sentences(SENTENCES)
    wav_dir = out_dir / "wavs"
    wav_dir.mkdir(parents=True, exist_ok=True)
    rows, tsv, seconds, total_bytes = [], ["client_id\tpath\tsentence\tup_votes\tdown_votes"], 0.0, 0
    for index, text in enumerate(sentences):
        mp3, sample_rate = speak(text, *voice_settings(index), seed=index)
        if total_bytes + len(mp3) > MAX_CORPUS_BYTES:
            break
        clip_id = f"kmr_demo_{index + 1:04d}"
        (wav_dir / f"{clip_id}.mp3").write_bytes(mp3)
        rows.append(f"{clip_id}|{text}")
        tsv.append(f"{speaker_of(index)}\twavs/{clip_id}.mp3\t{text}\t2\t0")
        seconds += sf.info(str(wav_dir / f"{clip_id}.mp3")).duration
        total_bytes += len(mp3)
    (out_dir / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    (out_dir / "validated.tsv").write_text("\n".join(tsv) + "\n", encoding="utf-8")
    (out_dir / "unspoken.txt").write_text("\n".join(sentences[len(rows) :]) + "\n", encoding="utf-8")
    write_checksums(out_dir)
    readers = [speaker_of(index) for index in range(len(rows))]
    print(
        f"{len(rows)} clips, {seconds / 60:.1f} min of audio, {total_bytes / 1e6:.2f} MB -> {out_dir}; clips per "
        f"speaker: {', '.join(f'{name} {readers.count(name)}' for name in SPEAKERS)}"
    )
    print(f"{len(sentences) - len(rows)} sentences left over (budget {MAX_CORPUS_BYTES / 1e6:.0f} MB): unspoken.txt")


def checksum_lines(folder: Path) -> list[str]:
    files = [
        folder / "metadata.csv",
        folder / "validated.tsv",
        folder / "unspoken.txt",
        *sorted((folder / "wavs").glob("*.mp3")),
    ]
    return [f"{hashlib.sha256(f.read_bytes()).hexdigest()}  {f.relative_to(folder).as_posix()}" for f in files]


def write_checksums(folder: Path) -> None:
    (folder / "SHA256SUMS").write_text("\n".join(checksum_lines(folder)) + "\n", encoding="utf-8")


def check() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        build(Path(tmp))
        fresh = (Path(tmp) / "SHA256SUMS").read_text(encoding="utf-8")
    committed = (CORPUS_DIR / "SHA256SUMS").read_text(encoding="utf-8")
    if fresh == committed:
        print("identical: regenerated corpus matches demo/corpus/SHA256SUMS byte for byte")
        return 0
    differing = set(fresh.splitlines()) ^ set(committed.splitlines())
    print(f"DIFFERENT: {len(differing)} checksum lines differ (versions: see the top of this script)")
    return 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="regenerate into a temp folder and compare checksums")
    args = parser.parse_args()
    found = espeak_version()
    if found != ESPEAK_VERSION or sf.__libsndfile_version__ != LIBSNDFILE_VERSION:
        print(
            f"note: corpus was made with espeak-ng {ESPEAK_VERSION} and libsndfile {LIBSNDFILE_VERSION}; "
            f"found {found} and {sf.__libsndfile_version__}: the bytes may differ"
        )
    if args.check:
        return check()
    if CORPUS_DIR.exists():
        shutil.rmtree(CORPUS_DIR)
    build(CORPUS_DIR)
    return 0


if __name__ == "__main__":
    sys.exit(main())
