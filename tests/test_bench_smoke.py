"""Every benchmark script runs, on its smallest setting: none breaks unseen between the times it is measured
with. Each is launched as a user launches it (a process from the repository root) and must exit 0 and say
which machine it ran on; the figures themselves are the benchmark's business (bench/RESULTS.md)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

# script -> its smallest setting; "{data}" is a prepared demo folder (the session's shared one). Runs of
# train_vits.py end by their epochs, inside budgets with room for a machine 3x slower beside busy processes:
# no smoke test depends on how fast the machine is.
SMOKE = {
    "bench_deadline.py": ["--smoke", "--data_dir", "{data}", "--work_dir", "{data}/../bench_deadline_smoke"],
    "bench_export.py": ["--size", "tiny", "--repeats", "1"],
    "bench_finetune.py": ["--smoke"],
    "bench_gpu.py": None,  # its --smoke setting runs in tests/test_bench_gpu.py (the same main(), in-process)
    "bench_measure.py": ["--data_dir", "{data}"],
    "bench_naturalness.py": ["--smoke"],
    "bench_prepare.py": ["--workers", "1", "--max_samples", "6"],
    "bench_step.py": ["--smoke", "--data_dir", "{data}"],
    "bench_speakers.py": ["--smoke"],
    "bench_scale.py": ["--clips", "24", "--target_hours", "0.05", "--max_epochs", "1"],
    "bench_synthesis.py": ["--size", "tiny", "--max_samples", "24", "--stock_timeout_s", "6", "--blow_up", "5"],
    "bench_timing.py": ["--smoke"],
    "bench_train.py": ["--target_hours", "0.05", "--max_samples", "24", "--max_epochs", "1"],
}


def test_every_bench_script_has_a_smoke_setting():
    scripts = {path.name for path in (REPO / "bench").glob("bench_*.py")}
    assert scripts == set(SMOKE), f"give each bench script a smallest setting here: {sorted(scripts ^ set(SMOKE))}"


@pytest.mark.timeout(300)  # the real script in subprocesses
@pytest.mark.parametrize("script", sorted(name for name, args in SMOKE.items() if args is not None))
def test_bench_script_runs(script, prepared_demo, tmp_path):
    args = [a.replace("{data}", str(prepared_demo)) for a in SMOKE[script]]
    extra = ["--work_dir", str(tmp_path / "work")] if script == "bench_scale.py" else []
    done = subprocess.run([sys.executable, str(Path("bench") / script), *args, *extra], cwd=REPO, capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "machine:" in done.stdout or "machine:" in done.stderr
