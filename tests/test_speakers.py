"""Many voices in, one voice out: speakers at preparation (metadata, split, quality), speaker conditioning
that changes nothing at step 0, folding one speaker into a plain model, and a conditioned run end to end."""

import json

import numpy as np
import pytest
import soundfile as sf
import torch
from transformers import VitsModel, pipeline

import prepare_data
import train_vits
from finetune.data.held_out import split_by_speaker, split_validation
from finetune.data.metadata import read_rows, write_metadata
from finetune.data.prepare import Kept
from finetune.vits.inference import speak
from finetune.vits.objective import generator_forward
from finetune.vits.speaker_layers import MULTI_SPEAKER_DIR, add_speakers, conditioning_layers, single_speaker
from tests.conftest import TEST_SIZE, clock_for, demo_batch, tiny_generator
from tests.test_train import args

SPEAKERS = {"aaa111": (24, 120.0), "bbb222": (12, 210.0), "ccc333": (6, 160.0)}  # clips, pitch


def voiced(f0: float, seconds: float, rate: int, rng, noise: float = 0.005) -> np.ndarray:
    """Syllables of a harmonic voice at `f0`, 3 a second with pauses between them, over a noise floor."""
    t = np.arange(int(seconds * rate)) / rate
    wave = sum(np.sin(2 * np.pi * f0 * k * t) / k for k in range(1, 6)) * np.clip(np.sin(2 * np.pi * 3 * t), 0, 1)
    return (0.2 * wave + noise * rng.standard_normal(len(t))).astype(np.float32)


