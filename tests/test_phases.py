"""The phases around training steps, each bounded and each recoverable: evaluations and test sentences
inside the time left (a resumed process whose final evaluation is far slower than the last one still
ends inside its budget), the micro-batch deadline, the timing rule inside the loop, the discriminator
warm-up (how it ends, its checkpoints, its rollbacks, the last good state after it), a stop request while
the model is built or test sentences are synthesised, and weights that are not finite never written.

Time is a fake clock (tests/conftest.py timed_work) that moves only when work "takes" time; nothing sleeps.
"""

import json

import numpy as np
import pytest
import torch

import train_vits
from finetune.data import corpus
from finetune.reporting import evaluation
from finetune.reporting.evaluation import ClipScore
from finetune.training import assembly, finishing, recovery, step
from finetune.training.checkpoint_file import list_checkpoints, load_checkpoint
from tests.conftest import clock_for
from tests.test_reliability import final_model_is_finite, nan_losses_from, resume, sigterm_on_call
from tests.test_train import args, metrics


def slow_clips(monkeypatch, fake, seconds_per_clip: dict):
    """Each group of held-out clips takes seconds_per_clip["s"] of fake time (changeable mid-run)."""
    real = evaluation.Evaluator.score_group

    def timed(self, model, group, *a, **k):
        fake.t += seconds_per_clip["s"] * len(group)
        return real(self, model, group, *a, **k)

    monkeypatch.setattr(evaluation.Evaluator, "score_group", timed)


def log_of(run_dir) -> str:
    return (run_dir / "checkpoints" / "train.log").read_text()


# ---------------------------------------------------------------- the time limit, alone


def test_a_piece_runs_only_when_the_slowest_so_far_still_ends_in_time():
    from finetune.system.time_limit import PieceCosts, TimeLimit

    now = {"t": 0.0}
    limit = TimeLimit(lambda: now["t"], ends_at=10.0)
    unknown = PieceCosts()
    assert unknown.next_fits(limit)  # nothing measured: the first piece runs while time is left
    costs = PieceCosts(prior_s=4.0)
    assert costs.next_fits(limit)
    costs.add(3.0)
    costs.add(6.0)
    now["t"] = 4.5
    assert not costs.next_fits(limit)  # 6 s (the slowest) would end at 10.5
    now["t"] = 4.0
    assert costs.next_fits(limit)
    now["t"] = 10.0
    assert not unknown.next_fits(limit)


def test_an_evaluation_is_cut_short_between_clips_and_scored_on_the_clips_done(prepared_demo, tmp_path, monkeypatch):
    from finetune.data.corpus import load_examples
    from finetune.data.features import FeatureConfig, Features
    from finetune.system.time_limit import TimeLimit
    from tests.conftest import FakeClock, tiny_generator

    loaded = tiny_generator(prepared_demo, size="tiny")
    examples, _ = load_examples(
        prepared_demo, "metadata.csv", loaded.tokenizer, hop=256, sample_rate=16000, max_samples=5
    )
    fake = FakeClock()
    slow_clips(monkeypatch, fake, {"s": 2.0})
    sentences = [(f"sentence_{i:02d}", examples[i].token_ids) for i in range(3)]
    evaluator = evaluation.Evaluator(
        examples, Features(FeatureConfig()), torch.device("cpu"), 16000, tmp_path, sentences, batch_size=1
    )
    whole = evaluator.evaluate(loaded.model, 0, limit=TimeLimit(fake.now, ends_at=1000.0))
    assert whole.clips_scored == 5 and not whole.cut_short and whole.eligible == (whole.ineligible_reason == "")
    assert evaluator.group_s == 2.0  # the slowest group: the next evaluation's first estimate

    fake.t = 0.0
    cut = evaluator.evaluate(loaded.model, 1, limit=TimeLimit(fake.now, ends_at=7.0))  # 3 clips of 2 s fit, not 4
    assert cut.clips_scored == 3 and cut.clips_planned == 5 and cut.cut_short == "the deadline"
    # judged by the timing rule on the clips it scored (selection.py compares it clip by clip only)
    assert cut.eligible == evaluator.rule.accepts(cut.length_ratio) and "cut short" not in cut.ineligible_reason
    assert cut.mcd_db == pytest.approx(np.mean([whole.per_clip[e.item_id].mcd_db for e in examples[:3]]))
    assert "cut short by the deadline: 3 of 5 clips" in evaluator.describe(cut)
    assert cut.summary()["clips_scored"] == 3 and cut.summary()["cut_short"] == "the deadline"

    fake.t = 0.0
    skipped = evaluator.evaluate(loaded.model, 2, limit=TimeLimit(fake.now, ends_at=1.0))  # not even one clip
    assert skipped.skipped and skipped.samples == [] and skipped.cut_short == "the deadline"


def test_paying_once_makes_each_recordings_references_across_speakers_and_stops_between_clips(prepared_demo, tmp_path):
    from finetune.data.corpus import load_examples
    from finetune.data.features import FeatureConfig, Features
    from finetune.system.interrupt import StopRequest, StopRequested
    from tests.conftest import tiny_generator

    loaded = tiny_generator(prepared_demo)
    examples, _ = load_examples(
        prepared_demo, "metadata.csv", loaded.tokenizer, hop=256, sample_rate=16000, max_samples=3
    )

    def evaluator():
        features = Features(FeatureConfig())
        return evaluation.Evaluator(examples, features, torch.device("cpu"), 16000, across_speakers=True)

    paid = evaluator()
    paid.pay_one_time_costs()
    assert sorted(paid.references) == sorted(e.item_id for e in examples)  # the evaluations find them made
    stop, stopped = StopRequest(), evaluator()
    stop.request("SIGTERM")
    with pytest.raises(StopRequested):
        stopped.pay_one_time_costs(stop)
    assert stopped.references == {}


