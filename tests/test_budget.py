"""The budget's arithmetic: plan, fit decisions, step timing (the learning-rate curve: tests/test_schedule.py)."""

import logging

import pytest

from finetune.training.budget import (
    Budget,
    Clock,
    Durations,
    Plan,
    StepTimer,
    make_plan,
    safety_margin_s,
)


def test_plan_counts_steps_evaluations_and_saves():
    # 1000 s left, 2 s safety, 20 s final save: 978 s usable. Evaluations every 50 steps at 10 s,
    # checkpoints 5 s at each 100-step epoch (and every 1800 s, which never comes).
    plan = make_plan(
        time_left_s=1000,
        step_s=2.0,
        eval_s=10.0,
        checkpoint_s=5.0,
        final_s=20.0,
        steps_per_epoch=100,
        steps_done=7,
        warmup_steps=500,
        safety_s=2.0,
        eval_every=50,
    )
    per_step = 2.0 + 10.0 / 50 + 5.0 * (1 / 100 + 2.0 / 1800)
    assert plan.total_steps == 7 + int(978 / per_step)
    assert plan.limited_by == "time" and plan.eval_every == 50
    assert plan.warmup_steps == plan.total_steps // 10  # 500 shortened to 10% of a short plan
    assert plan.epochs == pytest.approx(plan.total_steps / 100)


def test_planned_evaluations_take_at_most_a_tenth_of_the_time_the_final_one_counted():
    plan = make_plan(
        time_left_s=3600,
        step_s=1.0,
        eval_s=60.0,
        checkpoint_s=0.0,
        final_s=0.0,
        steps_per_epoch=1000,
        steps_done=0,
        warmup_steps=10,
        safety_s=0.0,
    )
    due = [s for s in range(1, plan.total_steps + 1) if plan.evaluation_due(s)]
    assert len(due) == plan.evaluations_before_final == 5  # and the final: 6 x 60 s, a tenth of 3600 s
    assert due == [plan.eval_every * k for k in range(1, 6)] and plan.total_steps - due[-1] >= plan.eval_every / 2
    assert plan.total_steps == 3600 - 5 * 60  # the steps count the five; the final is in final_s


def short_plan(steps_done: int = 25) -> Plan:
    """The plan of a 225 s fine-tune at the second scale on a 2-core machine, after its benchmark."""
    return make_plan(
        time_left_s=115.3,
        step_s=2.904,
        eval_s=22.4,
        checkpoint_s=0.77,
        final_s=29.0,
        steps_per_epoch=32,
        steps_done=steps_done,
        warmup_steps=50,
        safety_s=1.0,
    )


def test_a_short_run_evaluates_only_at_its_end_whatever_step_it_was_planned_at():
    for steps_done in (0, 25, 28, 31):
        plan = short_plan(steps_done)
        after = range(steps_done + 1, plan.total_steps + 10)  # a plan that ran over by a few steps too
        assert plan.evaluations_before_final == 0 and not any(plan.evaluation_due(s) for s in after)
        assert plan.total_steps - steps_done == int((115.3 - 29.0 - 1.0) / (2.904 + 0.77 / 32 + 0.77 * 2.904 / 1800))
    assert "no evaluation before the final one" in short_plan().evaluations_in_words


def test_planned_evaluations_count_from_the_plans_start_and_leave_the_last_half_interval_to_the_final():
    # Replanned at step 40 with the interval kept (14): due at 54, 68, ... and not within 7 of the end.
    plan = make_plan(1000, 2.0, 10.0, 0.0, 20.0, 100, 40, 10, 2.0, eval_every=14, evaluations_planned=True)
    due = [s for s in range(41, plan.total_steps + 1) if plan.evaluation_due(s)]
    assert due[:2] == [54, 68] and all((s - 40) % 14 == 0 for s in due)
    assert plan.total_steps - due[-1] >= 7 and due[-1] + 14 + 7 > plan.total_steps
    assert plan.evaluations_before_final == len(due)
    # The steps count exactly those evaluations: 978 s usable, 2 s a step, 10 s an evaluation.
    assert plan.total_steps - 40 == int((978 - len(due) * 10.0) / 2.0)


