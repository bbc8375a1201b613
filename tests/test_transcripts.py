"""check_transcripts.py: every clip aligned and scored, outliers within a speaker flagged, and on request
left out of the next run's metadata (the rows kept, with their reason, in metadata_excluded.csv)."""

import shutil

import numpy as np
import pytest

import check_transcripts
from finetune.data.metadata import read_rows
from finetune.reporting import transcripts


def test_a_clip_far_above_its_speakers_costs_is_flagged_and_a_small_speaker_is_measured_against_all():
    rng = np.random.default_rng(0)
    costs = [transcripts.ClipCost(f"a{i}", "aaa", float(c)) for i, c in enumerate(1.0 + 0.05 * rng.standard_normal(30))]
    costs.append(transcripts.ClipCost("a_bad", "aaa", 2.0))
    # Another microphone: everyone's costs higher, no outlier among them.
    costs += [
        transcripts.ClipCost(f"b{i}", "bbb", float(c)) for i, c in enumerate(1.6 + 0.05 * rng.standard_normal(12))
    ]
    costs += [transcripts.ClipCost("c0", "ccc", 1.02), transcripts.ClipCost("c_bad", "ccc", 5.0)]  # 2 clips: vs all
    ranked = transcripts.flag_outliers(costs, max_z=4.0)
    assert {c.item_id for c in ranked if c.flagged} == {"a_bad", "c_bad"}
    assert ranked[0].item_id == "c_bad"  # worst first
    assert {c.speaker: c.judged_against for c in ranked} == {
        "aaa": transcripts.OWN,
        "bbb": transcripts.OWN,
        "ccc": transcripts.EVERYONE,
    }
    assert "1 speaker(s) with fewer than 10 clips against all 45 clips" in transcripts.how_judged(ranked)


def test_many_small_speakers_are_measured_against_each_other_not_against_the_big_readers():
    """Common Voice: one volunteer reads most clips on a quiet microphone (costs near 1.0); thirty others
    read 3 clips each on their own microphones (costs near 1.6). Against everyone, the big reader's costs
    would make most small speakers' clips outliers; against the small speakers' clips, only the mismatch is."""
    rng = np.random.default_rng(1)
    costs = [
        transcripts.ClipCost(f"big{i}", "big", float(c)) for i, c in enumerate(1.0 + 0.05 * rng.standard_normal(200))
    ]
    for s in range(30):
        costs += [
            transcripts.ClipCost(f"s{s}_{i}", f"small{s}", float(1.6 + 0.1 * rng.standard_normal())) for i in range(3)
        ]
    costs.append(transcripts.ClipCost("s0_bad", "small0", 3.0))
    ranked = transcripts.flag_outliers(costs, max_z=4.0)
    assert {c.item_id for c in ranked if c.flagged} == {"s0_bad"}
    assert all(c.judged_against == transcripts.SMALL for c in ranked if c.speaker != "big")
    assert "30 speaker(s) with fewer than 10 clips against the 91 clips of all such speakers" in transcripts.how_judged(
        ranked
    )
    everyone = transcripts.robust_z(np.array([1.6]), np.array([c.cost for c in costs]))
    assert everyone[0] > 4.0  # what the old rule did to a typical small speaker's clip


@pytest.fixture()
def small_corpus(prepared_demo, tmp_path):
    """Twelve prepared demo clips and their held-out ones, and a tiny model folder with their vocabulary."""
    from finetune.vits.voice_on_disk import export_model
    from tests.conftest import tiny_generator

    data = tmp_path / "data"
    data.mkdir()
    (data / "wavs").symlink_to(prepared_demo / "wavs")
    rows = (prepared_demo / "metadata.csv").read_text(encoding="utf-8").splitlines()[:12]
    (data / "metadata.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    shutil.copy(prepared_demo / "metadata_val.csv", data / "metadata_val.csv")
    loaded = tiny_generator(prepared_demo)
    export_model(loaded.model, loaded.tokenizer, tmp_path / "model")
    return data, tmp_path / "model"


def test_every_clip_is_scored_the_same_twice_and_nothing_moves_without_exclude(small_corpus, capsys):
    data, model = small_corpus
    before = (data / "metadata.csv").read_text()
    argv = ["--model", str(model), "--data_dir", str(data), "--device", "cpu"]
    assert check_transcripts.main(argv) == 0
    first = transcripts.read_report(data)
    assert check_transcripts.main(argv) == 0
    assert transcripts.read_report(data) == first  # seeded
    clips = len(read_rows(data / "metadata.csv")) + len(read_rows(data / "metadata_val.csv"))
    assert len(first) == clips and all(np.isfinite(float(r["alignment_cost"])) for r in first)
    assert (data / "metadata.csv").read_text() == before and not (data / transcripts.EXCLUDED_NAME).exists()
    assert f"{clips} clips aligned by {model}" in capsys.readouterr().out


def test_exclude_moves_a_flagged_clip_out_of_the_metadata_with_its_reason(small_corpus, monkeypatch, capsys):
    """Forced: one clip's alignment cost is made an outlier (what a trained model does with a wrong transcript
    is measured in bench/bench_speakers.py); what is tested is what --exclude does with it."""
    data, model = small_corpus
    bad = read_rows(data / "metadata.csv")[3][0]
    real = transcripts.alignment_cost

    def cost(model, example, features, device, seed):
        return 1e7 if example.item_id == bad else real(model, example, features, device, seed)

    monkeypatch.setattr(transcripts, "alignment_cost", cost)
    rows = (data / "metadata.csv").read_text().splitlines()
    assert (
        check_transcripts.main(
            ["--model", str(model), "--data_dir", str(data), "--device", "cpu", "--exclude", "--max_z", "50"]
        )
        == 0
    )
    assert f"  {bad}: cost 10000000.000" in capsys.readouterr().out
    assert [r[0] for r in read_rows(data / "metadata.csv")] == [
        line.split("|")[0] for line in rows if not line.startswith(bad + "|")
    ]
    excluded = (data / transcripts.EXCLUDED_NAME).read_text().splitlines()
    assert excluded == [
        next(line for line in rows if line.startswith(bad + "|")) + "|transcript mismatch (alignment cost z 50+)"
    ]


def test_a_folder_that_is_no_model_names_the_flag(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        check_transcripts.main(["--model", str(tmp_path), "--data_dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "--model" in err and "--data_dir" in err