def test_the_final_evaluation_keeps_the_final_save_free_and_one_inside_the_run_the_final_evaluation_too():
    from finetune.training.budget import Budget, StepTimer
    from finetune.training.pacing import Costs, Pacer
    from tests.conftest import FakeClock, clock_for

    fake = FakeClock()
    fake.t = 50.0
    budget = Budget(100.0, clock_for(fake), used_before_s=10.0, safety_s=1.0)  # 40 s left
    costs = Costs(eval_s=8.0, export_s=2.0, checkpoint_s=3.0, report_s=0.5)
    pacer = Pacer(budget, StepTimer(1), costs, checkpoint_every_s=1800.0)
    # Final: one export (the best model, or the last weights: the other a copy), two copies (best_model into the
    # output folder and as last_model: at most an export, and at most a checkpoint), the checkpoint and the
    # closing report (2 + 4 + 3 + 0.5); it redraws no report of its own (counting one skipped it when the report
    # took longer than the evaluation: a 180 s fine-tune ended 2% early without its final evaluation).
    assert pacer.evaluation_limit(final=True).left_s() == pytest.approx(40 - 1 - 9.5)
    # Inside the run: its report and the best model's export, then the whole final save (with its evaluation).
    assert pacer.evaluation_limit(final=False).left_s() == pytest.approx(40 - 1 - (0.5 + 2 + 8.0 + 9.5))
    costs.checkpoint_s = 0.5  # a checkpoint cheaper than an export bounds the copy
    assert costs.after_final_eval_s == pytest.approx(2 + 1.0 + 0.5 + 0.5)
    costs.checkpoints = False  # none written (feedback rounds): the copy counts as an export
    assert costs.after_final_eval_s == pytest.approx(2 + 4 + 0.5)


# ---------------------------------------------------------------- evaluations inside the time left


def test_a_resumed_process_measures_its_evaluations_before_the_final_one_and_ends_inside_the_budget(
    prepared_demo, tmp_path, timed_work, monkeypatch
):
    """The first process measures cheap evaluations (0.5 s a clip); in the resumed one a clip takes 8 s
    (a cold process, a busy machine) and its first evaluation is the final one. It primes the
    evaluation first (two clips), plans with what it measured, and ends inside its budget."""
    fake, costs = timed_work
    costs["clips"] = 4  # a micro-batch cut at the deadline costs its clips' share, as a real one does
    per_clip = {"s": 0.5}
    slow_clips(monkeypatch, fake, per_clip)
    target_s = 100.0
    common = args(
        prepared_demo,
        tmp_path,
        "--target_hours",
        str(target_s / 3600),
        "--max_samples",
        "12",
        "--val_samples",
        "4",
        "--val_every",
        "100",
    )

    def stop_at_4(loop):
        if loop.state.step == 4:
            loop.context.stop.request("SIGINT")

    assert train_vits.main(common, clock=clock_for(fake), step_callback=stop_at_4) == 130
    per_clip["s"] = 8.0
    fake.t = 0.0
    assert train_vits.main(common + ["--resume", "auto"], clock=clock_for(fake)) == 0
    end = metrics(tmp_path, "end")[-1]  # the resumed process's
    assert end["stop_reason"] == "deadline" and target_s - 10 < end["time_used_s"] <= target_s, end
    # Two clips of 8 s; the last evaluation's 3 s (1 s + 4 clips of 0.5 s) re-priced: 1 s + 4 clips of 8 s.
    assert "evaluation primed in 16.0s: a whole one is expected to take 33.0s" in log_of(tmp_path)
    final = metrics(tmp_path, "eval")[-1]
    assert final["step"] == end["steps"] and final["clips_scored"] == 4


def test_a_fresh_run_pays_the_evaluations_one_time_cost_before_its_baseline_is_timed(
    prepared_demo, tmp_path, timed_work, monkeypatch
):
    """A process's first DTW costs 25 s (numba compiling it in a fresh environment); an evaluation 10 s.
    A short run, whose final evaluation is its only one after the baseline, pays the 25 s before the
    baseline is timed: it keeps 10 s, not 35, for the final evaluation, and ends in its budget's last
    seconds rather than 25 s early. 100 s is enough to tell: planned at 47 s, with 53 s left and 15 of them kept
    for the final save, the run plans 13 steps and no evaluation before the final one (150 s planned 26 for the
    same); had the 25 s been counted in the evaluation, 40 s would be kept and the run would end near 75 s."""
    fake, costs = timed_work
    costs["eval_s"], costs["clips"] = 10.0, 4
    real, compiled = evaluation.mcd_dtw, {"yet": False}

    def mcd_dtw(*a, **k):
        if not compiled["yet"]:
            compiled["yet"] = True
            fake.t += 25.0
        return real(*a, **k)

    monkeypatch.setattr(evaluation, "mcd_dtw", mcd_dtw)
    target_s = 100.0
    run = args(
        prepared_demo, tmp_path, "--target_hours", str(target_s / 3600), "--max_samples", "12", "--val_samples", "4"
    )
    assert train_vits.main(run, clock=clock_for(fake)) == 0
    end = metrics(tmp_path, "end")[-1]
    assert end["stop_reason"] == "deadline" and target_s - 5 < end["time_used_s"] <= target_s, end
    assert [e["step"] for e in metrics(tmp_path, "eval")] == [0, end["steps"]]
    log = log_of(tmp_path)
    assert "evaluation's one-time costs paid in 25.0s" in log and "no evaluation before the final one" in log