def test_the_users_interval_evaluates_at_each_of_its_multiples():
    plan = make_plan(1000, 2.0, 10.0, 0.0, 20.0, 100, 7, 10, 2.0, eval_every=50)
    assert not plan.evaluations_planned
    due = [s for s in range(8, plan.total_steps + 1) if plan.evaluation_due(s)]
    assert due == list(range(50, plan.total_steps + 1, 50))
    assert plan.evaluations_before_final == len([s for s in due if s < plan.total_steps])


def test_max_epochs_caps_the_plan():
    plan = make_plan(
        time_left_s=10_000,
        step_s=1.0,
        eval_s=1.0,
        checkpoint_s=1.0,
        final_s=1.0,
        steps_per_epoch=30,
        steps_done=10,
        warmup_steps=5,
        safety_s=1.0,
        max_epochs=2,
    )
    assert (plan.total_steps, plan.limited_by) == (60, "max_epochs")


def test_budget_counts_earlier_processes():
    now = [100.0]
    budget = Budget(target_s=1000.0, clock=Clock(lambda: now[0]), used_before_s=400.0, safety_s=5.0)
    assert budget.used_s() == 500.0 and budget.left_s() == 500.0
    assert (
        safety_margin_s(180) == 1.0
        and safety_margin_s(600) == pytest.approx(1.8)
        and safety_margin_s(9.5 * 3600) == 60.0
    )


def test_durations_skip_warm_up_ones_once_later_ones_exist_and_are_cautious():
    durations = Durations(skip=2)
    durations.add(9.0)
    assert durations.mean_s == 9.0 and durations.cautious_s == 9.0  # only a slow first one: it bounds the estimate
    for seconds in (8.0, 1.0, 2.0, 3.0):
        durations.add(seconds)
    assert durations.mean_s == pytest.approx(2.0)  # the plan leaves the first two out
    assert durations.cautious_s == 9.0  # few warm ones: the slowest seen, the first ones included
    for seconds in [5.0, 9.0] + [1.0] * 17:
        durations.add(seconds)
    assert durations.cautious_s == 2.0  # 22 warm (2, 3, 5, 9 and eighteen 1s): the 90th percentile, not 9
    assert durations.early_s == 3.0  # the first five warm ones (1, 2, 3, 5, 9): what the work cost at first
    durations.add(30.0)
    assert durations.cautious_s == 3.0  # one long batch: the 90th percentile moves up one place, no more
    durations.add(30.0)
    assert durations.cautious_s == 30.0 and durations.early_s == 3.0  # two: the next work is believed slower
    assert Durations(prior_s=4.0).mean_s == 4.0 and not Durations().ready


def test_step_timer_counts_a_window_of_micro_batches_and_an_update():
    timer = StepTimer(accumulation=4, skip=0)
    assert not timer.ready and timer.micro_batch_s == 0.0  # nothing timed: the first micro-batch always runs
    for seconds in (2.0, 2.0, 2.0, 2.0):
        timer.micro_batches.add(seconds)
    timer.updates.add(0.5)
    assert timer.step_s == pytest.approx(8.5) and timer.cautious_step_s == pytest.approx(8.5)
    resumed = StepTimer(accumulation=4, prior_micro_batch_s=3.0, prior_update_s=1.0)
    assert resumed.ready and resumed.step_s == pytest.approx(13.0)


