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
    assert results["parts"] == ["flops", "step", "waits", "fit", "data", "torchrun"]  # compile is left out (CPU)
    assert [(r["precision"], r["micro_batch"]) for r in results["step"]] == [
        ("fp32", 1),
        ("fp32", 2),
        ("bf16", 1),
        ("bf16", 2),
    ]
    assert all(r["step_s"] > 0 for r in results["step"])
    flops = results["flops"][0]  # counted, tiny model: both models' share, and what each card's peak allows
    assert flops["gflops_per_clip"] == round(flops["generator_gflops"] + flops["discriminator_gflops"], 1)
    assert flops["generator_gflops"] > 0 and flops["discriminator_gflops"] > 0
    assert {r["card"] for r in results["flops"]} >= {"RTX 2070", "H100 SXM"}
    assert results["waits"] == [{"where": "all", "waits_per_step": 0.0, "precision": "fp32", "micro_batch": 2}]
    assert results["fit"][0]["largest_micro_batch"] == 2  # no memory cap on a CPU: every size tried fits
    assert [r["workers"] for r in results["data"]] == [0, 2]
    assert results["torchrun"][0]["skipped"] == "needs 2 or more GPUs"
    printed = capsys.readouterr().out
    assert "| precision | micro_batch |" in printed and f"Machine: {results['machine']}" in printed


def test_a_micro_batch_that_does_not_fit_is_reported_as_such_never_timed(monkeypatch):
    """TrainStep catches an out-of-memory error itself (the window is dropped): the bench asks the step's
    result. Here micro-batches of 2 run out of memory where a GPU would, in the decoder's forward."""
    from finetune.training import step as step_module

    real_init = step_module.TrainStep.__init__

    def init(self, model, *rest, **kwargs):
        real_init(self, model, *rest, **kwargs)

        def no_room(module, inputs):
            if module.training and inputs[0].shape[0] >= 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

        model.decoder.register_forward_pre_hook(no_room)

    monkeypatch.setattr(step_module.TrainStep, "__init__", init)
    setup = bench_gpu.setup_for(bench_gpu.parse(["--smoke"]))
    setup.precisions = ["fp32"]
    rows = bench_gpu.part_step(setup)
    assert rows[0]["micro_batch"] == 1 and rows[0]["step_s"] > 0 and "out_of_memory" not in rows[0]
    assert rows[1]["micro_batch"] == 2 and "step_s" not in rows[1] and "peak_allocated_gib" not in rows[1]
    assert "out of memory" in rows[1]["out_of_memory"]


def test_a_part_that_fails_is_recorded_and_the_others_still_run(monkeypatch, tmp_path):
    def broken(setup):
        raise RuntimeError("the driver said no")

    monkeypatch.setitem(bench_gpu.PARTS, "fit", broken)
    out = tmp_path / "gpu.json"
    assert bench_gpu.main(["--smoke", "--parts", "step", "fit", "torchrun", "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert results["fit"] == [{"failed": "RuntimeError: the driver said no"}]
    assert results["step"] and results["torchrun"][0]["skipped"]  # the parts before and after it ran
