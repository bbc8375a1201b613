"""The learning-rate curve (finetune/training/schedule.py): warm-up, hold, cosine, the floor at the deadline, the
benchmark's steps before a plan, setbacks, a resume; and a run's steps at the rates the curve gives."""

import pytest

import train_vits
from finetune.training.budget import Budget, Clock, StepTimer, make_plan
from finetune.training.schedule import ScheduleSettings, curve, discriminator_warmup_rates, rates, warmup_steps
from tests.conftest import clock_for
from tests.test_train import args, metrics

PEAK, FLOOR = 1e-3, 0.1


def test_warmup_rises_linearly_then_cosine_reaches_the_floor_at_the_last_step():
    assert curve(1, 100, 10, PEAK, FLOOR) == pytest.approx(1e-4)
    assert curve(10, 100, 10, PEAK, FLOOR) == pytest.approx(PEAK)
    assert curve(55, 100, 10, PEAK, FLOOR) == pytest.approx(PEAK * (FLOOR + (1 - FLOOR) * 0.5))
    assert curve(100, 100, 10, PEAK, FLOOR) == pytest.approx(PEAK * FLOOR)
    assert curve(150, 100, 10, PEAK, FLOOR) == pytest.approx(PEAK * FLOOR)
    after_warmup = [curve(s, 100, 10, PEAK, FLOOR) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(after_warmup, after_warmup[1:]))