def test_the_window_is_decided_before_the_step_and_its_last_micro_batch_cut_to_the_clips_that_fit():
    from finetune.training.budget import Budget, Clock
    from finetune.training.pacing import Costs, Pacer, WindowShape

    now = {"t": 0.0}
    budget = Budget(target_s=100.0, clock=Clock(lambda: now["t"]), safety_s=2.0)
    timer = StepTimer(accumulation=4, skip=0, clips=8)
    pacer = Pacer(budget, timer, Costs(eval_s=5.0, export_s=1.0, checkpoint_s=2.0), checkpoint_every_s=1e9)
    whole = WindowShape(planned=4, micro_batches=4, clips=8, last_clips=8)
    assert pacer.next_window() == whole and not whole.shortened  # nothing timed: the whole window
    for _ in range(3):
        timer.micro_batches.add(8.0)  # 1 s a clip
    timer.updates.add(0.5)
    reserve = 5.0 + 3 * 1.0 + 2.0 + 2.0  # the final save, then the safety margin
    now["t"] = 100.0 - reserve - 0.5 - 40.0  # room for 40 s of clips and the update: four whole micro-batches
    assert pacer.next_window() == whole
    assert not pacer.step_is_last(10, whole)  # 32 s of window and the update leave 8 s: a clip and an update fit
    now["t"] = 100.0 - reserve - 0.5 - 20.0  # two whole micro-batches, then four clips
    window = pacer.next_window()
    assert window == WindowShape(4, 3, 8, 4) and window.shortened and pacer.step_is_last(10, window)
    now["t"] = 100.0 - reserve - 0.5 - 16.5  # two whole ones, and half a clip after them: the second is the last
    assert pacer.next_window() == WindowShape(4, 2, 8, 8)
    now["t"] = 100.0 - reserve - 0.5 - 3.7  # three clips fit: one micro-batch, cut to them
    assert pacer.next_window() == WindowShape(4, 1, 8, 3) and pacer.may_start_step()
    now["t"] = 100.0 - reserve - 0.5 - 0.9  # not one clip: no step starts
    assert not pacer.may_start_step()
    # A whole window that leaves room for its update but not for one more clip and update: the last step.
    now["t"] = 100.0 - reserve - 0.5 - 32.0 - 1.4
    assert pacer.next_window() == whole and pacer.step_is_last(10, whole)
    # After a step, 6 s before the final save: an evaluation of 5 s due now would leave no room for another
    # step (a clip and the update): left to the final save.
    now["t"] = 100.0 - reserve - 6.0
    assert pacer.room_for_due(4.0) and not pacer.room_for_due(5.0)
    unknown = StepTimer(accumulation=4, skip=0)  # clips unknown (1): micro-batches are never cut
    unknown.micro_batches.add(8.0)
    now["t"] = 100.0 - reserve - 0.5 - 12.0  # one whole micro-batch and a half
    assert Pacer(budget, unknown, Costs(eval_s=5.0, export_s=1.0, checkpoint_s=2.0), 1e9).next_window() == (
        WindowShape(4, 1, 1, 1)
    )


def test_a_batch_cut_to_its_first_clips_is_padded_to_them_alone():
    import numpy as np

    from finetune.data.examples import Example, collate

    examples = [
        Example(f"c{i}", np.arange(2 + 3 * i, dtype=np.int32), np.ones(256 * (10 + 20 * i), dtype=np.int16), speaker=i)
        for i in range(3)
    ]
    batch = collate(examples, 256)
    first = batch.first(2)
    assert first.item_ids == ["c0", "c1"] and first.input_ids.shape == (2, 5) and first.audio.shape == (2, 256 * 30)
    assert first.frame_lengths.tolist() == [10, 30] and first.speaker_ids.tolist() == [0, 1]
    assert batch.first(3) is batch and batch.first(5) is batch


def test_the_safety_margin_stays_as_set_when_the_machine_slows():
    """The margin holds the estimates' error and an exit without the interpreter's teardown (cli.exit_process):
    a busy machine slows the final save's reserve, not the margin."""
    from finetune.training.budget import Budget, Clock
    from finetune.training.pacing import Costs, Pacer

    timer = StepTimer(accumulation=1, skip=0)
    for _ in range(20):
        timer.micro_batches.add(1.0)
    budget = Budget(target_s=100.0, clock=Clock(lambda: 90.0), safety_s=2.0)  # 10 s left
    pacer = Pacer(budget, timer, Costs(eval_s=1.0), checkpoint_every_s=1e9)
    assert pacer.margin_s == pytest.approx(2.0) and pacer.room_for(7.0) and not pacer.room_for(7.1)
    for _ in range(10):
        timer.micro_batches.add(2.0)  # the machine got twice as slow
    assert pacer.slowdown == pytest.approx(2.0)  # against the first micro-batches: nothing was timed after them
    assert pacer.margin_s == pytest.approx(2.0) and pacer.room_for(6.0) and not pacer.room_for(6.1)
    assert pacer.evaluation_limit(final=True).left_s() == pytest.approx(8.0)


