"""The demo corpus prepared for a benchmark: as users prepare it (prepare_data.py), into a folder of its own."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def prepare_demo(folder: Path, val_fraction: float = 0.0, max_samples: int = 0) -> Path:
    """The demo corpus (its first `max_samples` clips; 0: all) prepared for a scratch model; no held-out clips
    unless asked (a training step needs none)."""
    import prepare_data

    assert (
        prepare_data.main(
            [
                "--input_dir",
                str(REPO / "demo" / "corpus"),
                "--data_dir",
                str(folder),
                "--model_name",
                "scratch",
                "--num_workers",
                "2",
                "--val_fraction",
                str(val_fraction),
                "--max_samples",
                str(max_samples),
            ]
        )
        == 0
    )
    return folder