def test_a_final_evaluation_slower_than_planned_is_cut_short_inside_the_budget(
    prepared_demo, tmp_path, timed_work, monkeypatch
):
    """The final evaluation's clips take 2 s each against 0.5 s in every evaluation before it (8 s where
    2 were planned): it is scored on the clips that fit, says so, is not kept as best on fewer than 3 clips,
    and the run ends inside its budget (a phase can overrun its limit by one clip's misestimate, which the
    safety margin absorbs)."""

    fake, _ = timed_work
    per_clip = {"s": 0.5}
    slow_clips(monkeypatch, fake, per_clip)
    real_finish = finishing.finish

    def slow_final(loop, reason):
        per_clip["s"] = 2.0
        return real_finish(loop, reason)

    monkeypatch.setattr(finishing, "finish", slow_final)
    target_s = 60.0
    assert (
        train_vits.main(
            args(
                prepared_demo,
                tmp_path,
                "--target_hours",
                str(target_s / 3600),
                "--max_samples",
                "12",
                "--val_samples",
                "4",
                "--val_every",
                "100",
            ),
            clock=clock_for(fake),
        )
        == 0
    )
    end = metrics(tmp_path, "end")[0]
    assert end["stop_reason"] == "deadline" and end["time_used_s"] <= target_s, end
    final = metrics(tmp_path, "eval")[-1]
    assert final["step"] == end["steps"] and final["cut_short"] == "the deadline"
    assert 0 < final["clips_scored"] < final["clips_planned"] == 4
    assert final["clips_scored"] >= 3 or not final["best"], final  # fewer than 3 clips cannot be compared
    assert f"cut short by the deadline: {final['clips_scored']} of 4 clips" in log_of(tmp_path)
    assert end["last_evaluation"]["cut_short"] == "the deadline"


@pytest.mark.parametrize("slower", [2.0, 3.0])
def test_a_finish_whose_parts_take_twice_their_planned_time_ends_inside_the_budget(
    prepared_demo, tmp_path, timed_work, monkeypatch, slower
):
    """The machine gets `slower` times as slow as the run's last step ends (nothing in training saw it coming): the
    final evaluation's clips, the exports, the tempo fit and the checkpoint each take that much more than they cost
    before, and the final evaluation's model is the best (10 dB nearer on each clip), so the finish exports
    best_model too. The finish asks the time left again before each part, at the slowdown its own parts showed, and
    leaves out what no longer fits (last_model's tempo fit, last_model, the checkpoint, in that order; three times
    as slow, some part always): the run ends inside its budget, final_model and best_model written, and the log and
    metrics.jsonl say what was left out. Before, the finish ran every part whatever the time left (best_model, the
    checkpoint, last_model: 12 s where 8 were kept) and ended past the budget."""
    from dataclasses import replace

    from finetune.reporting.evaluation import Evaluator

    fake, costs = timed_work
    costs["clips"] = 4  # a micro-batch cut at the deadline costs its clips' share, as the pacer expects
    slow, final = {"clip_s": 0.1, "fit_s": 1.0}, {"on": False}
    real_group, real_fit, real_finish = Evaluator.score_group, Evaluator.fit_tempo, finishing.finish

    def scored(self, model, group, *a, **k):
        fake.t += slow["clip_s"] * len(group)
        scores = real_group(self, model, group, *a, **k)
        return {name: replace(s, mcd_db=s.mcd_db - 10.0) for name, s in scores.items()} if final["on"] else scores

    def timed_fit(self, model):
        fake.t += slow["fit_s"]
        return real_fit(self, model)

    def twice_as_slow(loop, reason):
        final["on"] = True
        slow["clip_s"], slow["fit_s"] = slower * slow["clip_s"], slower * slow["fit_s"]
        for part in ("checkpoint_s", "export_s"):
            costs[part] *= slower
        return real_finish(loop, reason)

    monkeypatch.setattr(Evaluator, "score_group", scored)
    monkeypatch.setattr(Evaluator, "fit_tempo", timed_fit)
    monkeypatch.setattr(finishing, "finish", twice_as_slow)
    target_s = 60.0
    run = args(prepared_demo, tmp_path, "--target_hours", str(target_s / 3600), "--max_samples", "12")
    run += ["--val_samples", "4", "--val_every", "100", "--max_length_ratio", "4", "--inference_settings", "fitted"]
    assert train_vits.main(run, clock=clock_for(fake)) == 0
    end = metrics(tmp_path, "end")[0]
    assert end["stop_reason"] == "deadline" and end["time_used_s"] <= target_s, end
    last = metrics(tmp_path, "eval")[-1]
    assert last["step"] == end["steps"] and last["best"], last  # the finish exported best_model
    left_out = [record["part"] for record in metrics(tmp_path, "left_out")]
    assert set(left_out) <= {"last_model's tempo fit", "last_model", "the last checkpoint"}, left_out
    assert left_out or slower == 2.0, "three times as slow, the finish cannot hold every part"
    log = log_of(tmp_path)
    assert all(f"warning: {part}" in log for part in left_out)
    assert not left_out or "the deadline comes first" in log
    assert final_model_is_finite(tmp_path)
    summary = json.loads((tmp_path / "final_model" / "training_summary.json").read_text())
    assert summary["final_model_holds"] == f"best_model (step {last['step']})"