def common_voice_folder(root):
    """A Common Voice style release: validated.tsv (client_id, path, sentence, votes) and clips/*.mp3 at 48 kHz."""
    rng = np.random.default_rng(0)
    words = ["ez", "baş", "im", "tu", "av", "zelal", "sibê", "mal", "her", "kes"]
    (root / "clips").mkdir(parents=True)
    lines = ["client_id\tpath\tsentence\tup_votes\tdown_votes\tage"]
    number = 0
    for speaker, (clips, f0) in SPEAKERS.items():
        for _ in range(clips):
            name = f"common_voice_kmr_{number:05d}.mp3"
            sf.write(root / "clips" / name, voiced(f0, 1.0 + 0.1 * (number % 5), 48000, rng), 48000, format="MP3")
            lines.append(f"{speaker}\t{name}\t{' '.join(rng.choice(words, 4))}\t2\t0\t")
            number += 1
    (root / "validated.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def crowd(tmp_path_factory):
    root = tmp_path_factory.mktemp("crowd")
    common_voice_folder(root / "cv")
    assert (
        prepare_data.main(
            [
                "--dataset",
                str(root / "cv" / "validated.tsv"),
                "--data_dir",
                str(root / "data"),
                "--model_name",
                f"scratch:{TEST_SIZE}",
                "--num_workers",
                "1",
            ]
        )
        == 0
    )
    return root / "data"


# ---------------------------------------------------------------- preparation


def test_a_common_voice_folder_prepares_with_its_speakers_and_their_quality(crowd):
    report = json.loads((crowd / "prepare_report.json").read_text(encoding="utf-8"))
    assert report["speaker"] == {"column": "client_id", "speakers": 3}
    assert list(report["speakers"]) == ["aaa111", "bbb222", "ccc333"]  # most hours first
    for name, (clips, _) in SPEAKERS.items():
        entry = report["speakers"][name]
        assert entry["clips"] == clips and entry["hours"] > 0 and entry["snr_db"] > 5 and entry["chars_per_s"] > 0
    assert report["speakers"]["aaa111"]["val_clips"] >= 2 and report["speakers"]["ccc333"]["val_clips"] == 0
    rows = read_rows(crowd / "metadata.csv")
    assert {speaker for _, speaker, _ in rows} == set(SPEAKERS)
    assert sf.info(str(crowd / "wavs" / f"{rows[0][0]}.wav")).samplerate == 16000
    assert "aaa111" in (crowd / "prepare_report.html").read_text(encoding="utf-8")
    assert len((crowd / "quality.csv").read_text().splitlines()) == 1 + sum(c for c, _ in SPEAKERS.values())


def test_metadata_round_trip_with_and_without_speakers(tmp_path):
    rows = [("a1", "spk one", "ez baş im"), ("b1", "spk2", "tu baş î")]
    write_metadata(tmp_path / "many.csv", rows, with_speakers=True)
    assert (tmp_path / "many.csv").read_text(encoding="utf-8").splitlines()[0] == "a1|spk one|ez baş im"
    assert read_rows(tmp_path / "many.csv") == rows
    write_metadata(tmp_path / "one.csv", rows, with_speakers=False)
    assert read_rows(tmp_path / "one.csv") == [("a1", "", "ez baş im"), ("b1", "", "tu baş î")]


def test_each_speaker_has_its_own_held_out_clips():
    kept = {f"a{i}": Kept("t", 1.0, "a") for i in range(200)}
    kept |= {f"b{i}": Kept("t", 1.0, "b") for i in range(30)} | {f"c{i}": Kept("t", 1.0, "c") for i in range(5)}
    held = split_by_speaker(kept, 0.02)
    count = lambda prefix: sum(i.startswith(prefix) for i in held)  # noqa: E731
    assert (count("a"), count("b"), count("c")) == (16, 3, 0)  # a floor of 16, a tenth, none below 10 clips
    one = {f"x{i}": Kept("t", 1.0) for i in range(121)}
    assert split_by_speaker(one, 0.02) == split_validation(sorted(one), 0.02)  # one speaker: as before


def test_a_minority_target_is_drawn_as_often_as_target_share_asks_and_a_majority_once():
    from types import SimpleNamespace

    from finetune.data.speakers import weighted_for_target

    crowd = [SimpleNamespace(item_id=f"t{i}", speaker=0) for i in range(15)]
    crowd += [SimpleNamespace(item_id=f"o{i}", speaker=1 + i % 3) for i in range(85)]
    weighted, note = weighted_for_target(crowd, 0.5)
    assert len(weighted) == 100 + 15 * 5 and sum(e.speaker == 0 for e in weighted) == 15 * 6  # 90 of 175
    assert weighted[:100] == crowd and "drawn 6 times an epoch: 51% of the draws" in note
    same, note = weighted_for_target(crowd[:15] + crowd[15:25], 0.5)  # 15 of 25: more than half already
    assert len(same) == 25 and "drawn once" in note


def test_quality_flags_drop_noisy_clipped_and_silent_clips(tmp_path):
    rng, rate = np.random.default_rng(1), 22050
    clean = [voiced(150, 1.2, rate, rng) for _ in range(3)]
    noisy = voiced(150, 1.2, rate, rng, noise=0.3)
    clipped = np.clip(voiced(150, 1.2, rate, rng) * 8, -1, 1)
    quiet = np.concatenate(
        [
            voiced(150, 0.3, rate, rng),
            np.zeros(int(2.0 * rate), np.float32) + 1e-4 * rng.standard_normal(int(2.0 * rate)).astype(np.float32),
            voiced(150, 0.3, rate, rng),
        ]
    )
    folder = tmp_path / "corpus"
    (folder / "wavs").mkdir(parents=True)
    lines = []
    for name, audio in [
        ("c0", clean[0]),
        ("c1", clean[1]),
        ("c2", clean[2]),
        ("noisy", noisy),
        ("clipped", clipped),
        ("quiet", quiet),
    ]:
        sf.write(folder / "wavs" / f"{name}.wav", audio, rate)
        lines.append(f"{name}|ez baş im û tu")
    (folder / "metadata.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    assert (
        prepare_data.main(
            [
                "--input_dir",
                str(folder),
                "--data_dir",
                str(out),
                "--model_name",
                f"scratch:{TEST_SIZE}",
                "--num_workers",
                "1",
                "--trim_db",
                "80",
                "--min_snr_db",
                "15",
                "--max_clipping",
                "0.01",
                "--max_silence",
                "0.5",
            ]
        )
        == 0
    )
    report = json.loads((out / "prepare_report.json").read_text(encoding="utf-8"))
    dropped = {entry["id"]: entry["reason"] for entry in report["dropped"]}
    assert dropped == {"noisy": "noisy", "clipped": "clipped", "quiet": "mostly_silence"}, report["dropped"]
    assert report["counts"]["kept"] == 3


# ---------------------------------------------------------------- conditioning and folding


@pytest.fixture(scope="module")
def voice(prepared_demo):
    loaded = tiny_generator(prepared_demo)
    return loaded, demo_batch(prepared_demo, loaded.tokenizer)


def test_at_step_0_every_speaker_sounds_exactly_as_the_pretrained_model(voice):
    loaded, batch = voice
    plain = loaded.model.eval()
    conditioned = add_speakers(plain, 3, 32).eval()
    tokens = [np.asarray(t[: int(n)], dtype=np.int32) for t, n in zip(batch.input_ids.numpy(), batch.text_lengths)]
    expected = speak(plain, tokens, torch.device("cpu"), 3, [5.0] * len(tokens)).waveforms
    for speaker in range(3):
        got = speak(conditioned, tokens, torch.device("cpu"), 3, [5.0] * len(tokens), speaker=speaker).waveforms
        assert all(np.array_equal(a, b) for a, b in zip(expected, got))
    # The training forward too, and its gradients reach every conditioning layer (none starts dead).
    from finetune.data.features import FeatureConfig, Features

    features = Features(FeatureConfig())
    batch.speaker_ids = torch.tensor([0, 1, 2, 1])
    torch.manual_seed(5)
    base = generator_forward(plain.train(), batch, features, 16)
    torch.manual_seed(5)
    out = generator_forward(conditioned.train(), batch, features, 16)
    assert torch.equal(base.audio, out.audio) and torch.equal(base.z_p, out.z_p)
    assert torch.equal(base.duration_loss, out.duration_loss)
    (out.audio.square().mean() + out.z_p.square().mean() + out.duration_loss).backward()
    for layer in conditioning_layers(conditioned):
        grads = [p.grad for p in layer.parameters() if p.grad is not None]
        assert grads and any(float(g.abs().sum()) > 0 for g in grads), layer


def test_a_pinned_first_speaker_sounds_as_before_however_the_conditioning_trains(voice):
    """A feedback round's voice is speaker 0 of a model conditioned for the round: pinned, AdamW steps that
    train every conditioning layer and embedding on both speakers leave its speech exactly as it was,
    while speaker 1 moves."""
    from finetune.data.features import FeatureConfig, Features
    from finetune.vits.speaker_layers import pin_target_speaker

    loaded, batch = voice
    conditioned = add_speakers(loaded.model, 2, 32)
    pin_target_speaker(conditioned)
    for name, parameter in conditioned.named_parameters():
        parameter.requires_grad_(".cond" in name or "embed_speaker" in name)
    tokens = [np.asarray(t[: int(n)], dtype=np.int32) for t, n in zip(batch.input_ids.numpy(), batch.text_lengths)]

    def speech(speaker):
        return speak(conditioned.eval(), tokens, torch.device("cpu"), 3, [5.0] * len(tokens), speaker=speaker).waveforms

    before = {speaker: speech(speaker) for speaker in (0, 1)}
    optimizer = torch.optim.AdamW([p for p in conditioned.parameters() if p.requires_grad], lr=1e-2)
    features = Features(FeatureConfig())
    batch.speaker_ids = torch.tensor([0, 1, 0, 1])
    for seed in range(3):
        torch.manual_seed(seed)
        out = generator_forward(conditioned.train(), batch, features, 16)
        optimizer.zero_grad()
        (out.audio.square().mean() + out.z_p.square().mean() + out.duration_loss).backward()
        optimizer.step()
    assert all(np.array_equal(a, b) for a, b in zip(before[0], speech(0)))
    assert any(a.shape != b.shape or np.abs(a - b).max() > 1e-4 for a, b in zip(before[1], speech(1)))


def test_one_speaker_folds_into_a_plain_model_that_speaks_as_it(voice, tmp_path):
    from finetune.vits.voice_on_disk import export_model

    loaded, batch = voice
    conditioned = add_speakers(loaded.model, 3, 32).eval()
    conditioned.config.speaker_names = ["target", "other", "third"]
    with torch.no_grad():  # as if trained: every conditioning layer and embedding moved
        for name, parameter in conditioned.named_parameters():
            if "cond" in name or "embed_speaker" in name:
                parameter.add_(0.05 * torch.randn_like(parameter))
    tokens = [np.asarray(t[: int(n)], dtype=np.int32) for t, n in zip(batch.input_ids.numpy(), batch.text_lengths)]
    for speaker in (0, 2):
        want = speak(conditioned, tokens, torch.device("cpu"), 7, [5.0] * 4, speaker=speaker).waveforms
        got = speak(single_speaker(conditioned, speaker), tokens, torch.device("cpu"), 7, [5.0] * 4).waveforms
        for a, b in zip(want, got):
            assert a.shape == b.shape and np.abs(a - b).max() < 1e-3
    others = speak(conditioned, tokens, torch.device("cpu"), 7, [5.0] * 4, speaker=1).waveforms
    assert any(a.shape != b.shape or np.abs(a - b).max() > 1e-2 for a, b in zip(want, others))  # voices differ
    export_model(conditioned, loaded.tokenizer, tmp_path / "model")
    stock, info = VitsModel.from_pretrained(str(tmp_path / "model"), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and stock.config.num_speakers == 1
    assert stock.config.speaker == "target"
    multi = VitsModel.from_pretrained(str(tmp_path / "model" / MULTI_SPEAKER_DIR))
    assert multi.config.num_speakers == 3
    speakers = json.loads((tmp_path / "model" / MULTI_SPEAKER_DIR / "speakers.json").read_text())
    assert speakers == {"speakers": {"target": 0, "other": 1, "third": 2}, "target": "target"}


# ---------------------------------------------------------------- a conditioned run, as a user runs it


@pytest.fixture(scope="module")
def conditioned_run(crowd, tmp_path_factory):
    """A conditioned run on the crowd for the target bbb222, one epoch, trained once a module's process for the two
    tests that need one (each trained its own): the first reads what it wrote, then resumes it in place; the
    feedback round starts from its final_model. That folder is bbb222's voice alone with every speaker behind it
    under the same ids before the resume and after it (the first test asserts so), so the round starts from that
    voice whichever of the two tests runs first. Its clock (micro_batches_take) moves as timed_work's does for
    micro-batches; in an hour's budget one epoch plans no evaluation but the final one with either clock."""
    from tests.conftest import micro_batches_take

    run = tmp_path_factory.mktemp("conditioned") / "run"
    argv = args(
        crowd, run, "--target_hours", "1", "--max_epochs", "1", "--val_samples", "4", "--target_speaker", "bbb222"
    )
    argv += ["--target_share", "0.5"]  # an epoch of a few steps (at the default 0.9, the target's clips 9 times)
    with pytest.MonkeyPatch.context() as patch:
        fake = micro_batches_take(patch)
        assert train_vits.main(argv, clock=clock_for(fake)) == 0
    return run


def test_a_conditioned_run_exports_the_target_alone_and_resumes(crowd, conditioned_run, tmp_path, timed_work):
    fake, _ = timed_work
    run = conditioned_run
    log = (run / "checkpoints" / "train.log").read_text()
    assert "speakers: 3 in the training data" in log and "exported: bbb222" in log
    evaluations = [
        json.loads(line)
        for line in (run / "checkpoints" / "metrics.jsonl").read_text().splitlines()
        if '"kind": "eval"' in line
    ]
    others = evaluations[-1]["others"]  # the crowd beside the target, in each one's own voice
    held_out = sum(1 for _, who, _ in read_rows(crowd / "metadata_val.csv") if who == "aaa111")
    assert "aaa111" in others and "bbb222" not in others and others["aaa111"]["clips"] == min(3, held_out) > 0
    assert "aaa111: MCD" in log
    config = json.loads((run / "final_model" / "config.json").read_text())
    assert config["num_speakers"] == 1 and config["speaker"] == "bbb222"
    speech = pipeline("text-to-speech", model=str(run / "final_model"))("ez baş im")
    assert speech["audio"].size > 0 and np.isfinite(speech["audio"]).all()
    speakers = json.loads((run / "final_model" / MULTI_SPEAKER_DIR / "speakers.json").read_text())["speakers"]
    assert speakers["bbb222"] == 0 and set(speakers) == set(SPEAKERS)
    # A longer budget on the same run: resumed, the same speakers under the same ids.
    fake.t = 0.0
    assert (
        train_vits.main(
            ["--checkpoint_dir", str(run / "checkpoints"), "--resume", "auto", "--max_epochs", "2"],
            clock=clock_for(fake),
        )
        == 0
    )
    assert json.loads((run / "final_model" / MULTI_SPEAKER_DIR / "speakers.json").read_text())["speakers"] == speakers
    # From that voice (pretrained now) on the same crowd, --speakers left at auto: the target's clips only.
    again = tmp_path / "again"
    argv = args(crowd, again, "--target_hours", "1", "--max_epochs", "1", "--val_samples", "4")
    argv[argv.index("--model_name") + 1] = str(run / "final_model")
    assert train_vits.main([*argv, "--target_speaker", "bbb222"], clock=clock_for(fake)) == 0
    log = (again / "checkpoints" / "train.log").read_text()
    assert "trained the target's clips only (--speakers target_only)" in log
    assert "--speakers auto: a pretrained voice learns the target nearest from the target's own clips" in log
    assert not (again / "final_model" / MULTI_SPEAKER_DIR).exists()


def test_auto_speakers_follow_the_start_and_a_resumed_run():
    from finetune.data.speakers import resolve_mode

    assert resolve_mode("auto", pretrained=True)[0] == "target_only"
    assert resolve_mode("auto", pretrained=False)[0] == "conditioned"
    assert resolve_mode("auto", pretrained=True, resumed_conditioned=True)[0] == "conditioned"
    for mode in ("conditioned", "pooled", "target_only"):  # a mode given is kept, with no reason to log
        assert resolve_mode(mode, pretrained=True) == (mode, "")


def test_an_unknown_target_speaker_names_the_speakers(crowd, tmp_path):
    from finetune.system.errors import ConfigError

    with pytest.raises(ConfigError, match="--target_speaker nobody: not a speaker.*aaa111"):
        train_vits.main(
            [
                "--data_dir",
                str(crowd),
                "--model_name",
                f"scratch:{TEST_SIZE}",
                "--checkpoint_dir",
                str(tmp_path / "c"),
                "--output_dir",
                str(tmp_path / "o"),
                "--target_speaker",
                "nobody",
                "--report_to",
                "none",
            ]
        )


def test_a_feedback_round_keeps_the_corrections_apart_and_judges_the_target(
    crowd, conditioned_run, tmp_path, timed_work
):
    """Corrections recorded by another speaker train under a speaker id of their own; the round replays and
    judges the target's clips only, and its model is the target's voice alone again. The voice is the conditioned
    run's (conditioned_run), as train_vits.py exported it: its config names bbb222, which the round finds."""
    import shutil

    import train_feedback

    fake, _ = timed_work
    run = conditioned_run
    others = [(i, text) for i, who, text in read_rows(crowd / "metadata.csv") if who == "aaa111"][:3]
    feedback = tmp_path / "feedback"
    (feedback / "wavs").mkdir(parents=True)
    for item_id, _ in others:
        shutil.copy(crowd / "wavs" / f"{item_id}.wav", feedback / "wavs" / f"{item_id}.wav")
    (feedback / "metadata.csv").write_text("".join(f"{i}|{t}\n" for i, t in others), encoding="utf-8")
    fake.t = 0.0
    code = train_feedback.main(
        [
            "--feedback_dir",
            str(feedback),
            "--base_model",
            str(run / "final_model"),
            "--data_dir",
            str(crowd),
            "--output_dir",
            str(tmp_path / "voices"),
            "--batch_size",
            "4",
            "--val_samples",
            "2",
            "--benchmark_samples",
            "4",
            "--max_epochs",
            "1",
            "--target_minutes",
            "60",
            "--max_length_ratio",
            "100",
            "--log_every_seconds",
            "60",
            "--judges",
            "none",  # tested on their own (test_judges.py), and in a round by tests/test_journey.py
            "--acoustics",
            "embeddings",  # three unrelated sentences share nothing to focus on (tests/test_feedback.py has focus)
        ],
        clock=clock_for(fake),
    )
    assert code == 0
    round_dir = tmp_path / "voices" / "rounds" / "round_001"
    report = json.loads((round_dir / "feedback_report.json").read_text())
    assert report["voice"] == "bbb222" and report["corrections_voice"] == "own"
    held_out = [r for r in read_rows(crowd / "metadata_val.csv") if r[1] == "bbb222"]
    assert report["counts"] == {"corrections": 3, "held_out": 0, "originals": min(2, len(held_out)), "replay": 6}
    log = (round_dir / "train.log").read_text()
    assert "the corrections train under a speaker id of their own" in log
    last = round_dir / "checkpoints" / "last_model"
    config = json.loads((last / "config.json").read_text())
    assert config["num_speakers"] == 1 and config["speaker"] == "bbb222"  # the voice alone, for the app
    assert json.loads((last / MULTI_SPEAKER_DIR / "speakers.json").read_text())["speakers"] == {
        "bbb222": 0,
        "corrections": 1,
    }
    # A corpus of several speakers with a base model exported for none of them: the flag that fixes it.
    from finetune.feedback.corrections import FeedbackError

    with pytest.raises(FeedbackError, match="--target_speaker nobody is not one of them: name the voice"):
        train_feedback.main(
            [
                "--feedback_dir",
                str(feedback),
                "--base_model",
                str(run / "final_model"),
                "--data_dir",
                str(crowd),
                "--output_dir",
                str(tmp_path / "v2"),
                "--target_speaker",
                "nobody",
            ]
        )