def test_the_final_save_is_reserved_as_slow_as_the_micro_batches_have_become_since_it_was_timed():
    """The final save was timed when a micro-batch took 1 s. Three micro-batches of 2 s (the machine got busy)
    double its reserve at once; and after fifty, when the window has forgotten the 1 s ones, the reserve still
    counts from when the save was timed."""
    from finetune.training.budget import Budget, Clock
    from finetune.training.pacing import Costs, Pacer

    timer = StepTimer(accumulation=1, skip=0)
    for _ in range(20):
        timer.micro_batches.add(1.0)
    budget = Budget(target_s=100.0, clock=Clock(lambda: 90.0), safety_s=1.0)  # 10 s left
    pacer = Pacer(budget, timer, Costs(export_s=2.0), checkpoint_every_s=1e9)
    pacer.costs_timed()
    # the final save: two exports, best_model's copy (an export's cost where no checkpoint is timed)
    assert pacer.slowdown == 1.0 and pacer.final_reserve_s == pytest.approx(6.0) and pacer.room_for(3.0)
    for _ in range(3):
        timer.micro_batches.add(2.0)
    assert pacer.slowdown == pytest.approx(2.0) and pacer.final_reserve_s == pytest.approx(12.0)
    assert not pacer.room_for(0.0)
    for _ in range(50):
        timer.micro_batches.add(2.0)
    assert pacer.slowdown == pytest.approx(2.0)
    pacer.costs_timed()  # an evaluation timed on the busy machine: its costs are the busy ones
    assert pacer.slowdown == 1.0  # not slowed down again


def test_costs_timed_before_any_micro_batch_slow_down_from_the_first_ones():
    """The baseline evaluation and export are timed before any micro-batch: the micro-batches right after them
    are what the machine ran at then. A coarse 72 s run got busy in its benchmark steps (12 micro-batches, before
    any plan): counted against the window's usual, which needs 20, the slowdown was not seen and the run ended
    1.8 s past its budget. Three slower micro-batches now show it."""
    from finetune.training.budget import Budget, Clock
    from finetune.training.pacing import Costs, Pacer

    timer = StepTimer(accumulation=4)  # the first two micro-batches are left out (compilation, warm-up)
    budget = Budget(target_s=72.0, clock=Clock(lambda: 50.0), safety_s=1.0)
    pacer = Pacer(budget, timer, Costs(eval_s=1.0, export_s=2.0), checkpoint_every_s=1e9)
    assert pacer.slowdown == 1.0  # nothing timed yet
    for seconds in [6.0, 5.0] + [3.0] * 6:
        timer.micro_batches.add(seconds)
    assert pacer.slowdown == 1.0
    for _ in range(3):
        timer.micro_batches.add(8.0)  # the machine got busy
    assert pacer.slowdown == pytest.approx(8.0 / 3.0)
    assert pacer.final_reserve_s == pytest.approx((1.0 + 3 * 2.0) * 8.0 / 3.0)


def test_the_threads_a_cpu_run_gave_up_count_less_in_the_final_saves_slowdown():
    """Micro-batches three times slower after the run went from 2 threads to 1: the final save, which runs mostly
    on one thread, is expected 3 / sqrt(2) times slower, not 3. The same slowdown on as many threads as when the
    costs were timed, or on a GPU run (no thread count), counts whole; more threads than then count as none given
    up."""
    from finetune.training.budget import Budget, Clock
    from finetune.training.pacing import Costs, Pacer

    threads = [2]
    timer = StepTimer(accumulation=1, skip=0)
    for _ in range(5):
        timer.micro_batches.add(1.0)
    budget = Budget(target_s=180.0, clock=Clock(lambda: 150.0), safety_s=1.0)
    pacer = Pacer(budget, timer, Costs(export_s=2.0), 1e9, threads=lambda: threads[0])
    unthreaded = Pacer(budget, timer, Costs(export_s=2.0), 1e9)
    pacer.costs_timed()
    unthreaded.costs_timed()
    assert pacer.costs.timed_at_threads == 2 and pacer.threads_given_up == 1.0
    for _ in range(5):
        timer.micro_batches.add(3.0)
    assert pacer.slowdown == pytest.approx(3.0) and unthreaded.slowdown == pytest.approx(3.0)
    threads[0] = 1  # the machine got busy: cpu_threads.py gave a thread up
    assert pacer.threads_given_up == pytest.approx(2**0.5)
    assert pacer.slowdown == pytest.approx(3.0 / 2**0.5) and unthreaded.slowdown == pytest.approx(3.0)
    assert pacer.final_reserve_s == pytest.approx(3 * 2.0 * 3.0 / 2**0.5)
    threads[0] = 4
    assert pacer.threads_given_up == 1.0 and pacer.slowdown == pytest.approx(3.0)


