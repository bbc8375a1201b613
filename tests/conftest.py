"""Shared test helpers: tiny audio, tiny corpora and a tokenizer folder, all built on the fly (no network)."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

REPO = Path(__file__).resolve().parent.parent
DEMO_CORPUS = REPO / "demo" / "corpus"
# The tests' model: scratch:micro, tiny's widths halved and two posterior layers (0.18M parameters against 0.73M):
# what the runs here test is the machinery around the model; micro's step costs about a third less (61 ms against
# 88-92), its synthesis a fifth (test_phases.py with test_reliability.py, serially: 97.95 s against 115.12 s;
# bench/log/2026-12-03.md). The demo, the bench smokes and test_generator.py/test_export.py's graphs keep tiny.
TEST_SIZE = "micro"

# One thread a process: `make test` runs the suite in parallel processes (pytest-xdist, one a core), where
# torch's default (a thread a core in every process) only makes them fight. Subprocesses inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")

# A hub that cannot answer: any test that reaches for the network fails fast instead of hanging.
os.environ["HF_ENDPOINT"] = "http://127.0.0.1:9"
os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"


# What the suite holds on disk at once, at most: 0.3 GB over what it started with, measured with pytest.ini's
# tmp_path_retention_policy (a passing test's folder goes at its teardown); bench/RESULTS.md has the run.
SUITE_PEAK_DISK_GB = 0.3


def pytest_sessionstart(session) -> None:
    """A line up front when the tests' disk is nearly full: such a CI disk failed seven tests with DiskTooSmall
    in the suite's last minute, after four minutes of passing ones."""
    import tempfile

    free_gb = shutil.disk_usage(tempfile.gettempdir()).free / 1e9
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if free_gb < 2 * SUITE_PEAK_DISK_GB and reporter is not None:
        reporter.write_line(
            f"warning: {free_gb:.2f} GB free for the tests' folders ({tempfile.gettempdir()}), and they need about "
            f"{SUITE_PEAK_DISK_GB} GB at once: tests that train will fail with DiskTooSmall; free space first",
            yellow=True,
        )


def demo_texts() -> dict[str, str]:
    """The bundled demo corpus's texts by clip id (its metadata.csv)."""
    rows = (DEMO_CORPUS / "metadata.csv").read_text(encoding="utf-8").splitlines()
    return dict(row.split("|", 1) for row in rows)


def tone(
    freq_hz: float = 440.0,
    seconds: float = 1.0,
    sample_rate: int = 22050,
    channels: int = 1,
    amplitude: float = 0.3,
    pad_silence_s: float = 0.0,
) -> np.ndarray:
    """A sine of `seconds`, with `pad_silence_s` of silence on each side; float32 [frames] or [frames, ch]."""
    t = np.arange(int(seconds * sample_rate)) / sample_rate
    wave = (amplitude * np.sin(2 * np.pi * freq_hz * t)).astype(np.float32)
    pad = np.zeros(int(pad_silence_s * sample_rate), dtype=np.float32)
    wave = np.concatenate([pad, wave, pad])
    return np.stack([wave] * channels, axis=1) if channels > 1 else wave


def encode(samples: np.ndarray, sample_rate: int, fmt: str = "WAV") -> bytes:
    out = io.BytesIO()
    sf.write(out, samples, sample_rate, format=fmt)
    return out.getvalue()


def write_ljspeech(
    folder: Path, rows: list[tuple[str, str, np.ndarray | bytes | None]], sample_rate: int = 22050, ext: str = "wav"
) -> Path:
    """metadata.csv + wavs/<id>.<ext>; a row's audio may be samples, raw bytes (e.g. corrupt), or None (no file)."""
    (folder / "wavs").mkdir(parents=True, exist_ok=True)
    lines = []
    for item_id, text, audio in rows:
        lines.append(f"{item_id}|{text}")
        path = folder / "wavs" / f"{item_id}.{ext}"
        if isinstance(audio, bytes):
            path.write_bytes(audio)
        elif audio is not None:
            sf.write(path, audio, sample_rate)
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder


