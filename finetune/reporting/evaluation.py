"""Evaluation on held-out clips: synthesise each clip's text and compare it with its recording (what it returns,
each clip's scores and their summary, is in finetune/reporting/scores.py).

Per clip (finetune/reporting/measures.py says how each is computed and why):
    MCD-DTW          spectral distance to the recording, dB (lower is better)
    length ratio     how long the model speaks the text over how long the recording is (1 = its tempo):
                     the typical single draw, the median over DURATION_DRAWS noise draws of the duration
                     predictor. A listener hears one draw a sentence (the stock pipeline makes one), and a
                     sentence's length is a sum of exponentials, skewed long: the mean over draws judged a
                     length no listener typically hears (1.22 against a median draw of 0.82 on one short
                     training's kept model; bench/RESULTS.md)
    draw spread      how much that length varies from one draw to the next: the geometric standard
                     deviation of its draws (x1.00: every draw the same length)
    duration error   how much of the recording's rhythm the predicted durations misplace (0 = none)
    naturalness      DNSMOS OVRL of the synthesised clip, 1..5, when the optional extra is installed
                     (finetune/reporting/naturalness.py); reported, not part of the choice of best_model
Per evaluation: the mean MCD and its standard error over clips (the evaluation's own noise: the choice of
best_model compares models beyond it, finetune/training/selection.py), the median length ratio of all
draws of all clips (what a listener typically hears) and the median draw spread (a property of the voice),
the mean duration error, the mean naturalness, the objective's own losses (mel, KL, duration) on the same
clips, and whether the model may become the best one: only when its median length ratio passes the
timing rule, and never when every clip came out held at one level or pinned at full scale (the voice says
nothing: a collapsed generator; not even as the fallback nearest the timing rule). It
judges speech synthesised from text, duration predictor included, not just how well the training loss is
minimised.

Synthesis is bounded (finetune/vits/inference.py): each clip at most MAX_LENGTH_VS_RECORDING times its
recording, so a broken model is scored, as broken, in about the time a good one takes; its length ratio
is still the full length it asked for. Synthesis is seeded and runs inside a forked RNG, so successive
evaluations are comparable and the training's random state is left as it was. A stop request (Ctrl-C,
SIGTERM) is honoured between groups of clips and between test sentences.

An evaluation may be given a time limit (finetune/system/time_limit.py): before each group of clips and
each test sentence it asks whether one more, at the slowest so far (or the last evaluation's), still
ends in time; if not, it stops there. A cut-short evaluation is scored on the clips done, says so
(`cut_short`, `clips_scored` of `clips_planned`); it is judged by the timing rule on those clips, and the
choice of the best model compares it clip by clip only (finetune/training/selection.py: a mean over fewer
clips is not comparable with one over all of them). One that scored no clip at all was skipped.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from finetune.data.audio import write_pcm16
from finetune.data.examples import Example, collate
from finetune.data.features import Features
from finetune.reporting.measures import (
    TimingRule,
    duration_error,
    focus_frames,
    focus_over_sentence,
    frame_distances,
    length_ratio,
    mcd_across_speakers,
    mcd_dtw,
    warped_references,
)
from finetune.reporting.scores import (  # noqa: F401  (the results an evaluation returns, imported from here too)
    FLAT_STEP,
    PINNED_LEVEL,
    SAYS_NOTHING_SHARE,
    ClipScore,
    EvalResult,
    all_say_nothing,
    describe_cut,
    describe_judges,
    describe_timing,
    judge,
    mean_of,
    median_draw_spread,
    says_nothing,
    standard_error,
    typical_length_ratio,
)
from finetune.system.disk import OPTIONAL, is_write_failure
from finetune.system.interrupt import StopRequest
from finetune.system.time_limit import PieceCosts, TimeLimit
from finetune.vits.inference import ceiling_for_text, duration_draws, fork_rng, speak
from finetune.vits.losses import LossWeights
from finetune.vits.objective import generator_forward, generator_losses, real_segments
from finetune.vits.tempo_fit import geometric_spread

LOG = logging.getLogger(__name__)  # a child of the run's "finetune" logger

MAX_LENGTH_VS_RECORDING = 3.0  # evaluation renders at most 3x the recording: far too long already scores badly
TEST_SENTENCE_MAX_S = 30.0
DURATION_DRAWS = 8  # noise draws of the duration predictor per clip: its typical length and its spread
DRAW_SEED_OFFSET = 104_729  # the duration draws' seed, apart from the synthesis's
TEMPO_SEED_OFFSET = 7_919  # the tempo fit's draws, apart from the evaluation's
SYNTHESIS_DRAW_STRIDE = 10_007  # a clip's further synthesis draws (synthesis_draws), apart from its first


class Evaluator:
    """Scores a model on held-out examples and writes test-sentence WAVs to samples_dir/step_NNNNNN/."""

    compares_cut_short = True  # one cut short takes part in the choice of best_model, clip by clip (selection.py)
    choice_in_db = True  # its choice_scores are each clip's MCD

    @staticmethod
    def describe(result: EvalResult) -> str:
        natural = f", naturalness {result.naturalness:.2f}" if result.naturalness is not None else ""
        others = "".join(
            f"; {name}: MCD {o['mcd_db']:.2f}, length x{o['length_ratio']:.2f}" for name, o in result.others.items()
        )
        noise = f" ±{result.mcd_se_db:.3f}" if np.isfinite(result.mcd_se_db) else ""  # one standard error
        return (
            f"MCD {result.mcd_db:.3f}{noise} dB{natural}{describe_judges(result)}, {describe_timing(result)}"
            f"{describe_cut(result)}{others}"
        )

    def __init__(
        self,
        examples: list[Example],
        features: Features,
        device: torch.device,
        sample_rate: int,
        samples_dir: Path | None = None,
        test_sentences: list[tuple[str, np.ndarray]] = (),
        seed: int = 0,
        batch_size: int = 8,
        segment_frames: int = 32,
        rule: TimingRule | None = TimingRule(),
        duration_draws: int = DURATION_DRAWS,
        naturalness=None,
        speaker: int | None = None,
        others: dict[str, "Evaluator"] | None = None,
        across_speakers: bool = False,
        focus: dict[str, np.ndarray] | None = None,
        judges=None,
        synthesis_draws: int = 1,
    ):
        self.examples, self.features, self.device = examples, features, device
        # Draws of the synthesis a clip is scored on, its distances averaged: more where few clips decide (a
        # round's held-out corrections), whose one draw's noise would hide the change they are there to see.
        self.synthesis_draws = max(1, synthesis_draws)
        self.judges = judges  # a finetune.reporting.judges.Panel scoring each clip, or None (off)
        self.speaker = speaker  # whose voice a speaker-conditioned model speaks in (None: a plain model)
        # The recordings are other people's (corrections): the MCD compares them as another speaker's
        # (finetune/reporting/measures.py, mcd_across_speakers); their normalised, warped cepstra are kept
        # per clip, made on first use.
        self.across_speakers = across_speakers
        # With `focus` (across speakers only): clip id -> [tokens] bool, the tokens a correction round is about;
        # each clip's distance on the frames that speak them (its whole sentence where it has none of them).
        self.focus = focus
        self.references: dict[str, list[np.ndarray]] = {}
        # Other speakers of a crowd, each scored on a few of its held-out clips in its own voice after the
        # target's: reported beside the target's score, never part of choosing best_model.
        self.others = others or {}
        self.sample_rate, self.samples_dir, self.test_sentences = sample_rate, samples_dir, test_sentences
        self.seed, self.batch_size, self.segment_frames, self.rule = seed, batch_size, segment_frames, rule
        self.duration_draws = duration_draws  # noise draws per clip for its expected length
        self.naturalness = naturalness  # a finetune.reporting.naturalness.Naturalness, or None (off)
        self.example_mels: tuple[str, np.ndarray, np.ndarray] | None = None  # (clip id, synthesised, recorded) log-mels
        # Seconds of the slowest group of clips and test sentence of the latest evaluation: the first
        # estimate of the next one's (a resumed run sets them from its checkpoint).
        self.group_s: float | None = None
        self.sentence_s: float | None = None

    def evaluate(self, model, step: int, stop: StopRequest | None = None, limit: TimeLimit | None = None) -> EvalResult:
        """Eval mode for the duration of the call; the caller restores training mode. A stop request
        raises StopRequested between groups of clips and between test sentences; `limit` cuts it short
        (the clips done are scored; no test sentence is written when no clip was)."""
        limit = limit or TimeLimit.none()
        started = limit.now()
        model.eval()
        scores, losses, cut = self.in_smaller_groups_on_oom(lambda: self.score_clips(model, stop, limit))
        samples, sentences_cut = [], False
        if scores:
            try:
                samples, sentences_cut = self.write_samples(model, step, stop, limit)
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                LOG.warning(f"test sentences not written at step {step}: out of GPU memory (shorten --test_sentences)")
        result = judge(step, scores, losses, limit.now() - started, self.rule, planned=len(self.examples))
        result.voting = tuple(self.judges.voting) if self.judges else ()
        result.samples = samples
        result.sentences_planned = len(self.test_sentences) if self.samples_dir is not None else 0
        result.cut_short = "the deadline" if cut or sentences_cut or (self.examples and not scores) else ""
        for name, other in self.others.items() if scores and not result.cut_short else ():
            other.group_s = other.group_s or self.group_s  # its first group is timed like the target's
            scored = other.evaluate(model, step, stop, limit)
            if not scored.cut_short:
                result.others[name] = {
                    "mcd_db": round(scored.mcd_db, 4),
                    "length_ratio": round(scored.length_ratio, 4),
                    "clips": scored.clips_scored,
                }
        return result

    def fit_tempo(self, model):
        """The inference settings that make `model` speak these held-out clips at their recordings' tempo
        (finetune/vits/tempo_fit.py), or None without clips. Each module's train/eval mode is left as it was."""
        from finetune.vits.tempo_fit import fit_tempo

        hop = self.features.config.hop_length
        modes = {module: module.training for module in model.modules()}
        model.eval()
        try:
            return fit_tempo(
                model,
                [e.token_ids for e in self.examples],
                [e.frame_count(hop) for e in self.examples],
                self.device,
                self.seed + TEMPO_SEED_OFFSET,
                speaker=self.speaker,
                draws=self.duration_draws,
            )
        finally:
            for module, training in modes.items():
                module.training = training

    def in_smaller_groups_on_oom(self, work):
        """`work()`, again with half as many clips a group each time it runs out of GPU memory (down to one).
        The size is kept for the rest of the run, and saved with its checkpoints (a resumed process starts
        at it, not at the size that did not fit)."""
        while True:
            try:
                return work()
            except torch.OutOfMemoryError:  # torch.cuda.OutOfMemoryError is this type
                if self.batch_size == 1:
                    raise
            if torch.cuda.is_available():
                torch.cuda.empty_cache()  # out of the except block: the failed group's tensors are gone
            self.batch_size //= 2
            self.group_s = None  # a group of another size: its cost is unknown again
            LOG.warning(f"evaluation ran out of GPU memory: scoring {self.batch_size} clips at a time from now on")

    def pay_one_time_costs(self, stop: StopRequest | None = None) -> None:
        """Pay now what a process's first evaluation would pay once, so that the evaluation measured for the plan
        costs what every later one will: the distance's DTW, which numba compiles on first use (25 s on a
        2-core machine in a fresh environment, whose cache later runs load in 2-3 s), and, across speakers,
        each recording's references (made once per clip; a stop request is honoured between clips)."""
        for example in self.examples if self.across_speakers else ():
            if stop is not None:
                stop.check()
            self.references_of(example)
        if self.examples:  # a recording against itself: the same arrays' DTW as every clip's
            real = self.recorded_mel(self.examples[0])[0].cpu().numpy()
            self.distance(self.examples[0], real, real)

    def measure_costs_now(self, model, limit: TimeLimit) -> None:
        """Score the first held-out clip (group) twice and synthesise the first test sentence twice, results
        discarded: the first time pays what a process's first evaluation pays once (librosa's import, its
        DTW's compilation, first allocations), the second measures what a clip costs here and now
        (`group_s`, never lowered below the prior). A resumed process does this before its first
        evaluation is limited by such estimates. Bounded like an evaluation: each repeat only when it ends
        inside `limit` (on the run's clock), and a group that runs out of GPU memory is made smaller. The
        caller restores training mode."""
        model.eval()
        if self.examples:

            def score_first_group() -> float:
                started = limit.now()
                group = self.examples[: self.batch_size]
                _, aligned = self.validation_losses(
                    model, collate(group, self.features.config.hop_length).to(self.device), 0
                )
                self.score_group(model, group, aligned, 0)
                return limit.now() - started

            self.repeat_twice_within(lambda: self.in_smaller_groups_on_oom(score_first_group), limit, "group_s")
        if self.samples_dir is not None and self.test_sentences:
            ids = self.test_sentences[0][1]

            def say_first_sentence() -> float:
                started = limit.now()
                speak(
                    model,
                    [ids],
                    self.device,
                    self.seed,
                    [min(TEST_SENTENCE_MAX_S, ceiling_for_text(len(ids)))],
                    speaker=self.speaker,
                )
                return limit.now() - started

            self.repeat_twice_within(say_first_sentence, limit, "sentence_s")

    def repeat_twice_within(self, piece, limit: TimeLimit, estimate: str) -> None:
        """`piece()` (which returns its seconds) once, and again when that much time is left: the second is
        the estimate kept in `estimate` (the first, when it was the only one), never lowered."""
        costs = PieceCosts(prior_s=getattr(self, estimate))
        for _ in range(2):
            if not costs.next_fits(limit):
                break
            costs.add(piece())
        if costs.seen:
            setattr(self, estimate, max(getattr(self, estimate) or 0.0, costs.seen[-1]))

    def cost_estimates(self) -> tuple[float, float, int]:
        """(seconds of the slowest group of clips, of a test sentence, the group size that fits): what a
        checkpoint keeps so that a resumed process limits its first evaluation from its first clip on."""
        return self.group_s or 0.0, self.sentence_s or 0.0, self.batch_size

    def restore_cost_estimates(self, group_s: float, sentence_s: float, batch_size: int) -> None:
        """What cost_estimates gave, in a resumed process (0: not known; a batch size only ever shrinks: the
        one that ran out of memory stays out)."""
        self.group_s = group_s or self.group_s
        self.sentence_s = sentence_s or self.sentence_s
        if batch_size:
            self.batch_size = min(self.batch_size, batch_size)

    def expected_s(self) -> float:
        """What a whole evaluation should cost at the latest estimates (0 when none is known yet)."""
        groups = -(-len(self.examples) // self.batch_size)
        sentences = len(self.test_sentences) if self.samples_dir is not None else 0
        others = sum(
            -(-len(o.examples) // o.batch_size) * (o.group_s or self.group_s or 0.0) for o in self.others.values()
        )
        return groups * (self.group_s or 0.0) + sentences * (self.sentence_s or 0.0) + others

    def score_clips(
        self, model, stop: StopRequest | None = None, limit: TimeLimit | None = None
    ) -> tuple[dict[str, ClipScore], dict[str, float], bool]:
        """Per-clip scores and the mean validation losses of the clips scored, and whether `limit` cut
        the clips short (a group runs only when, at the slowest group so far, it ends in time)."""
        limit = limit or TimeLimit.none()
        scores: dict[str, ClipScore] = {}
        totals: dict[str, float] = {}
        hop = self.features.config.hop_length
        groups, cut = PieceCosts(prior_s=self.group_s), False
        for start in range(0, len(self.examples), self.batch_size):
            if stop is not None:
                stop.check()
            if not groups.next_fits(limit):
                cut = True
                break
            group_started = limit.now()
            group = self.examples[start : start + self.batch_size]
            losses, aligned = self.validation_losses(model, collate(group, hop).to(self.device), start)
            scores.update(self.score_group(model, group, aligned, start))
            for name, value in losses.items():
                totals[name] = totals.get(name, 0.0) + value * len(group)
            groups.add(limit.now() - group_started)
            self.group_s = max(groups.seen)  # as it goes: a stop mid-evaluation still leaves the estimate
        return scores, {k: v / max(1, len(scores)) for k, v in totals.items()}, cut

    def score_group(
        self, model, group: list[Example], aligned: list[np.ndarray], seed_offset: int
    ) -> dict[str, ClipScore]:
        """Synthesise a group of clips from their text (each capped at MAX_LENGTH_VS_RECORDING times its
        recording) and score each against its recording: its distances the mean over `synthesis_draws` draws
        (the first draw's speech for everything else)."""
        hop = self.features.config.hop_length
        ceilings = [MAX_LENGTH_VS_RECORDING * len(e.audio) / self.sample_rate for e in group]
        tokens = [e.token_ids for e in group]
        speak_draw = lambda draw: speak(  # noqa: E731
            model,
            tokens,
            self.device,
            self.seed + seed_offset + draw * SYNTHESIS_DRAW_STRIDE,
            ceilings,
            speaker=self.speaker,
        )
        speech = speak_draw(0)
        draws = duration_draws(
            model,
            tokens,
            self.device,
            self.seed + seed_offset + DRAW_SEED_OFFSET,
            self.duration_draws,
            speaker=self.speaker,
        )
        distances = [[self.distances(e, speech.waveforms[i], speech.token_frames[i])] for i, e in enumerate(group)]
        for draw in range(1, self.synthesis_draws):
            again = speak_draw(draw)
            for i, example in enumerate(group):
                distances[i].append(self.distances(example, again.waveforms[i], again.token_frames[i]))
        scores = {}
        for i, example in enumerate(group):
            if seed_offset == 0 and i == 0:  # the first clip, kept for pictures (TensorBoard, the run report)
                synthesised = self.mel_of(speech.waveforms[i])[0].cpu().numpy()
                self.example_mels = (example.item_id, synthesised, self.recorded_mel(example)[0].cpu().numpy())
            ratios = tuple(length_ratio(frames, example.frame_count(hop)) for frames in draws[i])
            mcd, relative = (mean_of([d[k] for d in distances[i]]) for k in (0, 1))
            scores[example.item_id] = ClipScore(
                mcd_db=mcd,
                length_ratio=float(np.median(ratios)),
                duration_error=duration_error(speech.token_frames[i], aligned[i]),
                capped=speech.capped[i],
                length_draws=ratios,
                draw_spread=geometric_spread(ratios),
                says_nothing=says_nothing(speech.waveforms[i]),
                naturalness=self.naturalness.overall(speech.waveforms[i], self.sample_rate)
                if self.naturalness
                else None,
                judged=self.judges.score(
                    speech.waveforms[i], self.sample_rate, example.item_id, example.audio / 32768.0
                )
                if self.judges
                else {},
                focus_relative=relative,
            )
        return scores

    def distances(self, example: Example, waveform: np.ndarray, token_frames: np.ndarray) -> tuple[float, float | None]:
        """One draw of a clip against its recording: (its MCD, its focus frames over the sentence's median frame
        or None: `distance`, focus_over_sentence)."""
        synthesised = self.mel_of(waveform)[0].cpu().numpy()
        mcd = self.distance(example, synthesised, self.recorded_mel(example)[0].cpu().numpy(), token_frames)
        mask = self.focus.get(example.item_id) if self.across_speakers and self.focus else None
        if mask is None or not np.isfinite(synthesised).all():
            return mcd, None
        per_frame = frame_distances(synthesised, self.references_of(example))
        relative = focus_over_sentence(per_frame, np.repeat(np.asarray(mask, dtype=bool), token_frames))
        return mcd, relative if np.isfinite(relative) else None

    def distance(
        self, example: Example, synthesised: np.ndarray, real: np.ndarray, token_frames: np.ndarray | None = None
    ) -> float:
        """MCD-DTW between a clip's synthesised and recorded log-mels [n_mels, frames]: plain, or across
        speakers (the recording as another speaker's) when the evaluator was made for that, on the focus
        tokens' frames when it has focus tokens (`token_frames`: the frames each token was rendered)."""
        if not self.across_speakers:
            return mcd_dtw(synthesised, real)
        mask = self.focus.get(example.item_id) if self.focus and token_frames is not None else None
        focus = focus_frames(mask, token_frames, synthesised.shape[1]) if mask is not None else None
        return mcd_across_speakers(synthesised, self.references_of(example), focus)

    def references_of(self, example: Example) -> list[np.ndarray]:
        """A recording's normalised cepstra at each frequency warp (across speakers), made on first use."""
        if example.item_id not in self.references:
            self.references[example.item_id] = warped_references(
                example.audio / 32768.0, self.sample_rate, lambda audio: self.mel_of(audio)[0].cpu().numpy()
            )
        return self.references[example.item_id]

    def recorded_mel(self, example: Example) -> torch.Tensor:
        """A held-out clip's recording as a log-mel [1, n_mels, frames] on the device."""
        return self.mel_of(example.audio / 32768.0)

    def mel_of(self, audio: np.ndarray) -> torch.Tensor:
        """Audio [samples] in [-1, 1] as a log-mel [1, n_mels, frames] (float32) on the device."""
        return self.features.mel(torch.from_numpy(audio).float().unsqueeze(0).to(self.device))

    @torch.no_grad()
    def validation_losses(self, model, batch, seed_offset: int) -> tuple[dict[str, float], list[np.ndarray]]:
        """The objective's mel, KL and duration losses on a held-out batch (no discriminator terms), and
        each clip's frames per token from the alignment search."""
        with fork_rng(self.device):
            torch.manual_seed(self.seed + seed_offset)
            out = generator_forward(model, batch, self.features, self.segment_frames)
            _, mel_real = real_segments(batch, self.features, out.segment_starts, self.segment_frames)
            mel_generated = self.features.mel(out.audio.squeeze(1))
            terms = generator_losses(out, mel_real, mel_generated, None, None, None, LossWeights())
        durations = out.durations[:, 0].long().cpu().numpy()  # [batch, tokens]
        aligned = [durations[i, : int(n)] for i, n in enumerate(batch.text_lengths)]
        return {"mel": terms.mel.item(), "kl": terms.kl.item(), "duration": terms.duration.item()}, aligned

    def write_samples(
        self, model, step: int, stop: StopRequest | None = None, limit: TimeLimit | None = None
    ) -> tuple[list[str], bool]:
        """The test sentences as WAVs, one at a time, and whether `limit` left some out (a stop request
        raises StopRequested between two)."""
        if self.samples_dir is None or not self.test_sentences:
            return [], False
        limit = limit or TimeLimit.none()
        folder = self.samples_dir / f"step_{step:06d}"
        costs, paths = PieceCosts(prior_s=self.sentence_s), []
        for name, ids in self.test_sentences:
            if stop is not None:
                stop.check()
            if not costs.next_fits(limit):
                break
            started = limit.now()
            speech = speak(
                model,
                [ids],
                self.device,
                self.seed,
                [min(TEST_SENTENCE_MAX_S, ceiling_for_text(len(ids)))],
                speaker=self.speaker,
            )
            path = folder / f"{name}.wav"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                write_pcm16(path, speech.waveforms[0], self.sample_rate)
            except Exception as error:  # soundfile's LibsndfileError on a full disk; anything else surfaces
                if not is_write_failure(error):
                    raise
                OPTIONAL.failed("test-sentence samples", folder, error, LOG.warning)
                break
            paths.append(str(path))
            costs.add(limit.now() - started)
            self.sentence_s = max(costs.seen)
        return paths, len(paths) < len(self.test_sentences)
