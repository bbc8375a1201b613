"""The bundled demo corpus stays small, complete and consistent with its checksums."""

import hashlib

import soundfile as sf

from tests.conftest import DEMO_CORPUS, demo_texts


def test_every_metadata_row_has_its_audio_and_the_corpus_fits_the_budget():
    rows = (DEMO_CORPUS / "metadata.csv").read_text(encoding="utf-8").splitlines()
    files = sorted((DEMO_CORPUS / "wavs").glob("*.mp3"))
    assert len(rows) == len(files) >= 300
    assert {row.split("|")[0] for row in rows} == {f.stem for f in files}
    assert sum(f.stat().st_size for f in files) <= 5_000_000
    assert sf.info(str(files[0])).samplerate == 22050


def test_checksums_match_the_files():
    for line in (DEMO_CORPUS / "SHA256SUMS").read_text(encoding="utf-8").splitlines():
        digest, name = line.split("  ", 1)
        assert hashlib.sha256((DEMO_CORPUS / name).read_bytes()).hexdigest() == digest, name


def test_the_common_voice_view_names_a_crowd_with_the_target_a_minority():
    """validated.tsv lists the same clips and texts as metadata.csv, each with its speaker (make demo's input)."""
    import csv
    from collections import Counter

    with open(DEMO_CORPUS / "validated.tsv", encoding="utf-8", newline="") as tsv:
        rows = list(csv.DictReader(tsv, delimiter="\t"))
    texts = demo_texts()
    assert {r["path"]: r["sentence"] for r in rows} == {f"wavs/{i}.mp3": t for i, t in texts.items()}
    clips = Counter(r["client_id"] for r in rows)
    assert len(clips) == 5 and 0.1 < clips["ciya"] / len(rows) < 0.2 and clips.most_common(1)[0][0] == "axin"
