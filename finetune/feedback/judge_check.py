"""The judges a round is asked for, validated on the round's own voice before they may vote: a user never runs
bench/bench_judges.py. Once a voice: what was found is kept beside it (finetune/reporting/judge_ladders.py's
CACHE) and read again by the next round from the same voice; bounded by a share of the round's budget. Without
it only judges.VOTES (none today) or --judges_validation's file say which judges vote."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from finetune.reporting import judge_ladders
from finetune.system.time_limit import TimeLimit
from finetune.vits import synthesis

SHARE = 0.15  # of the round's budget left, at most
MOST_S = 300.0


@dataclass
class VoiceValidation:
    """What shared.judges_panel asks: `known()`, the votes already found on this voice (free); calling it with
    the judges made, each validated (from what is kept, else found now), name -> {"votes", "why", ...}."""

    folder: Path  # the round's starting voice
    data_dir: Path  # its corpus: the held-out clips the ladders are made of
    speaker: str | None  # its speaker in a multi-speaker corpus
    run: object  # context.Run: its budget's clock, device, logger
    seed: int = 0
    clips: int = judge_ladders.CLIPS  # held-out clips of the voice on every rung

    def known(self) -> dict[str, bool]:
        return {name: bool(entry.get("votes")) for name, entry in judge_ladders.cached(self.folder).items()}

    def __call__(self, judges: dict) -> dict:
        kept = judge_ladders.cached(self.folder)
        missing = {name: judge for name, judge in judges.items() if name not in kept}
        if missing:
            clips = judge_ladders.held_out(self.data_dir, self.speaker, self.clips)
            clock = self.run.budget.clock
            seconds = min(MOST_S, SHARE * self.run.budget.left_s())
            self.run.logger.info(
                f"judges: {', '.join(missing)} validated on this voice before they may vote ({len(clips)} of its "
                f"held-out clips on ladders of known order; at most {seconds:.0f}s; once, kept in "
                f"{self.folder / judge_ladders.CACHE})"
            )
            started = clock.now()
            voice = synthesis.load_voice(self.folder, self.run.device)
            found = judge_ladders.validate_on_voice(
                voice, clips, missing, TimeLimit(clock.now, started + seconds), self.seed
            )
            complete = {name: entry for name, entry in found.items() if not entry.get("incomplete")}
            if complete:
                judge_ladders.keep(self.folder, complete, len(clips))
            self.run.logger.info(f"judges validated in {clock.now() - started:.1f}s")
            kept = {**kept, **found}
        return {name: kept[name] for name in judges if name in kept}
