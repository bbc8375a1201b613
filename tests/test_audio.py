"""Audio steps: decode from bytes and paths, resample, trim, normalise, atomic 16-bit writes."""

import numpy as np
import pytest
import soundfile as sf

from finetune.data import audio
from finetune.data.prepare import ClipJob, ClipSettings, process_clip
from tests.conftest import DEMO_CORPUS, encode, tone

SETTINGS = ClipSettings(
    sample_rate=16000, trim_db=40.0, trim_margin_s=0.05, peak=0.95, min_seconds=0.1, max_seconds=10.0
)


def dominant_frequency(samples: np.ndarray, sample_rate: int) -> float:
    spectrum = np.abs(np.fft.rfft(samples * np.hanning(len(samples))))
    return float(np.fft.rfftfreq(len(samples), 1 / sample_rate)[spectrum.argmax()])


def test_sine_at_44k1_stereo_comes_out_16k_mono_with_its_peak_at_1khz(tmp_path):
    stereo = tone(1000.0, seconds=1.0, sample_rate=44100, channels=2)
    out = tmp_path / "sine.wav"
    result = process_clip(ClipJob("sine", None, encode(stereo, 44100), str(out), SETTINGS))
    assert result.reason is None
    info = sf.info(str(out))
    assert (info.samplerate, info.channels, info.subtype) == (16000, 1, "PCM_16")
    samples, rate = sf.read(str(out), dtype="float32")
    assert abs(dominant_frequency(samples, rate) - 1000.0) <= rate / len(samples) + 1e-6
    assert abs(len(samples) / rate - 1.0) < 0.02
    assert abs(np.abs(samples).max() - 0.95) < 1e-3


@pytest.mark.parametrize("fmt", ["FLAC", "OGG", "MP3"])
def test_compressed_formats_decode_from_bytes(fmt):
    samples, rate = audio.decode(encode(tone(440.0, 0.5, 22050), 22050, fmt))
    assert rate == 22050 and samples.shape[1] == 1 and len(samples) > 0.4 * 22050


def test_trimming_removes_silence_but_keeps_a_margin():
    padded = tone(300.0, seconds=1.0, sample_rate=16000, pad_silence_s=0.8)
    trimmed = audio.trim_silence(padded, 16000, top_db=40.0, margin_s=0.05)
    frame_s = 1024 / 16000  # trimming works in frames; each end may keep up to one frame of silence
    assert 1.0 <= len(trimmed) / 16000 <= 1.0 + 2 * 0.05 + 2 * frame_s  # vs 2.6 s before trimming


def test_the_loud_span_is_the_one_librosa_trim_finds():
    """Our numpy framing against librosa.effects.trim itself: demo clips, bursts in noise, silence."""
    import librosa

    rng = np.random.default_rng(0)
    signals = [audio.decode(path)[0][:, 0] for path in sorted((DEMO_CORPUS / "wavs").glob("*.wav"))[:20]]
    for _ in range(20):
        burst = np.zeros(int(rng.integers(2000, 30000)), dtype=np.float32)
        at = int(rng.integers(0, len(burst) - 600))
        burst[at : at + int(rng.integers(10, 600))] = rng.normal() * rng.random()
        signals.append(burst + rng.normal(size=len(burst)).astype(np.float32) * 10 ** rng.uniform(-6, -2))
    signals.append(np.zeros(5000, dtype=np.float32))
    for samples in signals:
        for top_db in (20.0, 40.0, 60.0):
            _, expected = librosa.effects.trim(samples, top_db=top_db, frame_length=1024, hop_length=256)
            assert audio.loud_span(samples, top_db) == tuple(int(i) for i in expected)


def test_corrupt_and_missing_audio_raise_with_reasons(tmp_path):
    with pytest.raises(audio.AudioError) as corrupt:
        audio.decode(b"RIFF\x00\x00\x00\x00WAVEjunkjunk")
    assert corrupt.value.reason == "unreadable_audio"
    with pytest.raises(audio.AudioError) as missing:
        audio.decode(tmp_path / "nope.wav")
    assert missing.value.reason == "missing_file"


def test_silent_clip_is_dropped_as_silent(tmp_path):
    silence = np.zeros(16000, dtype=np.float32)
    result = process_clip(ClipJob("quiet", None, encode(silence, 16000), str(tmp_path / "q.wav"), SETTINGS))
    assert result.reason == "silent_audio"
    assert not (tmp_path / "q.wav").exists()


def test_write_is_atomic_and_leaves_no_temporary_files(tmp_path):
    audio.write_pcm16(tmp_path / "a.wav", tone(200.0, 0.2, 16000), 16000)
    assert [p.name for p in tmp_path.iterdir()] == ["a.wav"]
    samples, rate = audio.read_pcm16(tmp_path / "a.wav")
    assert samples.dtype == np.int16 and rate == 16000


def test_written_files_get_ordinary_permissions(tmp_path):
    import os
    import stat

    from finetune.system.atomic import FILE_MODE

    audio.write_pcm16(tmp_path / "a.wav", tone(200.0, 0.2, 16000), 16000)
    assert stat.S_IMODE(os.stat(tmp_path / "a.wav").st_mode) == FILE_MODE and FILE_MODE & 0o044  # others can read