def test_a_final_evaluation_cut_short_is_kept_when_better_beyond_the_noise_on_the_clips_it_scored(
    prepared_demo, tmp_path, timed_work, monkeypatch
):
    """The final evaluation's clips take 1.6x the time planned, and the model it scores is 10 dB nearer on each
    clip than every model before it (the real scores, shifted): cut short after 3 or 4 of its 5 clips, it is
    compared with the kept model on those clips and kept, and final_model is its model, not the start. Before,
    a cut-short evaluation never took part, and a 450 s run's final_model was its start (bench/RESULTS.md)."""
    from dataclasses import replace

    fake, costs = timed_work
    costs["clips"] = 4  # a micro-batch cut to fewer clips takes its share of the time, as the pacer expects
    final = {"on": False}
    real_group, real_finish = evaluation.Evaluator.score_group, finishing.finish

    def scored(self, model, group, *a, **k):
        fake.t += 0.8 if final["on"] else 0.5
        scores = real_group(self, model, group, *a, **k)
        return {name: replace(s, mcd_db=s.mcd_db - 10.0) for name, s in scores.items()} if final["on"] else scores

    def slow_final(loop, reason):
        final["on"] = True
        return real_finish(loop, reason)

    monkeypatch.setattr(evaluation.Evaluator, "score_group", scored)
    monkeypatch.setattr(finishing, "finish", slow_final)
    target_s = 60.0
    run = args(prepared_demo, tmp_path, "--target_hours", str(target_s / 3600), "--max_samples", "12")
    # the timing rule wide enough for a barely trained tiny voice: the choice is then the MCD's, clip by clip
    run += ["--val_samples", "5", "--val_every", "100", "--max_length_ratio", "4", "--learning_rate", "1e-4"]
    assert train_vits.main(run, clock=clock_for(fake)) == 0
    end = metrics(tmp_path, "end")[0]
    assert end["stop_reason"] == "deadline" and end["time_used_s"] <= target_s, end
    last = metrics(tmp_path, "eval")[-1]
    assert last["step"] == end["steps"] > 0 and last["cut_short"] == "the deadline"
    assert 3 <= last["clips_scored"] < last["clips_planned"] == 5, last
    assert last["eligible"] and last["best"], last
    kept = json.loads((tmp_path / "checkpoints" / "best_model" / "eval.json").read_text())
    assert kept["step"] == last["step"] and kept["chosen_because"].startswith("better beyond the noise")
    assert f"on {last['clips_scored']} clips" in kept["chosen_because"]
    summary = json.loads((tmp_path / "final_model" / "training_summary.json").read_text())
    assert summary["best_step"] == last["step"] and summary["final_model_holds"] == f"best_model (step {last['step']})"
    # the end line, the model card and the report say which clips its MCD is over
    partial = f"{last['clips_scored']} of its 5 held-out clips (its evaluation was cut short by the deadline)"
    assert f"at step {last['step']} on {partial}" in log_of(tmp_path)
    assert partial in (tmp_path / "final_model" / "README.md").read_text()
    assert partial in (tmp_path / "checkpoints" / "report.html").read_text()


def test_a_final_evaluation_with_no_time_for_one_clip_is_skipped_and_said(
    prepared_demo, tmp_path, timed_work, monkeypatch
):
    """The machine stalls after step 7 until only the final save's time (and 0.2 s) is left: the final
    evaluation, whose clips took 0.5 s, has no time for one; it is skipped with a warning and an
    `eval_skipped` record, and the final model is still written inside the budget."""
    fake, _ = timed_work
    slow_clips(monkeypatch, fake, {"s": 0.5})

    def stall_after_7(loop):
        if loop.state.step == 7:
            fake.t += loop.context.budget.left_s() - (
                loop.pacer.costs.after_final_eval_s + loop.context.budget.safety_s + 0.2
            )

    target_s = 200.0
    code = train_vits.main(
        args(
            prepared_demo, tmp_path, "--target_hours", str(target_s / 3600), "--max_samples", "12", "--val_every", "4"
        ),
        clock=clock_for(fake),
        step_callback=stall_after_7,
    )
    assert code == 0
    end = metrics(tmp_path, "end")[0]
    assert end["steps"] == 7 and end["time_used_s"] <= target_s and end["final_evaluation_skipped"]
    skipped = metrics(tmp_path, "eval_skipped")
    assert len(skipped) == 1 and skipped[0]["final"] and skipped[0]["step"] == 7
    assert "warning: final evaluation skipped" in log_of(tmp_path)
    assert final_model_is_finite(tmp_path)


