"""report.html: a run on one page, readable offline in any browser, written at each evaluation and at
the end (atomically, beside metrics.jsonl).

It shows, from the run's own files: the loss terms, MCD and timing per evaluation (with the timing
rule's band), the learning rate, fp16's loss scale and skipped steps, the budget used against the plan,
where step time went, the latest generated-vs-recorded mel spectrogram, the best model's score per held-out clip, and players for the
test sentences of the latest and the best evaluation. Plots are PNG files in RUN_DIR/report/.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

from finetune.reporting.model_card import partial_clips
from finetune.reporting.plots import bars, curves
from finetune.system.atomic import write_text_atomic

LOSS_TERMS = ("mel", "kl", "duration", "adversarial", "feature_matching", "generator", "discriminator")


def read_metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a crash: the rest still tells the story
    return records


def _series(records: list[dict], kind: str, key: str) -> tuple[list, list]:
    points = [(r["step"], r[key]) for r in records if r.get("kind") == kind and r.get(key) is not None]
    return [p[0] for p in points], [p[1] for p in points]


def draw(run_dir: Path, records: list[dict], max_length_ratio: float) -> list[tuple[str, str]]:
    """The PNGs the page shows: (file name, caption)."""
    folder = run_dir / "report"
    folder.mkdir(exist_ok=True)
    made = []
    train = [r for r in records if r.get("kind") == "train"]
    if train:
        curves(
            folder / "losses.png",
            "Loss terms (before weighting)",
            "optimizer step",
            "loss",
            {t: _series(records, "train", t) for t in LOSS_TERMS if any(t in r for r in train)},
            log_y=True,
        )
        curves(
            folder / "learning_rate.png",
            "Learning rate",
            "optimizer step",
            "lr",
            {"generator": _series(records, "train", "lr")},
        )
        made += [("losses.png", "Loss terms"), ("learning_rate.png", "Learning rate")]
        made += _loss_scale(folder, records)
    if any(r.get("kind") == "eval" for r in records):
        evals = [r for r in records if r.get("kind") == "eval" and r.get("mcd_db") is not None]
        curves(
            folder / "mcd.png",
            "Held-out MCD-DTW (lower is better), with the evaluation's noise",
            "optimizer step",
            "dB",
            {"MCD": _series(records, "eval", "mcd_db")},
            errors={"MCD": [r.get("mcd_se_db", float("nan")) for r in evals]},
        )
        curves(
            folder / "timing.png",
            "Held-out timing: one request's median length ratio (synthesised / recorded)",
            "optimizer step",
            "ratio",
            {
                "length ratio": _series(records, "eval", "length_ratio"),
                "spread between requests (x)": _series(records, "eval", "draw_spread"),
                "duration error": _series(records, "eval", "duration_error"),
            },
            bands=[(1 / max_length_ratio, max_length_ratio, "timing rule")],
        )
        made += [("mcd.png", "MCD per evaluation"), ("timing.png", "Timing per evaluation")]
        if any(r.get("naturalness") is not None for r in records if r.get("kind") == "eval"):
            curves(
                folder / "naturalness.png",
                "Held-out naturalness: DNSMOS OVRL (higher is better)",
                "optimizer step",
                "MOS",
                {"DNSMOS OVRL": _series(records, "eval", "naturalness")},
            )
            made.append(("naturalness.png", "Naturalness per evaluation"))
        judged = sorted({name for r in evals for name in r.get("judges", {})})
        if judged:
            curves(
                folder / "judges.png",
                "Held-out judges (speaker: higher is nearer the voice; phonetic, phone errors, asr: lower is nearer "
                "what is said)",
                "optimizer step",
                "score",
                {
                    name: (
                        [r["step"] for r in evals if name in r.get("judges", {})],
                        [r["judges"][name] for r in evals if name in r.get("judges", {})],
                    )
                    for name in judged
                },
            )
            made.append(("judges.png", "Judges per evaluation (a star in the log: the judge votes)"))
    made += _budget(folder, records)
    end = next((r for r in reversed(records) if r.get("kind") == "end"), None)
    if end and end.get("profile_shares"):
        bars(
            folder / "profile.png",
            "Where step time went",
            {k.replace("_", " "): 100 * v for k, v in end["profile_shares"].items()},
            "% of step time",
        )
        made.append(("profile.png", "Step profile"))
    if (folder / "mel_latest.png").is_file():
        made.append(("mel_latest.png", "Latest evaluation: a held-out sentence, synthesised and recorded"))
    return made


def _loss_scale(folder: Path, records: list[dict]) -> list[tuple[str, str]]:
    """fp16 runs: the gradient scalers' scales (halved at each overflow, doubled after 2000 clean steps)."""
    scales = {name: _series(records, "train", f"loss_scale_{name}") for name in ("generator", "discriminator")}
    if not scales["generator"][0]:
        return []
    curves(
        folder / "loss_scale.png",
        "fp16 loss scale (halved when gradients overflow; that step is skipped)",
        "optimizer step",
        "scale",
        scales,
        log_y=True,
    )
    skipped = _series(records, "train", "fp16_overflow_skips")[1]
    return [
        (
            "loss_scale.png",
            f"fp16 loss scale; {int(skipped[-1]) if skipped else 0} steps skipped on overflow by the last logged step",
        )
    ]


