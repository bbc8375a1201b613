#!/usr/bin/env python3
"""For the feedback demo: "record" corrections of reviewed sentences with espeak-ng, the demo corpus's
speaker, as a user would record them with a microphone.

Reads REVIEW_DIR/metadata.csv (id|text, written by train_feedback.py --review) and writes each
correction as a recording app saves it: FEEDBACK_DIR/<id>.wav (22.05 kHz, as espeak-ng speaks) beside
FEEDBACK_DIR/<id>.txt (its text). Needs espeak-ng (apt-get install espeak-ng).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_corpus import VOICE, espeak_version, voice_settings  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--review_dir", required=True)
    parser.add_argument("--feedback_dir", required=True)
    args = parser.parse_args()
    espeak_version()  # exits with install advice when espeak-ng is missing
    rows = [line.split("|", 1) for line in (Path(args.review_dir) / "metadata.csv").read_text(encoding="utf-8").splitlines()]
    folder = Path(args.feedback_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for index, (item_id, text) in enumerate(rows):
        speed_wpm, pitch = voice_settings(index)
        subprocess.run(["espeak-ng", "-v", VOICE, "-s", str(speed_wpm), "-p", str(pitch), "-w",
                        str(folder / f"{item_id}.wav"), text], check=True)
        (folder / f"{item_id}.txt").write_text(text + "\n", encoding="utf-8")
    print(f"{len(rows)} corrections recorded with espeak-ng -> {args.feedback_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