def test_test_sentences_stop_at_the_time_limit(prepared_demo, tmp_path, timed_work, monkeypatch):
    """Test sentences take 1 s each, then 2.5 s in the final evaluation (10 s where 4 were planned): it
    writes those that fit, is marked cut short, and the run ends inside its budget."""

    fake, _ = timed_work
    real_speak, real_finish, real_write = evaluation.speak, finishing.finish, evaluation.Evaluator.write_samples
    per_sentence = {"s": 1.0, "writing": False}

    def timed_speak(*a, **k):
        fake.t += per_sentence["s"] if per_sentence["writing"] else 0.0  # test sentences only, not clips
        return real_speak(*a, **k)

    def write_samples(*a, **k):
        per_sentence["writing"] = True
        try:
            return real_write(*a, **k)
        finally:
            per_sentence["writing"] = False

    def slow_final(loop, reason):
        per_sentence["s"] = 2.5
        return real_finish(loop, reason)

    sentences = tmp_path / "sentences.txt"
    sentences.write_text(
        "ez baş im û tu\nav zelal e û sar\nsibê em diçin mal\nher kes dikare bixwîne\n", encoding="utf-8"
    )
    monkeypatch.setattr(evaluation, "speak", timed_speak)
    monkeypatch.setattr(evaluation.Evaluator, "write_samples", write_samples)
    monkeypatch.setattr(finishing, "finish", slow_final)
    target_s = 60.0
    code = train_vits.main(
        args(
            prepared_demo,
            tmp_path,
            "--target_hours",
            str(target_s / 3600),
            "--max_samples",
            "12",
            "--test_sentences",
            str(sentences),
            "--val_every",
            "100",
        ),
        clock=clock_for(fake),
    )
    assert code == 0
    end = metrics(tmp_path, "end")[0]
    assert end["time_used_s"] <= target_s, end
    records = metrics(tmp_path, "eval")
    assert records[0]["sentences_written"] == records[0]["sentences_planned"] == 4
    final = records[-1]
    assert final["step"] == end["steps"] and final["cut_short"] == "the deadline"
    assert final["clips_scored"] == final["clips_planned"] and 0 < final["sentences_written"] < 4
    written = sorted((tmp_path / "checkpoints" / "samples" / f"step_{end['steps']:06d}").glob("*.wav"))
    assert len(written) == final["sentences_written"]


# ---------------------------------------------------------------- the training loop's own rules


def deadline_run(prepared_demo, run_dir, fake, target_s: float, *flags: str) -> dict:
    """A run of `target_s` seconds of fake time from 0, with `flags`: its end record, after checking that
    it stopped at its deadline, inside its budget."""
    fake.t = 0.0
    code = train_vits.main(
        args(prepared_demo, run_dir, "--target_hours", str(target_s / 3600), "--benchmark_samples", "8", *flags),
        clock=clock_for(fake),
    )
    assert code == 0
    end = metrics(run_dir, "end")[0]
    assert end["stop_reason"] == "deadline" and end["time_used_s"] <= target_s, (target_s, end)
    return end


def test_the_micro_batch_deadline_cuts_the_last_window_short(prepared_demo, tmp_path, timed_work):
    """Windows of 4 micro-batches (12 s each): at a budget whose last window would overrun, that window is cut
    after 1-3 micro-batches rather than leaving its time unused or overrunning; the run ends inside its
    budget, on a step at the learning-rate floor."""
    fake, _ = timed_work
    end = deadline_run(
        prepared_demo,
        tmp_path,
        fake,
        70.0,  # a remainder a whole window does not fit in (the fake clock makes it so on any machine; 64 s: none)
        "--max_samples",
        "12",
        "--gradient_accumulation_steps",
        "4",
        "--batch_size",
        "2",
    )
    assert end["last_lr"] == pytest.approx(2e-3 * 0.1)
    last = metrics(tmp_path, "train")[-1]
    assert last["step"] == end["steps"]
    assert last["micro_batches"] < 4, "the last window was not cut short"
    assert f"| {last['micro_batches']} of 4 micro-batches" in log_of(tmp_path)


def windows_of_four(prepared_demo, run_dir, fake, accumulate) -> None:
    """A 60 s run (deadline_run) of windows of 4 micro-batches of 2 clips, each micro-batch's forward and backward
    through `accumulate` in place of TrainStep.accumulate."""
    real_accumulate = step.TrainStep.accumulate
    step.TrainStep.accumulate = accumulate
    try:
        flags = ["--max_samples", "12", "--gradient_accumulation_steps", "4", "--batch_size", "2"]
        deadline_run(prepared_demo, run_dir, fake, 60.0, *flags)
    finally:
        step.TrainStep.accumulate = real_accumulate


def test_a_window_whose_micro_batches_get_three_times_slower_ends_early_inside_the_budget(
    prepared_demo, tmp_path, timed_work
):
    """Windows of 4 micro-batches of 3 s; from the 13th micro-batch on each takes 9 s (the machine got busy in the
    middle of a window, after it was decided). The window asks the deadline again before each micro-batch, at the
    speed the last one ran: it ends early, what ran is applied, and the run ends inside its budget. Before, the
    window ran its planned micro-batches whatever they took (a coarse run busy from half-way: 96 s past 180 s)."""
    fake, costs = timed_work
    drawn, real_accumulate = {"n": 0}, step.TrainStep.accumulate

    def slower_after_12(self, batch, *args, **kwargs):
        drawn["n"] += 1
        costs["micro_batch_s"] = 9.0 if drawn["n"] > 12 else 3.0
        return real_accumulate(self, batch, *args, **kwargs)

    windows_of_four(prepared_demo, tmp_path, fake, slower_after_12)
    log = log_of(tmp_path)
    assert "its window ended after" in log and "one more no longer fits before the final save" in log