def test_a_finish_leaves_out_last_model_first_then_its_checkpoint():
    """What fits is asked at the slowdown; last_model is a copy of best_model when it holds the same weights,
    else an export with its tempo fit, without it, or left out."""
    from finetune.training.finishing import LAST_MODEL_CHOICES, fits, last_model_choice

    assert fits(2.0, then_s=1.0, slowdown=2.0, margin_s=1.0, left_s=7.0)
    assert not fits(2.0, then_s=1.0, slowdown=2.0, margin_s=1.0, left_s=6.9)
    copy, export, unfitted, none = LAST_MODEL_CHOICES
    assert last_model_choice(True, True, False, False) == copy  # the same weights: never a second fit
    assert last_model_choice(True, False, True, True) == none
    assert last_model_choice(False, True, True, True) == export
    assert last_model_choice(False, True, False, True) == unfitted
    assert last_model_choice(False, True, False, False) == none


def test_an_update_not_timed_yet_counts_half_a_micro_batch_in_the_decisions_mid_window():
    """A run whose first step is its last (10 s micro-batches, 72 s): its update had never been timed and counted 0,
    and the first AdamW step, making the optimizers' state, took 3.5 s past the point the final save needed."""
    from finetune.training.pacing import Costs, Pacer

    now = {"t": 50.0}
    budget = Budget(target_s=72.0, clock=Clock(lambda: now["t"]), safety_s=1.0)
    pacer = Pacer(budget, StepTimer(accumulation=4, skip=0), Costs(), 1e9)
    assert pacer.one_more_fits(10.0)  # 22 s left: 10 + 5 (the untimed update) + 1 (the margin)
    now["t"] = 58.0
    assert not pacer.one_more_fits(10.0)  # 14 s left
    assert pacer.must_end_in_s(10.0) == pytest.approx(14.0 - 1.0 - 5.0)
    pacer.timer.record([10.0], 0.5)
    assert pacer.one_more_fits(10.0) and pacer.must_end_in_s(10.0) == pytest.approx(14.0 - 1.0 - 0.5)


def test_a_final_evaluation_that_scored_its_clips_slower_than_planned_slows_the_rest_of_the_finish():
    """The machine got busy during the last step (no micro-batch showed it): the final evaluation, planned at 1.0 s
    for 16 clips, scored 12 in 3.1 s before its time limit. The parts after it are expected 4x slower: the room a
    1 s part needs grows with it. An evaluation about as fast as planned leaves the slowdown as it was."""
    from finetune.training.finishing import FinishTimes
    from finetune.training.pacing import Costs, Pacer

    now = {"t": 63.0}
    budget = Budget(target_s=72.0, clock=Clock(lambda: now["t"]), safety_s=1.0)
    pacer = Pacer(budget, StepTimer(accumulation=4, skip=0), Costs(eval_s=1.0, export_s=1.0, checkpoint_s=1.0), 1e9)
    idle = FinishTimes.starting(pacer)
    idle.evaluated(16, 16, 1.2)  # within the spread of evaluations: not a slower machine
    assert idle.slowdown == 1.0 and idle.room(4.0)
    busy = FinishTimes.starting(pacer)
    busy.evaluated(12, 16, 3.1)
    assert busy.slowdown == pytest.approx(3.1 / 0.75)
    assert busy.room(1.0) and not busy.room(2.0)  # 1 x 4.13 + the margin = 5.1 s of the 9 left; 2 s: 9.3


