"""Damage after preparation, and models that do not fit their weights: a prepared WAV overwritten with
noise, one emptied, one deleted (skipped and named, the run goes on; too many and loading stops with
what to do); a model folder or a checkpoint with a wrongly shaped weight (refused in one line)."""

from __future__ import annotations

import shutil

import pytest
import torch

import train_vits
from finetune.data.corpus import load_examples
from finetune.data.metadata import CorpusError, read_metadata
from finetune.system.model_source import ModelSourceError
from finetune.training.checkpoint_file import CheckpointError, list_checkpoints, load_checkpoint
from tests.conftest import clock_for, tiny_generator
from tests.test_train import args, metrics


def damage(data_dir, ids: list[str]) -> dict[str, str]:
    """Noise over the first WAV, the second emptied, the third deleted: what a disk or a user can do."""
    wavs = data_dir / "wavs"
    (wavs / f"{ids[0]}.wav").write_bytes(torch.randint(0, 256, (40_000,), dtype=torch.uint8).numpy().tobytes())
    (wavs / f"{ids[1]}.wav").write_bytes(b"")
    (wavs / f"{ids[2]}.wav").unlink()
    return {ids[0]: "damaged wav", ids[1]: "damaged wav", ids[2]: "missing wav"}


@pytest.fixture
def damaged_copy(prepared_demo, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(prepared_demo, data)
    ids = [item_id for item_id, _ in read_metadata(data / "metadata.csv")]
    return data, ids


def test_damaged_and_missing_wavs_are_left_out_each_named_with_its_reason(damaged_copy):
    data, ids = damaged_copy
    expected = damage(data, ids[:3])
    loaded = tiny_generator(data)
    examples, report = load_examples(data, "metadata.csv", loaded.tokenizer, hop=256, sample_rate=16000)
    assert len(examples) == len(ids) - 3 and report.skipped == {"damaged wav": 2, "missing wav": 1}
    for item_id, reason in expected.items():
        assert any(line.startswith(f"{item_id}: {reason}") for line in report.examples_skipped)
    assert "holds no audio" in " ".join(report.examples_skipped) or "cannot be read" in " ".join(
        report.examples_skipped
    )


def test_more_than_half_damaged_stops_loading_with_what_to_do(damaged_copy):
    data, ids = damaged_copy
    for item_id in ids[: len(ids) // 2 + 1]:
        (data / "wavs" / f"{item_id}.wav").write_bytes(b"RIFF not really")
    loaded = tiny_generator(data)
    with pytest.raises(CorpusError, match="are missing or damaged.*prepare_data.py"):
        load_examples(data, "metadata.csv", loaded.tokenizer, hop=256, sample_rate=16000)


def test_a_run_on_a_damaged_corpus_goes_on_and_says_which_clips_it_left_out(damaged_copy, tmp_path, timed_work):
    fake, _ = timed_work
    data, ids = damaged_copy
    damage(data, ids[:3])
    code = train_vits.main(args(data, tmp_path, "--target_hours", "1", "--max_epochs", "1"), clock=clock_for(fake))
    assert code == 0
    run = tmp_path / "checkpoints"
    log = (run / "train.log").read_text()
    assert "3 clips left out (2 damaged wav, 1 missing wav)" in log and ids[0] in log and ids[2] in log
    record = metrics(tmp_path, "data")[0]
    assert record["skipped"] == {"damaged wav": 2, "missing wav": 1} and len(record["skipped_clips"]) == 3
    report = (run / "report.html").read_text()
    assert "Clips left out at loading" in report and ids[1] in report


# ---------------------------------------------------------------- wrongly shaped weights


def test_a_model_folder_with_a_wrongly_shaped_weight_is_refused_in_one_line(prepared_demo, tmp_path):
    from safetensors.torch import load_file, save_file

    from finetune.vits.generator import load_complete_model
    from finetune.vits.voice_on_disk import export_model

    loaded = tiny_generator(prepared_demo)
    export_model(loaded.model, loaded.tokenizer, tmp_path / "model")
    weights = load_file(str(tmp_path / "model" / "model.safetensors"))
    name = "text_encoder.embed_tokens.weight"
    rows, width = weights[name].shape
    weights[name] = torch.zeros(rows + 3, width)
    save_file(weights, str(tmp_path / "model" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(ModelSourceError) as info:
        load_complete_model(tmp_path / "model", "my-model")
    message = str(info.value)
    assert "\n" not in message and name in message
    assert f"({rows + 3}, {width}) in the folder, ({rows}, {width}) in this model" in message


def test_a_checkpoint_with_a_wrongly_shaped_weight_is_refused_in_one_line(prepared_demo, tmp_path, timed_work):
    from finetune.training.assembly import generator_from_checkpoint

    fake, _ = timed_work
    assert (
        train_vits.main(
            args(prepared_demo, tmp_path, "--target_hours", "1", "--max_samples", "8", "--max_epochs", "1"),
            clock=clock_for(fake),
        )
        == 0
    )
    payload = load_checkpoint(list_checkpoints(tmp_path / "checkpoints")[0])
    name = next(k for k in payload["model"] if k.endswith("embed_tokens.weight"))
    rows, width = payload["model"][name].shape
    payload["model"][name] = torch.zeros(rows, width + 1)
    with pytest.raises(CheckpointError) as info:
        generator_from_checkpoint(payload)
    assert name in str(info.value) and f"({rows}, {width + 1}) saved, ({rows}, {width}) expected" in str(info.value)