def test_a_micro_batch_that_slows_ten_times_while_it_runs_is_given_up_and_the_run_ends_inside_the_budget(
    prepared_demo, tmp_path, timed_work
):
    """Windows of 4 micro-batches of 3 s; those that start in the last 20 s of a 60 s budget slow down while
    they run, a fraction of a second of fake time at each module they call, up to 30 s (two processes took the
    cores under it: on 2 cores a 12 s micro-batch took 40.7 s, and a 72 s run ended 8% over). The deadline
    asked before the micro-batch could not see it; the watch inside it gives it up at the time the final save
    needs, what the window ran before it is applied, and the run ends inside its budget."""
    fake, costs = timed_work
    real_accumulate = step.TrainStep.accumulate

    def slows_while_it_runs(self, batch, *args, **kwargs):
        if fake.t < 40.0:
            return real_accumulate(self, batch, *args, **kwargs)
        costs["micro_batch_s"], added = 0.0, {"s": 0.0}

        def busy(*_):
            step_s = min(0.25, 30.0 - added["s"])
            fake.t, added["s"] = fake.t + step_s, added["s"] + step_s

        handle = torch.nn.modules.module.register_module_forward_pre_hook(busy)
        try:
            return real_accumulate(self, batch, *args, **kwargs)
        finally:
            handle.remove()
            costs["micro_batch_s"] = 3.0

    windows_of_four(prepared_demo, tmp_path, fake, slows_while_it_runs)
    assert "given up after" in log_of(tmp_path)


def test_a_coarse_last_step_is_cut_to_the_clips_that_fit(prepared_demo, tmp_path, timed_work):
    """Steps of one micro-batch of 8 clips, 16 s each (a clip 2 s): the last one is cut to the clips that
    still fit rather than leaving up to 16 s unused; the run ends inside its budget."""
    fake, costs = timed_work
    costs.update(micro_batch_s=16.0, clips=8)
    end = deadline_run(
        prepared_demo,
        tmp_path,
        fake,
        75.0,  # a remainder of a 16 s step that some of its clips fit in (the fake clock makes it so)
        "--max_samples",
        "16",
        "--gradient_accumulation_steps",
        "1",
        "--batch_size",
        "8",
    )
    line = next((l for l in log_of(tmp_path).splitlines() if "its last micro-batch cut to" in l), "")
    assert line, "the last micro-batch was not cut"
    assert f"step {end['steps']}: its last micro-batch cut to" in line and "of 8 clips" in line
    kept = int(line.split("cut to ")[1].split(" of")[0])
    assert end["samples_seen"] == 8 * (end["steps"] - 1) + kept  # what it used, not a whole micro-batch


def test_a_better_score_outside_the_timing_rule_is_never_written_as_best(
    prepared_demo, tmp_path, timed_work, monkeypatch
):
    scripted = iter([(7.0, 1.0), (2.0, 1.6), (6.0, 1.1), (1.0, 0.5), (5.0, 0.9), (9.0, 1.0), (9.0, 1.0), (9.0, 1.0)])
    real_score = evaluation.Evaluator.score_clips

    def scores(self, model, stop=None, limit=None):
        per_clip, losses, cut = real_score(self, model, stop, limit)
        mcd, ratio = next(scripted)
        return {name: ClipScore(mcd, ratio, 0.0, False) for name in per_clip}, losses, cut

    monkeypatch.setattr(evaluation.Evaluator, "score_clips", scores)
    fake, _ = timed_work
    assert (
        train_vits.main(
            args(
                prepared_demo,
                tmp_path,
                "--target_hours",
                "1",
                "--max_epochs",
                "4",
                "--val_every",
                "2",
                "--max_samples",
                "12",
            ),
            clock=clock_for(fake),
        )
        == 0
    )
    evals = metrics(tmp_path, "eval")
    assert [r["best"] for r in evals[:5]] == [True, False, True, False, True]
    assert "length ratio 1.60 is outside 0.80-1.25" in evals[1]["ineligible_reason"]
    saved = json.loads((tmp_path / "checkpoints" / "best_model" / "eval.json").read_text())
    assert saved["mcd_db"] == 5.0 and saved["length_ratio"] == 0.9


# ---------------------------------------------------------------- the discriminator warm-up


@pytest.fixture(scope="module")
def pretrained(prepared_demo, tmp_path_factory):
    """A saved tiny generator: a pretrained starting point with no discriminator (so one is warmed up)."""
    from finetune.vits.voice_on_disk import export_model
    from tests.conftest import tiny_generator

    loaded = tiny_generator(prepared_demo)
    folder = tmp_path_factory.mktemp("pretrained")
    export_model(loaded.model, loaded.tokenizer, folder)
    return folder


def warm_up_args(prepared_demo, run_dir, pretrained, *extra) -> list[str]:
    base = args(prepared_demo, run_dir, "--max_samples", "12", *extra)
    base[base.index("--model_name") + 1] = str(pretrained)
    return base


def test_the_warm_up_ends_by_margin(prepared_demo, tmp_path, timed_work, pretrained):
    fake, _ = timed_work
    assert (
        train_vits.main(
            warm_up_args(
                prepared_demo,
                tmp_path,
                pretrained,
                "--target_hours",
                "1",
                "--max_epochs",
                "1",
                "--discriminator_warmup_steps",
                "100",
                "--discriminator_warmup_margin",
                "-100",
            ),
            clock=clock_for(fake),
        )
        == 0
    )
    record = metrics(tmp_path, "discriminator_warmup")[0]
    assert record["ended_by"] == "separating real from generated" and record["steps"] == 20  # the margin's window
    # The warm-up's steps are steps: their time counts, and the data they waited for is a share of it (a run whose
    # epochs all went to the warm-up said "data wait 13041964801.23% of step time")
    end = metrics(tmp_path, "end")[0]
    assert end["train_s"] >= 20 * 3.0 and 0 <= end["data_wait_share"] <= 1, end
    # --max_epochs 1 is an epoch of training: the warm-up's 20 steps went through several epochs of these 12 clips,
    # and the generator still trained its one (it stopped with 0 steps, the warm-up's epochs counted against it)
    assert record["epochs"] >= 2 and end["stop_reason"] == "max_epochs" and end["steps"] == 3, (record, end)