def test_a_decay_share_holds_the_peak_then_runs_the_cosine_over_the_last_steps():
    # --lr_decay_share 0.3: 90 steps after a warmup of 10; the peak held to step 73, the cosine over 74..100
    rated = {s: curve(s, 100, 10, PEAK, FLOOR, 0.3) for s in range(1, 121)}
    assert rated[5] == pytest.approx(PEAK / 2)  # the warmup unchanged
    assert all(rated[s] == pytest.approx(PEAK) for s in range(10, 74))
    assert rated[73 + 27 // 2] == pytest.approx(PEAK * (FLOOR + (1 - FLOOR) * 0.5), rel=0.06)  # half-way down
    assert rated[100] == pytest.approx(PEAK * FLOOR) and rated[120] == pytest.approx(PEAK * FLOOR)
    after_warmup = [rated[s] for s in range(10, 121)]
    assert all(a >= b for a, b in zip(after_warmup, after_warmup[1:]))
    # a share of 1 is the cosine over every step after the warmup
    assert all(curve(s, 100, 10, PEAK, FLOOR, 1.0) == curve(s, 100, 10, PEAK, FLOOR) for s in rated)


def test_a_short_plan_warms_up_over_a_tenth_of_its_steps_and_the_deadlines_last_step_is_at_the_floor():
    assert [warmup_steps(500, total) for total in (5, 30, 1000, 10_000)] == [1, 3, 100, 500]
    schedule = ScheduleSettings(PEAK, 2e-4, FLOOR, 1.0, warmup_steps=500)
    plan = make_plan(1000.0, 10.0, 0.0, 0.0, 0.0, steps_per_epoch=1000, steps_done=0, warmup_steps=500, safety_s=0)
    assert plan.total_steps == 100 and plan.warmup_steps == 10
    assert rates(schedule, 10, False, plan) == pytest.approx((PEAK, 2e-4))
    # the deadline ends the run at step 40 of 100 (the machine slowed down): that step at the floor, both rates
    assert rates(schedule, 40, True, plan) == pytest.approx((PEAK * FLOOR, 2e-4 * FLOOR))
    assert rates(schedule, 40, False, plan)[0] > 0.7 * PEAK


def test_before_any_plan_the_rate_warms_up_over_the_whole_warmup_and_after_setbacks_everything_is_scaled():
    schedule = ScheduleSettings(PEAK, 2e-4, FLOOR, 1.0, warmup_steps=500)
    assert rates(schedule, 1, False, None) == pytest.approx((PEAK / 500, 2e-4 / 500))  # nothing timed yet
    assert rates(schedule, 600, False, None) == pytest.approx((PEAK, 2e-4))  # no plan: the cosine has not begun
    plan = make_plan(1000.0, 10.0, 0.0, 0.0, 0.0, steps_per_epoch=1000, steps_done=0, warmup_steps=500, safety_s=0)
    assert rates(schedule, 55, False, plan, setback_scale=0.25) == pytest.approx(
        tuple(0.25 * r for r in rates(schedule, 55, False, plan))
    )
    assert discriminator_warmup_rates(2e-4, setback_scale=0.5) == (0.0, 1e-4)  # the generator does not learn


def test_a_resumed_run_replans_from_its_step_and_goes_on_along_the_same_curve():
    """Stopped at step 40 of a 100-step plan and resumed with the time the 60 steps left need: the new plan
    ends at the same step, and its rates from step 41 are the ones the run would have had. With less time
    left (a slower machine) the cosine spans the shorter plan and reaches the floor sooner, without a second
    warm-up."""
    schedule = ScheduleSettings(PEAK, 2e-4, FLOOR, 1.0, warmup_steps=500)
    whole = make_plan(1000.0, 10.0, 0.0, 0.0, 0.0, steps_per_epoch=1000, steps_done=0, warmup_steps=500, safety_s=0)
    resumed = make_plan(600.0, 10.0, 0.0, 0.0, 0.0, steps_per_epoch=1000, steps_done=40, warmup_steps=500, safety_s=0)
    assert resumed.total_steps == whole.total_steps
    assert [rates(schedule, s, False, resumed) for s in range(41, 101)] == [
        rates(schedule, s, False, whole) for s in range(41, 101)
    ]
    hurried = make_plan(300.0, 10.0, 0.0, 0.0, 0.0, steps_per_epoch=1000, steps_done=40, warmup_steps=500, safety_s=0)
    assert hurried.total_steps == 70
    hurried_rates = [rates(schedule, s, False, hurried)[0] for s in range(41, 71)]
    # where a 70-step plan's cosine is at step 41 (the step and the plan are all it depends on), not warming up again
    assert hurried_rates[0] == pytest.approx(curve(41, 70, 7, PEAK, FLOOR)) and hurried_rates[0] > 0.4 * PEAK
    assert all(a >= b for a, b in zip(hurried_rates, hurried_rates[1:])) and hurried_rates[-1] == pytest.approx(
        PEAK * FLOOR
    )


def test_the_benchmarks_steps_warm_up_over_the_plan_their_timings_foretell_not_the_whole_warmup():
    """A 225 s fine-tune at the second scale: 3 s steps, 190 s left after the baseline evaluation. Its 25
    benchmark steps warmed up over the whole --warmup_steps (500): 0.2-5% of the rate, for half its steps."""
    from finetune.training.pacing import Costs, Pacer

    now = {"t": 35.0}
    budget = Budget(target_s=225.0, clock=Clock(lambda: now["t"]), safety_s=1.0)
    timer = StepTimer(accumulation=1, skip=0)
    schedule = ScheduleSettings(PEAK, 2e-4, FLOOR, 1.0, warmup_steps=500)
    pacer = Pacer(budget, timer, Costs(eval_s=15.0, export_s=5.0, checkpoint_s=0.7), 1e9, warmup_steps=500)
    assert pacer.foretold_plan(32, 0) is None  # nothing timed yet
    for _ in range(1, 11):
        timer.record([2.95], 0.05)
        now["t"] += 3.0
    foretold = pacer.foretold_plan(32, 10)
    assert foretold.warmup_steps == foretold.total_steps // 10 and 50 < foretold.total_steps < 60
    rate = rates(schedule, 11, False, foretold)[0]
    assert rate == pytest.approx(curve(11, foretold.total_steps, foretold.warmup_steps, PEAK, FLOOR))
    assert rate > 0.5e-3  # past the warm-up, near the peak, not 11/500 of it


def test_lr_decay_share_from_the_command_line_reaches_the_schedule_and_a_share_of_0_is_refused(capsys):
    from finetune.cli import parse_config
    from finetune.training.run_settings import CheckpointSettings, LoopSettings
    from train_vits import TrainConfig

    flags = parse_config(TrainConfig, ["--lr_decay_share", "0.3"], "")
    checkpoints = CheckpointSettings(enabled=False)
    loop = LoopSettings.from_flags(flags, warmup_steps=0, num_workers=0, checkpoints=checkpoints)
    assert loop.schedule.lr_decay_share == 0.3
    with pytest.raises(SystemExit):
        parse_config(TrainConfig, ["--lr_decay_share", "0"], "")
    assert "--lr_decay_share 0.0: use a value above 0, at most 1" in capsys.readouterr().err


def test_a_run_steps_at_the_curves_rates_on_its_plan_and_ends_at_the_floor(prepared_demo, tmp_path, timed_work):
    """A run of injected time ended by its deadline: every step after the plan was made ran at the rate the curve
    gives on that plan (the metrics' lr, as the optimizer had it), its warm-up cut to a tenth of the plan, and
    the last step at the floor."""
    fake, _ = timed_work
    argv = args(prepared_demo, tmp_path, "--target_hours", "0.03", "--max_samples", "12", "--lr_decay_share", "0.5")
    assert train_vits.main(argv, clock=clock_for(fake)) == 0
    first = metrics(tmp_path, "plan")[0]
    end = metrics(tmp_path, "end")[-1]
    assert end["stop_reason"] == "deadline"
    assert first["warmup_steps"] == max(1, first["total_steps"] // 10)
    schedule = ScheduleSettings(2e-3, 2e-4, FLOOR, 0.5, warmup_steps=500)

    class Planned:  # the plan a step ran on: made again after each evaluation, its warm-up cut to a tenth
        def __init__(self, total_steps: int):
            self.total_steps, self.warmup_steps = total_steps, warmup_steps(500, total_steps)

    steps = {record["step"]: record for record in metrics(tmp_path, "train")}
    after = [s for s in steps if s > first["steps_done"]]
    assert len(after) >= 5 and max(after) == end["steps"]
    assert len({steps[s]["planned_steps"] for s in after}) > 1  # the plan moved under the run
    for s in after:
        expected = rates(schedule, s, s == end["steps"], Planned(steps[s]["planned_steps"]))[0]
        assert steps[s]["lr"] == pytest.approx(expected), s
    assert steps[end["steps"]]["lr"] == pytest.approx(2e-3 * FLOOR)
