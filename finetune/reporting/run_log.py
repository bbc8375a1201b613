"""What a training run tells its user, in one place: the progress line (tqdm on a terminal), train.log,
metrics.jsonl, TensorBoard / Weights & Biases (finetune/reporting/tracking.py), the step profile
(finetune/system/profile.py) and report.html (finetune/reporting/run_report.py). The loop says what happened; this
decides where it goes. Only the main process of a data-parallel run writes anything.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from finetune.reporting.evaluation import EvalResult
from finetune.reporting.logs import Metrics, ProgressDisplay, memory_text, progress_line
from finetune.reporting.tracking import Tracker
from finetune.system.atomic import write_atomic, write_text_atomic
from finetune.system.disk import OPTIONAL
from finetune.system.profile import StepProfile

SCALER_FIGURES = ("loss_scale_generator", "loss_scale_discriminator", "fp16_overflow_skips")  # fp16 runs only
# report.html is redrawn after an evaluation at most this often (and always at the end): its figures cost
# about 0.6 s of CPU each time, a share a short CPU run with frequent evaluations would otherwise pay.
REPORT_EVERY_S = 60.0


class RunLog:
    def __init__(
        self,
        logger,
        metrics: Metrics,
        tracker: Tracker,
        profile: StepProfile,
        run_dir: Path,
        device,
        is_main: bool = True,
        report_title: str = "",
        max_length_ratio: float = 1.25,
        sample_rate: int = 16000,
        best_dir: Path | None = None,
    ):
        self.logger, self.metrics, self.tracker, self.profile = logger, metrics, tracker, profile
        self.run_dir, self.device, self.is_main = run_dir, device, is_main
        self.report_title, self.max_length_ratio, self.sample_rate = report_title, max_length_ratio, sample_rate
        self.best_dir = best_dir
        self.display: ProgressDisplay | None = None
        self.eval_s = self.checkpoint_s = self.export_s = 0.0  # totals over the run (this process)
        self._report_drawn_at: float | None = None  # time.monotonic() of the last report.html
        self._pending_mels: tuple | None = None  # the latest evaluation's mels, not drawn yet

    def open_display(self, total: int, initial: int, every_s: float) -> None:
        self.display = ProgressDisplay(self.logger, total=total, initial=initial, every_s=every_s)

    def close(self) -> None:
        if self.display is not None:
            self.display.close()

    def set_total(self, total: int) -> None:
        if self.display is not None:
            self.display.set_total(total)

    # ------------------------------------------------------------ steps

    def step(
        self, now_s: float, fields: dict, used: int, planned: int, losses: dict[str, float], scalars: dict[str, float]
    ) -> None:
        """One optimizer step: to the trackers always; as a progress line and a metrics record when due.
        `fields` are progress_line's (step, total, epoch, epochs, lr, samples_per_s and the ETAs)."""
        if not self.is_main:
            return
        step = fields["step"]
        self.tracker.scalars(step, {**{f"loss/{k}": v for k, v in losses.items()}, **scalars}, prefix="train/")
        line = progress_line(**fields, losses=losses, memory=memory_text(self.device))
        if used < planned:
            line += f" | {used} of {planned} micro-batches"
        postfix = f"mel {losses.get('mel', float('nan')):.3f} lr {fields['lr']:.1e} {fields['samples_per_s']:.1f}/s"
        if self.display is not None and self.display.step(now_s, line, postfix):
            self.metrics.write(
                "train",
                step=step,
                planned_steps=fields["total"],  # the plan's (made again after each evaluation)
                epoch=round(fields["epoch"], 4),
                lr=fields["lr"],
                samples_per_s=round(fields["samples_per_s"], 2),
                time_used_s=round(scalars["time_used_s"], 2),
                micro_batches=used,
                **{k: round(v, 5) for k, v in losses.items()},
                **{k: scalars[k] for k in SCALER_FIGURES if k in scalars},
            )

    # ------------------------------------------------------------ evaluations

    def evaluation(
        self,
        result: EvalResult,
        described: str,
        improved: bool,
        best_note: str,
        best_score: float,
        example_mels,
        report: bool = True,
    ) -> bool:
        """An evaluation logged everywhere; report.html redrawn when a minute has passed since the last time
        (never with `report` False: the final evaluation, after which the closing report is drawn anyway).
        Whether it was redrawn."""
        if not self.is_main:
            return False
        self.metrics.write("eval", **result.summary(), best=improved, best_mcd_db=round(best_score, 4))
        self.logger.info(
            f"eval step {result.step}: {described} ({best_note}); "
            f"val mel {result.val_losses.get('mel', float('nan')):.3f}; {result.seconds:.1f}s"
        )
        numbers = {k: v for k, v in result.summary().items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        numbers.pop("step", None)
        numbers.update({f"judge_{name}": value for name, value in result.judged.items()})
        self.tracker.scalars(result.step, numbers, prefix="eval/")
        self._samples(result)
        due = report and self._report_due()
        if example_mels is not None:
            self._pending_mels = (result.step, *example_mels)
        if due or self.tracker.sinks:  # TensorBoard shows every evaluation's picture
            self._draw_mels()
        if due:
            self.write_report()
        return due

    def _report_due(self) -> bool:
        return self._report_drawn_at is None or time.monotonic() - self._report_drawn_at >= REPORT_EVERY_S

    def _draw_mels(self) -> None:
        if self._pending_mels is not None:
            self._mels(*self._pending_mels)
            self._pending_mels = None

    def _samples(self, result: EvalResult) -> None:
        if not self.tracker.sinks:
            return
        import soundfile as sf

        for path in result.samples:
            wave, rate = sf.read(path, dtype="float32")
            self.tracker.audio(result.step, f"samples/{Path(path).stem}", wave, rate)

    def _mels(self, step: int, clip_id: str, generated: np.ndarray, recorded: np.ndarray) -> None:
        from finetune.reporting.plots import mel_comparison_rgb

        rgb = mel_comparison_rgb(generated, recorded, f"step {step}, {clip_id}")
        self.tracker.image(step, "eval/mel_synthesised_vs_recorded", rgb)
        from PIL import Image

        def save(tmp: str) -> None:
            Image.fromarray(rgb).save(tmp, format="PNG")

        try:
            (self.run_dir / "report").mkdir(exist_ok=True)
            write_atomic(self.run_dir / "report" / "mel_latest.png", save, durable=False)
        except OSError as error:
            OPTIONAL.failed("report pictures", self.run_dir, error, self.logger.warning)

    # ------------------------------------------------------------ plan, failures, the end

    def plan(self, plan: dict, described: str) -> None:
        if not self.is_main:
            return
        try:
            write_text_atomic(self.run_dir / "plan.json", json.dumps(plan, indent=2) + "\n")
        except OSError as error:
            OPTIONAL.failed("plan.json", self.run_dir, error, self.logger.warning)
        self.metrics.write("plan", **plan)
        self.logger.info(described)

    def event(self, kind: str, **values) -> None:
        if self.is_main:
            self.metrics.write(kind, **values)

    def end(self, summary: dict) -> dict:
        """Profile shares and time totals into the summary; to metrics, the trackers and the report."""
        self.profile.flush()
        summary = {
            **summary,
            "profile_shares": {k: round(v, 4) for k, v in self.profile.shares().items()},
            "profile_s": {k: round(v, 4) for k, v in self.profile.totals.items()},
            "evaluation_s": round(self.eval_s, 2),
            "checkpoint_s": round(self.checkpoint_s, 2),
            "export_s": round(self.export_s, 2),
        }
        if self.is_main:
            self.metrics.write("end", **summary)
            self.tracker.scalars(int(summary.get("steps", 0)), summary["profile_shares"], prefix="profile/")
            self._draw_mels()
            self.write_report()
            self.tracker.close()
        return summary

    def write_report(self) -> None:
        """report.html now (after an evaluation, `evaluation` calls it only when REPORT_EVERY_S have passed)."""
        from finetune.reporting.run_report import write_report

        self._report_drawn_at = time.monotonic()
        try:
            write_report(self.run_dir, self.report_title, self.max_length_ratio, self.best_dir)
        except OSError as error:  # a full disk must not stop training for a report
            OPTIONAL.failed("report.html", self.run_dir, error, self.logger.warning)