def test_the_warm_up_ends_by_its_time_cap(prepared_demo, tmp_path, timed_work, pretrained):
    """At most --discriminator_warmup_share (20%) of the time left when it starts: of about 77 s, 15 s,
    5 steps of 3 s (checkpoints at epoch ends apart)."""
    fake, _ = timed_work
    target_s = 80.0
    assert (
        train_vits.main(
            warm_up_args(
                prepared_demo,
                tmp_path,
                pretrained,
                "--target_hours",
                str(target_s / 3600),
                "--discriminator_warmup_steps",
                "1000",
                "--discriminator_warmup_margin",
                "0.99",
                "--max_epochs",
                "3",
            ),
            clock=clock_for(fake),
        )
        == 0
    )
    record = metrics(tmp_path, "discriminator_warmup")[0]
    assert record["ended_by"].startswith("the budget") and 3 <= record["steps"] <= 5
    assert metrics(tmp_path, "end")[0]["time_used_s"] <= target_s


def test_the_warm_up_writes_checkpoints_and_a_resume_continues_it_where_it_was(
    prepared_demo, tmp_path, timed_work, pretrained, monkeypatch
):
    """--checkpoint_every_minutes 0.1 (6 s: every 2 warm-up steps of 3 s, besides those at epoch ends,
    every 3 steps). Killed as warm-up step 6 of 6 starts (simulated: nothing more is written), the run has
    a periodic checkpoint from inside the warm-up; the resume continues the warm-up there and trains on
    to the same losses as a run never stopped."""
    fake, _ = timed_work
    common = [
        "--target_hours",
        "1",
        "--max_epochs",
        "3",
        "--discriminator_warmup_steps",
        "6",
        "--discriminator_warmup_margin",
        "0.99",
        "--checkpoint_every_minutes",
        "0.1",
    ]
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    assert train_vits.main(warm_up_args(prepared_demo, whole, pretrained, *common), clock=clock_for(fake)) == 0

    from finetune.training.warmup import DiscriminatorWarmup

    real_out_of_room = DiscriminatorWarmup.out_of_room

    class Killed(Exception):
        pass

    def killed_at_6(self, pacer):
        if self.progress.done == 5:
            raise Killed()  # as a SIGKILL would: nothing more is written
        return real_out_of_room(self, pacer)

    monkeypatch.setattr(DiscriminatorWarmup, "out_of_room", killed_at_6)
    fake.t = 0.0
    with pytest.raises(Killed):
        train_vits.main(warm_up_args(prepared_demo, parts, pretrained, *common), clock=clock_for(fake))
    monkeypatch.setattr(DiscriminatorWarmup, "out_of_room", real_out_of_room)
    pointer = json.loads((parts / "checkpoints" / "latest_checkpoint.json").read_text())
    latest = load_checkpoint(parts / "checkpoints" / pointer["path"])
    done = latest["state"]["warmup"]["done"]
    assert "_step_" in pointer["path"]  # a periodic checkpoint, not an epoch end's (after warm-up step 3)
    assert 3 < done <= 5 and not latest["state"]["warmup"]["finished"]
    assert resume(parts, fake) == 0
    assert "discriminator warm-up: alone" in log_of(parts) and f"(resumed at step {done})" in log_of(parts)
    assert metrics(parts, "discriminator_warmup")[0]["steps"] == 6
    from tests.test_train import losses_by_step

    expected, got = losses_by_step(whole), losses_by_step(parts)
    assert sorted(expected) == sorted(got) and expected
    for number, values in expected.items():
        for name, value in values.items():
            assert got[number][name] == pytest.approx(value, rel=1e-5, abs=1e-7), (number, name)