def _budget(folder: Path, records: list[dict]) -> list[tuple[str, str]]:
    """Time used at each logged step, against what the last plan expected."""
    used = _series(records, "train", "time_used_s")
    plan = next((r for r in reversed(records) if r.get("kind") == "plan"), None)
    if not used[0]:
        return []
    series = {"used": used}
    if plan:
        steps = [plan["steps_done"], plan["total_steps"]]
        series["planned"] = (steps, [plan["time_used_s"], plan["time_used_s"] + (steps[1] - steps[0]) * plan["step_s"]])
        series["budget"] = (steps, [plan["budget_target_s"]] * 2)
    curves(folder / "budget.png", "Budget: seconds used at each step", "optimizer step", "s", series)
    return [("budget.png", "Budget used against the plan")]


def _audio(run_dir: Path, step: int | None, label: str) -> str:
    if step is None:
        return ""
    folder = run_dir / "samples" / f"step_{step:06d}"
    players = "".join(
        f'<figure><figcaption>{html.escape(p.stem)}</figcaption><audio controls src="{p.relative_to(run_dir)}">'
        "</audio></figure>"
        for p in sorted(folder.glob("*.wav"))
    )
    return f"<h3>{html.escape(label)} (step {step})</h3>{players}" if players else ""


def _clip_table(best_dir: Path) -> str:
    path = best_dir / "eval.json"
    if not path.is_file():
        return "<p>No best model yet.</p>"
    best = json.loads(path.read_text(encoding="utf-8"))
    why = f" Kept as {best['chosen_as']}." if best.get("chosen_as") else ""
    judged = sorted({name for s in best.get("per_clip", {}).values() for name in s.get("judged", {})})
    rows = "".join(
        f"<tr><td>{html.escape(name)}</td><td>{s['mcd_db']:.2f}</td><td>{s['length_ratio']:.2f}</td>"
        f"<td>{s['duration_error']:.2f}</td>"
        + "".join(f"<td>{s.get('judged', {}).get(j, float('nan')):.3f}</td>" for j in judged)
        + "</tr>"
        for name, s in best.get("per_clip", {}).items()
    )
    judge_heads = "".join(f"<th>{html.escape(j)} judge</th>" for j in judged)
    noise = f" ±{best['mcd_se_db']:.3f}" if best.get("mcd_se_db") is not None else ""
    spread = f" (x{best['draw_spread']:.2f} between requests)" if best.get("draw_spread") is not None else ""
    because = f" Decided: {best['chosen_because']}." if best.get("chosen_because") else ""
    clips = partial_clips(best) or f"its {len(best.get('per_clip', {}))} held-out clips"
    return (
        f"<p>Best model: step {best['step']}, MCD {best['mcd_db']:.3f}{noise} dB (± one standard error over "
        f"{html.escape(clips)}), length x{best['length_ratio']:.2f}{spread}"
        f"{_naturalness_text(best)}.{html.escape(why + because)}</p>{_tempo_fit(best)}"
        "<table><tr><th>held-out clip</th><th>MCD dB</th><th>length ratio</th><th>duration error</th>"
        f"{judge_heads}</tr>{rows}</table>"
    )


def _summary(end: dict) -> str:
    """The end record: a sentence for what matters most, then every other figure in a table."""
    best = (
        f"best MCD {end['best_mcd_db']:.3f} dB at step {end['best_step']}"
        if end.get("best_step", -1) >= 0
        else "no best model (no evaluation had a finite score, or every one said nothing)"
    )
    if end.get("best_step", -1) >= 0 and not end.get("best_within_timing_rule", True):
        best += " (a fallback: no evaluation met the timing rule; it is the one nearest to it)"
    sentence = (
        f"Finished ({end.get('stop_reason')}): {end.get('steps')} steps, {end.get('epochs')} epochs, "
        f"{end.get('time_used_s', 0):.1f} s of {end.get('budget_s', 0):.0f} s; {best}; last learning rate "
        f"{end.get('last_lr', 0):.2e}."
    )
    shown = {"kind", "stop_reason", "steps", "epochs", "time_used_s", "budget_s", "best_mcd_db", "best_step", "last_lr"}
    rows = "".join(
        f"<tr><td>{html.escape(key.replace('_', ' '))}</td><td>{html.escape(_figure(value))}</td></tr>"
        for key, value in end.items()
        if key not in shown and not isinstance(value, dict)
    )
    return f"<p>{html.escape(sentence)}</p><table>{rows}</table>"


