"""The bundled demo corpus stays small, complete and consistent with its checksums."""

import hashlib

import soundfile as sf

from tests.conftest import DEMO_CORPUS


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