def test_a_failed_warm_up_update_goes_back_to_the_last_good_state(
    prepared_demo, tmp_path, timed_work, pretrained, monkeypatch
):
    fake, _ = timed_work
    real = step.TrainStep.update
    calls = {"n": 0}

    def out_of_memory_on_the_third(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:

            def torn(*_):  # the discriminator has stepped: half an update, then out of memory
                hook.remove()
                raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")

            hook = self.optimizer_d.register_step_post_hook(torn)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(step.TrainStep, "update", out_of_memory_on_the_third)
    assert (
        train_vits.main(
            warm_up_args(
                prepared_demo,
                tmp_path,
                pretrained,
                "--target_hours",
                "1",
                "--max_epochs",
                "1",
                "--discriminator_warmup_steps",
                "6",
                "--discriminator_warmup_margin",
                "0.99",
            ),
            clock=clock_for(fake),
        )
        == 0
    )
    log = log_of(tmp_path)
    assert (
        "out of memory inside the optimizer update (the weights may be partly updated) at discriminator warm-up "
        "step 3: went back to the weights the run started with"
    ) in log
    rollback = metrics(tmp_path, "rollback")[0]
    assert rollback["at"] == "discriminator warm-up step 3" and metrics(tmp_path, "end")[0]["rollbacks"] == 1


def test_after_the_warm_up_a_rollback_keeps_the_warmed_discriminator(
    prepared_demo, tmp_path, timed_work, pretrained, monkeypatch
):
    """The warm-up's end is a checkpoint: a NaN storm in the first training steps goes back to it (the
    warmed discriminator, the warm-up done), not to the random discriminator the run started with."""
    from finetune.recipes import shared

    policy = recovery.DivergencePolicy(max_in_row=3, max_rollbacks=2, lr_factor=0.5)
    monkeypatch.setattr(shared, "Divergence", lambda rollbacks=0: recovery.Divergence(policy, rollbacks))
    fake, _ = timed_work
    nan_losses_from(5, 7, monkeypatch)  # 4 warm-up micro-batches, then the first 3 training steps
    assert (
        train_vits.main(
            warm_up_args(
                prepared_demo,
                tmp_path,
                pretrained,
                "--target_hours",
                "1",
                "--max_epochs",
                "3",
                "--discriminator_warmup_steps",
                "4",
                "--discriminator_warmup_margin",
                "0.99",
                "--keep_checkpoints",
                "10",
            ),
            clock=clock_for(fake),
        )
        == 0
    )
    rollback = metrics(tmp_path, "rollback")[0]
    assert rollback["step"] == 3 and rollback["to"].startswith("checkpoint ")
    went_back_to = load_checkpoint(tmp_path / "checkpoints" / rollback["to"].split()[1])
    assert went_back_to["state"]["warmup"]["finished"] and went_back_to["state"]["warmup"]["done"] == 4
    assert final_model_is_finite(tmp_path)


# ---------------------------------------------------------------- stop requests while building and synthesising


def test_sigterm_while_the_model_is_built_stops_before_loading_the_data(
    prepared_demo, tmp_path, timed_work, monkeypatch, capsys
):
    fake, _ = timed_work
    loads = {"n": 0}
    real_load = corpus.load_example

    def counted(*a, **k):
        loads["n"] += 1
        return real_load(*a, **k)

    monkeypatch.setattr(corpus, "load_example", counted)
    monkeypatch.setattr(assembly, "build_generator", sigterm_on_call(1, assembly.build_generator))
    assert train_vits.main(args(prepared_demo, tmp_path, "--target_hours", "1"), clock=clock_for(fake)) == 143
    assert loads["n"] == 0 and "before training started: nothing was trained" in capsys.readouterr().err
    assert not list_checkpoints(tmp_path / "checkpoints")


def test_sigterm_during_test_sentences_stops_between_two(prepared_demo, tmp_path, timed_work, monkeypatch):
    """A real SIGTERM during the baseline's first test sentence: the second is never synthesised, and the
    starting state is saved."""
    fake, _ = timed_work
    real_speak = evaluation.speak
    calls = {"n": 0}

    def speak(*a, **k):
        calls["n"] += 1
        return real_speak(*a, **k)

    monkeypatch.setattr(evaluation, "speak", sigterm_on_call(3, speak))  # clips 1-2 (--val_samples 2), sentence 1
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("ez baş im\ntu çawa yî\n", encoding="utf-8")
    assert (
        train_vits.main(
            args(prepared_demo, tmp_path, "--target_hours", "1", "--test_sentences", str(sentences)),
            clock=clock_for(fake),
        )
        == 143
    )
    assert calls["n"] == 3
    written = list((tmp_path / "checkpoints" / "samples").glob("step_000000/*.wav"))
    assert [p.name for p in written] == ["sentence_01.wav"]
    latest = json.loads((tmp_path / "checkpoints" / "latest_checkpoint.json").read_text())
    assert latest["step"] == 0


# ---------------------------------------------------------------- weights that are not finite


def test_weights_that_are_not_finite_are_never_written(prepared_demo, tmp_path, timed_work, monkeypatch):
    """A weight turns NaN after step 4 (as a bad update would leave it): no checkpoint or export is written
    from it; the NaN steps that follow send the run back to its last good checkpoint, and every file on
    disk holds finite weights."""
    from finetune.recipes import shared

    policy = recovery.DivergencePolicy(max_in_row=3, max_rollbacks=2, lr_factor=0.5)
    monkeypatch.setattr(shared, "Divergence", lambda rollbacks=0: recovery.Divergence(policy, rollbacks))
    fake, _ = timed_work

    def poison_at_4(loop):
        if loop.state.step == 4 and not loop.state.setbacks.rollbacks:
            with torch.no_grad():
                next(loop.parts.step.model.decoder.parameters()).fill_(float("nan"))

    code = train_vits.main(
        args(
            prepared_demo,
            tmp_path,
            "--target_hours",
            "1",
            "--max_epochs",
            "3",
            "--gradient_accumulation_steps",
            "2",
            "--val_every",
            "3",
        ),
        clock=clock_for(fake),
        step_callback=poison_at_4,
    )
    assert code == 0
    assert "the weights are not finite numbers" in log_of(tmp_path)
    for path in list_checkpoints(tmp_path / "checkpoints"):
        payload = load_checkpoint(path)
        assert all(torch.isfinite(v).all() for v in payload["model"].values() if v.is_floating_point()), path.name
    assert final_model_is_finite(tmp_path)
    from transformers import VitsModel

    best = VitsModel.from_pretrained(str(tmp_path / "checkpoints" / "best_model"))
    assert all(torch.isfinite(p).all() for p in best.parameters())