def _tempo_fit(best: dict) -> str:
    """The inference settings fitted into the best model's config.json, and what they changed."""
    fit = best.get("inference_settings")
    if not fit:
        return ""
    own, before, after = fit["model_own"], fit["before"], fit["after"]
    return (
        f"<p>Its config.json speaks with speaking_rate {fit['speaking_rate']:g} and noise_scale_duration "
        f"{fit['noise_scale_duration']:g} (the model's own: {own['speaking_rate']:g}, {own['noise_scale_duration']:g}), "
        f"fitted on {fit['clips']} held-out recordings: one request's median length x{before['length_ratio']:.2f} -> "
        f"x{after['length_ratio']:.2f} the recordings', variation between requests x{before['draw_spread']:.2f} -> "
        f"x{after['draw_spread']:.2f} (after: on {html.escape(fit.get('after_measured_on', 'the clips it was fitted on'))})"
        f"{html.escape('; ' + fit['note'] if fit.get('note') else '')}.</p>"
    )


def _naturalness_text(best: dict) -> str:
    natural = f", naturalness (DNSMOS) {best['naturalness']:.2f}" if best.get("naturalness") is not None else ""
    judged = "".join(f", {name} judge {value:.3f}" for name, value in best.get("judges", {}).items())
    return natural + judged


def _figure(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _skipped(records: list[dict]) -> str:
    """The clips the run left out at loading (missing or damaged WAVs, texts too long), each named."""
    data = next((r for r in reversed(records) if r.get("kind") == "data"), None)
    if not data or not (data.get("skipped") or data.get("val_skipped")):
        return ""
    counts = {**data.get("skipped", {}), **{f"held-out: {k}": v for k, v in data.get("val_skipped", {}).items()}}
    items = "".join(
        f"<li>{html.escape(c)}</li>" for c in data.get("skipped_clips", []) + data.get("val_skipped_clips", [])
    )
    return (
        f"<h2>Clips left out at loading</h2><p>{html.escape(', '.join(f'{n} {r}' for r, n in counts.items()))}"
        f"</p><ul>{items}</ul>"
    )


def _licence(records: list[dict]) -> str:
    """The base model's licence, which the voice inherits (from the run's "licence" record)."""
    record = next((r for r in reversed(records) if r.get("kind") == "licence"), None)
    if record is None:
        return ""
    return (
        f"<p><b>Licence: {html.escape(record['licence'])}</b>. {html.escape(record['note'])}: the voice made in "
        f"this run, fine-tuned from {html.escape(record['base_model'])}, inherits it.</p>"
    )


def write_report(run_dir: Path, title: str, max_length_ratio: float = 1.25, best_dir: Path | None = None) -> Path:
    """Draw the plots and write RUN_DIR/report.html (the best model in `best_dir`, by default
    RUN_DIR/best_model); returns its path."""
    records = read_metrics(run_dir)
    figures = draw(run_dir, records, max_length_ratio)
    evals = [r for r in records if r.get("kind") == "eval"]
    best_step = next((r["step"] for r in reversed(evals) if r.get("best")), None)
    end = next((r for r in reversed(records) if r.get("kind") == "end"), None)
    summary = _summary(end) if end else "<p>Running (this page is rewritten at each evaluation).</p>"
    images = "".join(
        f'<figure><img src="report/{name}" alt="{html.escape(caption)}"><figcaption>'
        f"{html.escape(caption)}</figcaption></figure>"
        for name, caption in figures
    )
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;max-width:980px;margin:2em auto;color:#222}}img{{max-width:100%}}
figure{{margin:1em 0}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:2px 8px;text-align:right}}
td:first-child{{text-align:left}}</style></head><body>
<h1>{html.escape(title)}</h1>{summary}{_licence(records)}{_skipped(records)}
<h2>Figures</h2>{images}
<h2>Best model, per held-out clip</h2>{_clip_table(best_dir or run_dir / "best_model")}
<h2>Listen</h2>{_audio(run_dir, evals[-1]["step"] if evals else None, "Latest evaluation")}
{_audio(run_dir, best_step, "Best model") if best_step != (evals[-1]["step"] if evals else None) else ""}
</body></html>
"""
    path = run_dir / "report.html"
    write_text_atomic(path, page)
    return path
