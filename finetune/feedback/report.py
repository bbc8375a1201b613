"""A round's readable report (summary_text)."""

from __future__ import annotations

from pathlib import Path

from finetune.feedback.decision import Decision
from finetune.feedback.round_evaluator import change_pct, judge_keys


def judged_change(decision: Decision, label: str) -> str:
    """`; judges: speaker 0.812 -> 0.809, phonetic 2.31 -> 1.95` for one part of the round's figures."""
    pairs = [
        f"{name} {decision.before[key]:.3f} -> {decision.after[key]:.3f}"
        for name, key in judge_keys(decision.before, label).items()
        if key in decision.after
    ]
    return f"; judges: {', '.join(pairs)}" if pairs else ""


def judges_line(panel) -> str:
    """Which judges voted in the round and why the others did not (a judges.Panel; "" without one)."""
    if panel is None:
        return ""
    parts = [
        f"{name} voted" if name in panel.voting else f"{name} only reported ({panel.why_not(name)})"
        for name in panel.judges
    ]
    return "Judges: " + "; ".join(parts) + "."


def judges_record(panel) -> dict:
    """name -> {"votes", "why"} of the round's judges (feedback_report.json)."""
    if panel is None:
        return {}
    return {name: {"votes": name in panel.voting, "why": panel.why_not(name)} for name in panel.judges}


def summary_text(
    round_name: str,
    decision: Decision,
    version: str | None,
    counts: dict,
    listen_dir: Path,
    dropped: list[dict],
    undo_flags: str = "",
    words: list[str] = (),
    focus: str = "",
    judges: str = "",
    checked: str = "",
) -> str:
    """The readable report of a round; `undo_flags` are what the undo command needs besides --rollback
    (the versions folder when it is not the default); `words`: a line a correction, the words the voice said
    differently from the recording before and after (finetune/feedback/differences.py); `focus`: what the
    corrections correct, in words."""
    head = (
        f"Feedback {round_name}: "
        + (f"ACCEPTED as {version}" if decision.accepted else "REJECTED")
        + f" ({decision.reason})"
    )
    lines = [head, ""]
    if focus:
        lines.append(f"The corrections correct {focus}.")

    def row(label: str, key: str, count: int, tolerance: str = "", part: str = "") -> str:
        before, after = decision.before[key], decision.after[key]
        unscored = int(decision.after.get(f"cut_short_{part}", 0))
        cut = f"; after: {count - unscored} of them, the deadline cut the rest" if unscored else ""
        ratio = key.replace("_mcd_db", "_focus_ratio")  # the focus frames over the rest, where they decide
        focus = (
            f"; the focus x{decision.before[ratio]:.3f} -> x{decision.after[ratio]:.3f} the rest"
            if ratio in decision.before and ratio in decision.after
            else ""
        )
        return (
            f"{label} ({count} clips{cut}): MCD {before:.3f} -> {after:.3f} dB "
            f"({change_pct(before, after):+.1f}%{tolerance}){focus}"
        )

    if "held_out_mcd_db" in decision.before and "held_out_mcd_db" in decision.after:
        lines.append(
            row("Corrections held out of the training, as the voice says them", "held_out_mcd_db", counts["held_out"])
            + judged_change(decision, "held_out")
        )
    trained = counts["corrections"] - counts.get("held_out", 0)
    lines.append(
        row("Corrections it trained on, as the voice says them", "corrections_mcd_db", trained, part="said")
        + judged_change(decision, "corrections")
    )
    if "corrections_learnt_mcd_db" in decision.before and "corrections_learnt_mcd_db" in decision.after:
        lines.append(
            row(
                "Corrections, in their own speaker id (how well they were learnt)",
                "corrections_learnt_mcd_db",
                counts["corrections"],
                part="learnt",
            )
        )
    lines.append(
        row("The voice's held-out originals", "originals_mcd_db", counts["originals"])
        + f"; length x{decision.after.get('originals_length_ratio', float('nan')):.2f} of the recordings"
        + judged_change(decision, "originals")
    )
    if decision.measure:
        lines.append(f"Decided by {decision.measure}: {decision.improvement}.")
    if decision.voice:
        lines.append(f"Checked: {decision.voice}.")
    if decision.identity:
        lines.append(f"Identity checked by {decision.identity}.")
    if judges:
        lines.append(judges)
    if checked:
        lines.append(checked)
    lines.append(
        f"Candidate: the model at step {decision.candidate_step}. Trained on {trained} corrections "
        f"+ {counts['replay']} replayed original clips"
        + (f"; {counts['held_out']} corrections held out to decide on." if counts.get("held_out") else ".")
    )
    if dropped:
        lines.append(
            f"Corrections not used ({len(dropped)}): "
            + "; ".join(f"{d['id']}: {d['reason']} ({d['detail']})" for d in dropped[:10])
        )
    if words:
        lines += ["", "What the voice said differently from each recording (before -> after):", *words, ""]
    lines.append(f"Listen: {listen_dir}/ (for each correction: _0_recording, _1_before, _2_after; listen.html)")
    if decision.accepted:
        lines.append(f"Undo: python train_feedback.py {undo_flags + ' ' if undo_flags else ''}--rollback previous")
    return "\n".join(lines) + "\n"