def make_tokenizer_dir(folder: Path, characters: str) -> Path:
    """A model folder holding only an MMS-style tokenizer whose vocabulary is `characters` (id 0 first)."""
    from transformers import VitsTokenizer

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {char: index for index, char in enumerate(characters)}
    vocab_file = folder / "vocab.json"
    vocab_file.write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    tokenizer = VitsTokenizer(str(vocab_file), pad_token=characters[0], phonemize=False, normalize=True)
    tokenizer.save_pretrained(str(folder))
    return folder


KURMANJI_LETTERS = "abcçdeêfghiîjklmnopqrsştuûvwxyz"


@pytest.fixture
def kurmanji_model_dir(tmp_path: Path) -> Path:
    return make_tokenizer_dir(tmp_path / "model", KURMANJI_LETTERS + " '-")


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A folder that `build(folder)` makes once for the whole session, in whichever test process asks
    first; the others (make test runs several, pytest-xdist) wait for it and share it. For what the tests
    only read, and is costly to make (a trained model: each process trained its own)."""
    from filelock import FileLock

    basetemp = tmp_path_factory.getbasetemp()
    root = basetemp.parent if os.environ.get("PYTEST_XDIST_WORKER") else basetemp  # the session's, not older ones
    folder, done = root / name, root / f"{name}.built"
    with FileLock(str(root / f"{name}.lock")):
        if not done.is_file():
            shutil.rmtree(folder, ignore_errors=True)  # what a build that failed in another process left
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def prepared_demo(tmp_path_factory) -> Path:
    """The first 24 demo clips prepared with an open vocabulary (16 kHz WAVs + metadata)."""
    import prepare_data

    data_dir = tmp_path_factory.mktemp("demo_data")
    code = prepare_data.main(
        [
            "--input_dir",
            str(DEMO_CORPUS),
            "--data_dir",
            str(data_dir),
            "--model_name",
            "scratch:tiny",
            "--max_samples",
            "24",
            "--num_workers",
            "1",
            "--val_fraction",
            "0.2",
        ]
    )
    assert code == 0
    return data_dir


def tiny_generator(data_dir: Path, seed: int = 0, size: str = TEST_SIZE, **config_overrides):
    """A seeded scratch:micro VitsModel (ready for training) and tokenizer for the texts in data_dir; `size`
    "tiny" where a test reads what the untrained model says (micro's is near silence, which the evaluation
    calls a collapsed voice)."""
    import torch

    from finetune.data.metadata import read_metadata
    from finetune.vits.generator import SCRATCH_CONFIGS, ready_for_training, scratch_generator

    torch.manual_seed(seed)
    texts = [t for name in ("metadata.csv", "metadata_val.csv") for _, t in read_metadata(data_dir / name)]
    vocabulary = sorted(set("".join(texts)))
    if config_overrides:
        saved = dict(SCRATCH_CONFIGS[size])
        SCRATCH_CONFIGS[size] = {**saved, **config_overrides}
        try:
            loaded = scratch_generator(size, vocabulary, 16000)
        finally:
            SCRATCH_CONFIGS[size] = saved
    else:
        loaded = scratch_generator(size, vocabulary, 16000)
    ready_for_training(loaded.model)
    return loaded


def demo_batch(data_dir: Path, tokenizer, count: int = 4):
    """A float batch of the first `count` training clips, on the CPU."""
    from finetune.data.corpus import load_examples
    from finetune.data.examples import collate

    examples, _ = load_examples(data_dir, "metadata.csv", tokenizer, hop=256, sample_rate=16000, max_samples=count)
    return collate(examples, hop=256).to("cpu")


# Session-scoped, here for test_feedback.py and test_finding.py, and trained once for the session (built_once): a
# module's fixture is torn down whenever its process steals a test from another module (make test: --dist
# worksteal), and this one was trained three times, 9 s each.
@pytest.fixture(scope="session")
def base_run(prepared_demo, tmp_path_factory):
    """A tiny model trained for a few epochs on the first demo clips (best_model with its discriminator).
    30 steps from scratch do not learn the corpus's tempo; the timing rule is relaxed for these tests (it
    has its own)."""
    return built_once(tmp_path_factory, "feedback_base", lambda run: train_base(prepared_demo, run))


def train_base(prepared_demo: Path, run: Path) -> None:
    import train_vits

    fake = FakeClock()
    code = train_vits.main(
        [
            "--data_dir",
            str(prepared_demo),
            "--checkpoint_dir",
            str(run / "checkpoints"),
            "--output_dir",
            str(run / "final_model"),
            "--model_name",
            f"scratch:{TEST_SIZE}",
            "--discriminator_width",
            "0.0625",
            "--discriminator_periods",
            "2",
            "3",
            "--batch_size",
            "4",
            "--gradient_accumulation_steps",
            "1",
            "--learning_rate",
            "2e-3",
            "--benchmark_samples",
            "8",
            "--val_samples",
            "3",
            "--max_epochs",
            "6",
            "--target_hours",
            "1",
            "--val_every",
            "100",
            "--log_every_seconds",
            "60",
            "--max_length_ratio",
            "100",
            "--report_to",
            "none",
        ],
        clock=clock_for(fake),
    )
    assert code == 0


# ---------------------------------------------------------------- injected time


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def now(self) -> float:
        return self.t


def clock_for(fake: FakeClock):
    from finetune.training.budget import Clock

    return Clock(fake.now)


def micro_batches_take(patch: pytest.MonkeyPatch, seconds: float = 3.0) -> FakeClock:
    """A fake clock that each micro-batch advances by `seconds` (for module-scoped runs, which cannot use
    the `timed_work` fixture)."""
    from finetune.training import step

    fake, real = FakeClock(), step.TrainStep.accumulate

    def accumulate(self, *args, **kwargs):
        fake.t += seconds
        return real(self, *args, **kwargs)

    patch.setattr(step.TrainStep, "accumulate", accumulate)
    return fake


@pytest.fixture
def timed_work(monkeypatch):
    """Micro-batches take `micro_batch_s`, evaluations `eval_s`, checkpoints `checkpoint_s` and model
    exports `export_s` of fake time (an optimizer step of n micro-batches: n * micro_batch_s; with
    costs["clips"] set, a micro-batch of fewer clips than that takes its share)."""
    fake = FakeClock()
    costs = {"micro_batch_s": 3.0, "eval_s": 1.0, "checkpoint_s": 2.0, "export_s": 1.0}
    from finetune.reporting import evaluation
    from finetune.training import saving, step

    real_accumulate, real_evaluate = step.TrainStep.accumulate, evaluation.Evaluator.evaluate
    real_save, real_export = saving.save_checkpoint, saving.export_model

    def save_checkpoint(*args, **kwargs):
        fake.t += costs["checkpoint_s"]
        return real_save(*args, **kwargs)

    def export_model(*args, **kwargs):
        fake.t += costs["export_s"]
        return real_export(*args, **kwargs)

    def accumulate(self, batch, *args, **kwargs):
        # costs["clips"], when set: a micro-batch of that many clips takes micro_batch_s, a cut one its share
        fake.t += costs["micro_batch_s"] * (len(batch) / costs["clips"] if costs.get("clips") else 1.0)
        return real_accumulate(self, batch, *args, **kwargs)

    def evaluate(self, *args, **kwargs):
        fake.t += costs["eval_s"]
        return real_evaluate(self, *args, **kwargs)

    monkeypatch.setattr(saving, "save_checkpoint", save_checkpoint)
    monkeypatch.setattr(saving, "export_model", export_model)
    monkeypatch.setattr(step.TrainStep, "accumulate", accumulate)
    monkeypatch.setattr(evaluation.Evaluator, "evaluate", evaluate)
    return fake, costs


# The modules in the order of their tests' summed time, slowest first (each 20-140 s of test time on 2 cores);
# the rest after them. With `--dist worksteal` (make test) a process that runs out of tests takes the later half
# of the other's queue, so the suite ends on short tests on both cores instead of a long one running alone on
# one (the two processes ended 5-6 s apart when test_feedback.py's tests were the last, in alphabetical order).
SLOW_MODULES_FIRST = (
    "test_bench_smoke.py",
    "test_reliability.py",
    "test_feedback.py",
    "test_phases.py",
    "test_distributed.py",
    "test_speakers.py",
    "test_train.py",
)


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        name = item.path.name
        return SLOW_MODULES_FIRST.index(name) if name in SLOW_MODULES_FIRST else len(SLOW_MODULES_FIRST)

    items.sort(key=rank)  # stable: each module's order kept
