#!/usr/bin/env python3
"""For the feedback demo: "record" corrections of reviewed sentences with espeak-ng, as the app's users
would record them with a microphone: in the voices of the demo crowd's other speakers, not the target's
(ciya), so that a round must learn the words without taking on their voices.

Reads REVIEW_DIR/metadata.csv (id|text, written by train_feedback.py --review) and writes each
correction as a recording app saves it: FEEDBACK_DIR/<id>.wav (22.05 kHz, as espeak-ng speaks) beside
FEEDBACK_DIR/<id>.txt (its text). Needs espeak-ng (apt-get install espeak-ng).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from make_corpus import SPEAKERS, espeak_version  # beside this script (python demo/record_corrections.py)

APP_USERS = ("axin", "baran", "evin")  # who records the corrections: not ciya


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--review_dir", required=True)
    parser.add_argument("--feedback_dir", required=True)
    args = parser.parse_args()
    espeak_version()  # exits with install advice when espeak-ng is missing
    rows = [
        line.split("|", 1) for line in (Path(args.review_dir) / "metadata.csv").read_text(encoding="utf-8").splitlines()
    ]
    folder = Path(args.feedback_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for index, (item_id, text) in enumerate(rows):
        voice, speed_wpm, pitch, _ = SPEAKERS[APP_USERS[index % len(APP_USERS)]]
        subprocess.run(
            [
                "espeak-ng",
                "-v",
                voice,
                "-s",
                str(speed_wpm),
                "-p",
                str(pitch),
                "-w",
                str(folder / f"{item_id}.wav"),
                text,
            ],
            check=True,
        )
        (folder / f"{item_id}.txt").write_text(text + "\n", encoding="utf-8")
    print(f"{len(rows)} corrections recorded with espeak-ng by {', '.join(APP_USERS)} -> {args.feedback_dir}/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
