"""bench/bench_gpu.py never rots: without CUDA it says so in one line and exits 0, and its --smoke setting
runs every part's code on the CPU with a tiny model (no figure is checked: figures are the bench's job)."""

import json

import pytest
import torch

from bench import bench_gpu


def test_without_cuda_it_says_so_in_one_line_and_exits_0(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "gpu.json"
    assert bench_gpu.main(["--json", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1 and "no CUDA device on this machine" in printed[0] and "--smoke" in printed[0]
    assert not out.exists()


@pytest.mark.timeout(600)  # every part of the bench, tiny
def test_smoke_runs_each_part_on_the_cpu_and_writes_its_tables_and_json(tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert bench_gpu.main(["--smoke", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["parts"] == ["step", "fit", "data", "torchrun"]  # compile is left out of the smoke run
    assert [(r["precision"], r["micro_batch"]) for r in results["step"]] == [("fp32", 1), ("fp32", 2), ("bf16", 1),
                                                                             ("bf16", 2)]
    assert all(r["step_s"] > 0 for r in results["step"])
    assert results["fit"][0]["largest_micro_batch"] == 2  # no memory cap on a CPU: every size tried fits
    assert [r["workers"] for r in results["data"]] == [0, 2]
    assert results["torchrun"][0]["skipped"] == "needs 2 or more GPUs"
    printed = capsys.readouterr().out
    assert "| precision | micro_batch |" in printed and f"Machine: {results['machine']}" in printed