def test_a_best_model_of_a_final_evaluation_that_ran_slow_is_exported_without_its_tempo_fit_when_the_fit_no_longer_fits(
    caplog,
):
    """The figures of a 72 s run the machine got busy under as it ended (bench_deadline.py fine-busy90): its final
    evaluation, planned at 1.5 s for 16 clips, scored 6 in 3.1 s (5.5x), 2.8 s before the deadline, and its model
    was the best. Its export with the tempo fit (0.6 s as timed), best_model's copy and the closing report, 5.5x
    slower, and the margin do not fit: best_model is exported without the fit, said in the log and metrics.jsonl (it
    had been fitted, 5x slower than timed, and the run ended 5% over). With 20 s left it is fitted."""
    from types import SimpleNamespace

    from finetune.training.pacing import Costs, Pacer
    from finetune.training.run_evaluations import Evaluations

    now, events = {"t": 72.0 - 2.8}, []
    budget = Budget(target_s=72.0, clock=Clock(lambda: now["t"]), safety_s=1.0)
    costs = Costs(eval_s=1.5, export_s=0.6, checkpoint_s=0.1, report_s=0.3, tempo_fit_s=0.4)
    pacer = Pacer(budget, StepTimer(accumulation=1, skip=0), costs, 1e9)
    logger = logging.getLogger("test_tempo_fits")
    run_log = SimpleNamespace(logger=logger, event=lambda kind, **fields: events.append((kind, fields)))
    context = SimpleNamespace(budget=budget, run_log=run_log)
    evaluations = SimpleNamespace(pacer=pacer, context=context, exports=SimpleNamespace(fit_tempo=lambda model: None))
    result = SimpleNamespace(clips_scored=6, clips_planned=16, seconds=3.1)
    with caplog.at_level(logging.INFO, logger="test_tempo_fits"):
        assert not Evaluations.tempo_fits(evaluations, result)
    assert events == [
        ("left_out", {"part": "best_model's tempo fit", "needed_s": events[0][1]["needed_s"], "left_s": 2.8})
    ]
    assert events[0][1]["needed_s"] > 2.8 and "best_model's tempo fit left out" in caplog.text
    now["t"] = 72.0 - 20.0
    assert Evaluations.tempo_fits(evaluations, result) and len(events) == 1
    now["t"] = 72.0 - 2.8  # a run that fits no tempo (--inference_settings model) has none to leave out
    evaluations.exports.fit_tempo = None
    assert Evaluations.tempo_fits(evaluations, result) and len(events) == 1


def test_a_micro_batch_drawn_near_the_final_saves_time_is_watched_whatever_its_cost():
    """A 0.3 s micro-batch drawn 12 s before the time the final save needs could not end too late at ten times
    its cost, but torch's threads, waiting for each other while two busy processes took the cores, once ran one
    such for 6.7 s (before the run could give a thread up) and into the final save's time: within WATCHED_S it
    is watched; further out it is not (the watch copies the gradients before each micro-batch)."""
    from types import SimpleNamespace

    from finetune.training.late import AT_RISK, WATCHED_S
    from finetune.training.window import WindowRunner

    now, end_in = [100.0], [12.0]
    runner = WindowRunner(
        SimpleNamespace(dist=SimpleNamespace(active=False)),
        None,
        None,
        Clock(lambda: now[0]),
        None,
        must_end_in_s=lambda expected_s: end_in[0],
        usual_s=lambda: 0.3,
    )
    assert AT_RISK * 0.3 < end_in[0] <= WATCHED_S
    is_late = runner.late_check()
    assert is_late is not None and not is_late()
    now[0] += 12.1  # the micro-batch still runs when the final save's time comes
    assert is_late()
    end_in[0] = WATCHED_S + 1.0
    assert runner.late_check() is None
    runner.step.dist.active = True  # the processes of a data-parallel run must run the same micro-batches
    end_in[0] = 1.0
    assert runner.late_check() is None
