"""Every benchmark script runs, on its smallest setting: none breaks unseen between the times it is measured
with. Each runs as `python bench/<script>` does, as __main__ in a process of its own (forked from
tests/launch.py's server, which has imported torch and transformers already: 5-6 s of CPU saved a script),
and must exit 0 and say which machine it ran on; the figures themselves are the benchmark's business
(bench/RESULTS.md). What the scripts start themselves (recipes, torchrun, timed launches) are processes
of their own, as when a user runs them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import REPO

# script -> its smallest setting; "{data}" is a prepared demo folder (the session's shared one). Runs of
# train_vits.py end by their epochs, inside budgets with room for a machine 3x slower beside busy processes:
# no smoke test depends on how fast the machine is.
SMOKE = {
    "bench_corrections.py": ["--smoke"],
    "bench_deadline.py": ["--smoke", "--data_dir", "{data}", "--work_dir", "{data}/../bench_deadline_smoke"],
    # one core: the other runs a test; short audio (the figures are the benchmark's business, not the smoke's)
    "bench_export.py": ["--size", "tiny", "--repeats", "1", "--threads", "1", "--frames_per_token", "2"],
    "bench_finetune.py": ["--smoke"],
    "bench_gpu.py": None,  # its --smoke setting runs in tests/test_bench_gpu.py (the same main(), in-process)
    # one judge of each kind that can vote: DNSMOS (0.8 s a clip here) and the phone error rate (hama's posteriors
    # again) add half a minute and no path of the script's own
    "bench_judges.py": ["--smoke", "--judges", "speaker", "phonetic", "mcd"],
    "bench_measure.py": ["--data_dir", "{data}"],
    "bench_naturalness.py": ["--smoke"],
    "bench_peers.py": ["--smoke"],
    "bench_piper.py": ["--smoke"],
    "bench_prepare.py": ["--workers", "1", "--max_samples", "6"],
    "bench_step.py": ["--smoke", "--data_dir", "{data}"],
    "bench_speakers.py": ["--smoke"],
    "bench_selection.py": ["--smoke"],
    "bench_scale.py": ["--clips", "24", "--target_hours", "0.05", "--max_epochs", "1"],
    "bench_synthesis.py": ["--size", "tiny", "--max_samples", "24", "--stock_timeout_s", "2", "--blow_up", "5"],
    "bench_timing.py": ["--smoke"],
    "bench_train.py": ["--target_hours", "0.05", "--max_samples", "24", "--max_epochs", "1"],
}
# script -> the helpers with a command line of their own, run after it on its work folder, each writing <helper>.json
AFTER = {
    "bench_corrections.py": [
        ("deciding_measures", ["--mistakes", "x:k", "--seeds", "2", "--pairs", "1"]),
        ("find_learnt", ["--mistakes", "x:k", "--smoke", "--round", "--crowds", "1", "--nothing_planted"]),
    ]
}


def test_every_bench_script_has_a_smoke_setting():
    scripts = {path.name for path in (REPO / "bench").glob("bench_*.py")}
    assert scripts == set(SMOKE), f"give each bench script a smallest setting here: {sorted(scripts ^ set(SMOKE))}"


@pytest.mark.timeout(300)  # the real script in subprocesses
@pytest.mark.parametrize("script", sorted(name for name, args in SMOKE.items() if args is not None))
def test_bench_script_runs(script, prepared_demo, tmp_path):
    args = [a.replace("{data}", str(prepared_demo)) for a in SMOKE[script]]
    # A script that makes its own work folder (a temporary one, left behind: 16 GB of them had gathered in /tmp)
    # works in the test's.
    takes_work_dir = '"--work_dir"' in (REPO / "bench" / script).read_text() and "--work_dir" not in args
    extra = ["--work_dir", str(tmp_path / "work")] if takes_work_dir else []
    from tests import launch

    assert Path.cwd() == REPO  # the scripts' relative paths are the repository root's, as the README runs them
    done = launch.run(f"bench/{Path(script).stem}", [*args, *extra], timeout=240)
    assert done.returncode == 0, f"{script} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "machine:" in done.stdout or "machine:" in done.stderr
    for helper, helper_args in AFTER.get(script, []):
        done = launch.run(f"bench/{helper}", [*helper_args, "--work_dir", str(tmp_path / "work")], timeout=120)
        assert done.returncode == 0, f"{helper} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        assert (tmp_path / "work" / f"{helper}.json").is_file()
