"""Model folders a run writes (best_model, last_model, the output folder), each with its model card and,
unless --inference_settings model, the inference settings fitted to the held-out recordings' tempo in its
config.json (finetune/vits/tempo_fit.py; eval.json and the card say what they changed).

The writing itself, timed, atomic and safe on a full disk, is finetune/training/saving.py's Saver; this
adds what each folder says about itself (finetune/reporting/model_card.py) and counts the time spent,
the fit's included (it is part of what an export costs the budget).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from finetune.reporting.model_card import CardFacts
from finetune.training.context import RunPaths
from finetune.training.saving import Saver


class Exports:
    def __init__(
        self, saver: Saver, card: CardFacts | None, paths: RunPaths, run_log, fit_tempo: Callable | None = None
    ):
        self.saver, self.card, self.paths, self.run_log = saver, card, paths, run_log
        self.fit_tempo = fit_tempo  # model -> a finetune/vits/tempo_fit.py TempoFit (None: the model's own settings)

    def export(
        self,
        folder: Path,
        extra_json: dict,
        step: int,
        evaluation: dict | None = None,
        final: bool = False,
        tempo: bool = False,
    ) -> bool:
        """The model as it is now, into `folder`, with `extra_json` files and its card (`tempo`: with the
        inference settings fitted, when the run fits them); False when it could not be written (the
        previous folder, if any, is intact)."""
        fit, fit_s = self.fitted() if tempo else (None, 0.0)
        inference = None
        if fit is not None:
            inference = fit.config_values()
            evaluation = {**(evaluation or {}), "inference_settings": fit.to_dict()}
            if isinstance(extra_json.get("eval.json"), dict):
                extra_json = {
                    **extra_json,
                    "eval.json": {**extra_json["eval.json"], "inference_settings": fit.to_dict()},
                }
            self.run_log.logger.info(f"{folder.name}: inference settings fitted: {fit.describe()}")
        saved = self.saver.export(folder, {**extra_json, **self.card_file(folder, step, evaluation)}, final, inference)
        if saved:
            self.saver.costs.export_s += fit_s
            if tempo:
                self.saver.costs.tempo_fit_s = fit_s
        self.run_log.export_s += self.saver.costs.export_s if saved else 0.0
        return saved

    def fitted(self):
        """(the tempo fit of the model as it is now, its seconds); (None, 0) when the run does not fit."""
        if self.fit_tempo is None or not self.saver.is_main:
            return None, 0.0
        started = self.saver.now()  # the run's clock
        fit = self.fit_tempo(self.saver.model)
        return fit, self.saver.now() - started

    def card_file(self, folder: Path, step: int, evaluation: dict | None, role: str = "") -> dict[str, str]:
        """{"README.md": the model card} for a folder (none when the recipe gave no card facts)."""
        if self.card is None:
            return {}
        from finetune.reporting.model_card import card_text

        roles = {
            self.paths.best_dir: f"the best model of its run (step {step})",
            self.paths.last_dir: f"the last weights of its run (step {step})",
        }
        steps = int(evaluation.get("step", step)) if evaluation else step
        return {"README.md": card_text(self.card, role or roles.get(folder, folder.name), steps, evaluation)}

    def publish_best(self, summary: dict, best_step: int) -> bool:
        """The output folder (the voice an app loads): a copy of best_model with `summary` (its
        training_summary.json) and a card of its own. False when it could not be written."""
        best = self.paths.best_dir
        card = self.card_file(
            self.paths.output_dir,
            best_step,
            read_evaluation(best),
            f"the final model of its run, a copy of best_model (step {best_step})",
        )
        return self.saver.publish(best, self.paths.output_dir, {**summary, **card})

    def copy_best_as_last(self, summary: dict, step: int) -> bool:
        """last_model/ as a copy of best_model, when best_model holds the last step's weights: the same
        folder (its fitted settings included) as an export would write, at a file copy's cost."""
        card = self.card_file(
            self.paths.last_dir,
            step,
            read_evaluation(self.paths.best_dir),
            f"the last weights of its run (step {step}), the same as best_model",
        )
        return self.saver.publish(self.paths.best_dir, self.paths.last_dir, {**summary, **card}, final=False)


def read_evaluation(folder: Path) -> dict | None:
    """A model folder's eval.json without its per-clip figures (None when it has none)."""
    path = folder / "eval.json"
    if not path.is_file():
        return None
    evaluation = json.loads(path.read_text(encoding="utf-8"))
    evaluation.pop("per_clip", None)
    return evaluation
