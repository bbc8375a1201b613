"""The judges (finetune/reporting/judges.py) on real recordings of the bundled demo crowd, and the rule that lets
one vote: a judge that ranks a ladder wrongly is kept from voting. The speaker and phonetic judges run on the
packaged weights of their optional extra (requirements-judges.txt, which `make test` installs); without it
those tests are skipped, as evaluation goes on without the judges."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import soundfile as sf

from finetune.reporting import content_judges, judge_audio, judge_ladders, judges
from tests.conftest import DEMO_CORPUS


def crowd_clips(speaker: str, count: int) -> list[tuple[str, np.ndarray, int]]:
    """(id, audio, rate) of the first `count` demo clips `speaker` read (22.05 kHz MP3s)."""
    with open(DEMO_CORPUS / "validated.tsv", encoding="utf-8") as listing:
        rows = [row for row in csv.DictReader(listing, delimiter="\t") if row["client_id"] == speaker][:count]
    return [(row["path"], *sf.read(DEMO_CORPUS / row["path"], dtype="float32")) for row in rows]


def test_kendall_tau_and_the_voting_rule():
    assert judge_ladders.kendall_tau([1.0, 2.0, 3.0, 4.0]) == 1.0
    assert judge_ladders.kendall_tau([4.0, 3.0, 2.0, 1.0]) == -1.0
    assert judge_ladders.kendall_tau([1.0, 3.0, 2.0, 4.0]) == pytest.approx(
        2 / 3
    )  # one swap of four: not enough to vote
    ladders = {"a": {"kendall_tau": 1.0, "means": [1.0, 2.0, 3.0]}, "b": {"kendall_tau": 0.8, "means": [5.0, 4.0]}}
    assert judge_ladders.votes(ladders, retest_sd=0.4)  # below half the smallest gap between rungs (1.0)
    assert not judge_ladders.votes(
        ladders, retest_sd=0.6
    )  # the same model drawn twice as far apart as two rungs: no vote
    assert not judge_ladders.votes(ladders, retest_sd=float("nan"))  # its noise unknown: reported only
    assert not judge_ladders.votes({**ladders, "c": {"kendall_tau": 2 / 3, "means": [0.0, 9.0]}}, retest_sd=0.1)
    assert not judge_ladders.votes({}, retest_sd=0.1)  # no ladder ranked: no vote


class LoudnessJudge:
    """A planted judge that hears only loudness (higher RMS 'nearer'): added noise makes clips louder, so it
    ranks the noise ladder backwards."""

    name, kind, higher_is_better = "loudness", "naturalness", True

    def score(self, waveform, sample_rate, **_):
        return float(np.sqrt(np.mean(np.square(waveform))))


class NoiseJudge(LoudnessJudge):
    """A planted judge that ranks by how little the clip differs from its recording: right on that ladder."""

    def score(self, waveform, sample_rate, reference=None, **_):
        return -float(np.mean(np.square(waveform - reference[0])))


def test_a_judge_that_ranks_a_ladder_wrongly_is_kept_from_voting(tmp_path):
    from finetune.reporting.judge_ladders import Ladder, Rung, as_recorded, rank_ladder, with_noise

    clips = [(item, "", audio, rate) for item, audio, rate in crowd_clips("ciya", 3)]
    rungs = [Rung(f"SNR {snr}", as_recorded(clips, with_noise(snr, 0))) for snr in (0, 10, 20)]
    ladder = Ladder("noise", "noise", "ciya", [*rungs, Rung("as recorded", as_recorded(clips))])
    wrong, right = rank_ladder(LoudnessJudge(), ladder), rank_ladder(NoiseJudge(), ladder)
    assert wrong["kendall_tau"] == -1.0 and right["kendall_tau"] == 1.0 and wrong["clips"] == 3
    assert not judge_ladders.votes({"noise": wrong}, retest_sd=0.0)
    assert judge_ladders.votes({"noise": right}, retest_sd=0.1 * judge_ladders.smallest_gap(right["means"]))


@pytest.mark.skipif(not judges.available("speaker"), reason=f"the speaker judge's extra: {judges.INSTALL_HINT}")
def test_the_speaker_judge_hears_the_voice_and_not_another():
    """Each of ciya's recordings is nearer the centroid of ciya's others than any of axin's is."""
    judge = judges.SpeakerJudge()
    own = crowd_clips("ciya", 4)
    judge.set_voice({item: (audio, rate) for item, audio, rate in own})
    mine = [judge.score(audio, rate, item_id=item) for item, audio, rate in own]
    theirs = [judge.score(audio, rate) for _, audio, rate in crowd_clips("axin", 4)]
    assert min(mine) > max(theirs), (mine, theirs)
    assert all(-1.0 <= value <= 1.0 for value in mine + theirs)
    # What has no speech in it (webrtcvad hears none) is nobody's voice: 0, the least a real voice scored here.
    _, audio, rate = own[0]
    assert judge.score(np.zeros_like(audio), rate) == 0.0 < min(theirs)
    # Speech with silence around it scores as the speech alone does: the silence is not the voice's.
    padded = np.concatenate([np.zeros(rate, np.float32), audio, np.zeros(2 * rate, np.float32)])
    assert judge.score(padded, rate) == pytest.approx(judge.score(audio, rate), abs=0.03)
    # Sound that is not speech does count against it: as long a hiss (20 dB under the speech) before it, which
    # webrtcvad hears as no speech, halves its score, as a new model's hiss scores under a trained one's buzz.
    hiss = np.random.default_rng(0).standard_normal(len(audio)).astype(np.float32) * 0.1 * np.sqrt(np.mean(audio**2))
    assert judge.score(np.concatenate([hiss, audio]), rate) == pytest.approx(0.5 * judge.score(audio, rate), abs=0.05)
    with pytest.raises(judges.NoSpeech, match="no reference"):
        judges.SpeakerJudge().set_voice({"silent": (np.zeros(rate * 2, np.float32), rate)})


@pytest.mark.skipif(not judges.available("phonetic"), reason=f"the phonetic judge's extra: {judges.INSTALL_HINT}")
def test_the_phonetic_judge_hears_what_is_said_whoever_says_it():
    """A recording is nearest itself, then itself as a larger, slower speaker would say it (resampled 1.25x:
    pitch, formants and tempo moved), and far from another sentence; the phone error rate agrees."""
    import soxr

    judge = content_judges.PhoneticJudge()
    errors = content_judges.PhoneErrorJudge(judge.recogniser)
    (item, audio, rate), (_, other, other_rate) = crowd_clips("ciya", 2)
    slower = soxr.resample(audio, rate, rate * 1.25)  # played back at `rate`: 1.25x longer and lower
    same = judge.score(audio, rate, reference=(audio, rate), item_id=item)
    moved = judge.score(slower, rate, reference=(audio, rate), item_id=item)
    different = judge.score(other, other_rate, reference=(audio, rate), item_id=item)
    assert same < moved < different, (same, moved, different)
    assert errors.score(audio, rate, reference=(audio, rate), item_id=item) == 0.0
    assert errors.score(other, other_rate, reference=(audio, rate), item_id=item) > 0.5


def test_the_asr_judge_runs_any_transformers_ctc_model_from_a_folder(tmp_path):
    """--asr_model as a local folder (a tiny untrained Wav2Vec2 CTC model here; a user names MMS's): a character
    error rate against the clip's text, 0 for a transcript that matches."""
    from transformers import (
        Wav2Vec2Config,
        Wav2Vec2CTCTokenizer,
        Wav2Vec2FeatureExtractor,
        Wav2Vec2ForCTC,
        Wav2Vec2Processor,
    )

    vocab = {"<pad>": 0, "|": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate("abcdefghijklmnopqrstuvwxyz")}}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
    tokenizer = Wav2Vec2CTCTokenizer(str(tmp_path / "vocab.json"), word_delimiter_token="|")
    processor = Wav2Vec2Processor(Wav2Vec2FeatureExtractor(sampling_rate=16000), tokenizer)
    config = Wav2Vec2Config(
        vocab_size=len(vocab),
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        conv_dim=(16, 16),
        conv_stride=(5, 4),
        conv_kernel=(10, 8),
        num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2,
        pad_token_id=0,
    )
    Wav2Vec2ForCTC(config).save_pretrained(str(tmp_path / "asr"))
    processor.save_pretrained(str(tmp_path / "asr"))
    judge = judges.load_judges(["asr"], str(tmp_path / "asr"))["asr"]
    _, audio, rate = crowd_clips("ciya", 1)[0]
    said = judge.transcribe(audio, rate)
    assert judge.score(audio, rate, text=said) == 0.0
    assert judge.score(audio, rate, text=said + " abc") > 0.0
    assert content_judges.edit_distance(list("kitten"), list("sitting")) == 3


def test_judges_validated_on_the_users_voice_vote_in_their_runs(tmp_path):
    """--judges_validation: bench_judges.py's results.json from the user's own voice says which judges vote."""
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"judges": {"speaker": {"votes": True}, "phonetic": {"votes": False}}}))
    assert judges.validated_votes(str(results)) == {"speaker": True, "phonetic": False}
    panel = judges.Panel(
        {"speaker": LoudnessJudge(), "phonetic": NoiseJudge()}, votes=judges.validated_votes(str(results))
    )
    assert panel.voting == ["speaker"]
    assert judges.Panel({"speaker": LoudnessJudge()}).voting == []  # the built-in VOTES: none beside MCD
    from finetune.settings import TrainingFlags
    from finetune.system.errors import ConfigError

    with pytest.raises(ConfigError, match="--judges_validation .*: no such file"):
        TrainingFlags(judges_validation=str(tmp_path / "missing.json"))
    with pytest.raises(ConfigError, match="--judges asr needs --asr_model"):
        TrainingFlags(judges=["asr"])


@pytest.mark.skipif(not judges.available("speaker"), reason=f"the speaker judge's extra: {judges.INSTALL_HINT}")
def test_a_voice_whose_recordings_have_no_speech_runs_without_the_speaker_judge_and_says_so(caplog):
    """Held-out 'recordings' that are silence (a synthetic corpus, a broken export) give the speaker judge no
    reference: the run goes on without it, with a warning, instead of stopping at its first evaluation."""
    import logging
    from types import SimpleNamespace

    from finetune.recipes.shared import judges_panel
    from finetune.settings import TrainingFlags

    run = SimpleNamespace(logger=logging.getLogger("test_judges"), dist=SimpleNamespace(is_main=True))
    run.device = SimpleNamespace(type="cpu")
    silent = [SimpleNamespace(item_id=f"c{i}", audio=np.zeros(32000, np.int16)) for i in range(2)]
    flags = TrainingFlags(judges=["speaker"])
    with caplog.at_level(logging.INFO, logger="test_judges"):
        assert judges_panel(flags, run, silent, {}, 16000) is None
    assert "judges not measured: speaker (none of the voice's held-out recordings has speech" in caplog.text
    _, audio, rate = crowd_clips("ciya", 1)[0]
    import soxr

    spoken = [SimpleNamespace(item_id="c0", audio=(soxr.resample(audio, rate, 16000) * 32767).astype(np.int16))]
    panel = judges_panel(flags, run, spoken, {}, 16000)
    assert list(panel.judges) == ["speaker"]


@pytest.mark.skipif(not judges.available("phonetic"), reason=f"the phonetic judge's extra: {judges.INSTALL_HINT}")
def test_auto_asks_every_judge_the_validation_found_voting(tmp_path):
    """--judges auto with a --judges_validation in which the phone error rate votes (as on a voice trained
    24 minutes, bench/RESULTS.md): the run asks it too, and it votes; without the validation, on a CPU, none."""
    import logging
    from types import SimpleNamespace

    from finetune.recipes.shared import judges_panel
    from finetune.settings import TrainingFlags

    results = tmp_path / "results.json"
    votes = {"speaker": False, "phonetic": False, "phone_errors": True, "mcd": True}
    results.write_text(json.dumps({"judges": {name: {"votes": v} for name, v in votes.items()}}))
    run = SimpleNamespace(logger=logging.getLogger("test_judges"), dist=SimpleNamespace(is_main=True))
    run.device = SimpleNamespace(type="cpu")
    _, audio, rate = crowd_clips("ciya", 1)[0]
    assert judges_panel(TrainingFlags(), run, [], {}, rate) is None  # nothing votes: on a CPU, nothing asked
    panel = judges_panel(TrainingFlags(judges_validation=str(results)), run, [], {}, rate)
    assert list(panel.judges) == ["phone_errors"] and panel.voting == ["phone_errors"]


def test_a_clip_judged_again_is_not_run_through_the_model_again():
    """The memo behind the speaker encoder and the phoneme recogniser: the same audio (the recordings on every ladder
    bench_judges.py builds) is computed once; other audio, or the same at another rate, is computed; the oldest
    result goes when it is full, and what it keeps cannot be changed by a caller."""
    calls = []

    def compute(waveform, rate):
        calls.append(rate)
        return np.array([float(waveform.sum()), rate])

    memo = judge_audio.AudioMemo(size=2)
    a, b = np.ones(100, np.float32), np.zeros(100, np.float32)
    first = memo.get(a, 16000, compute)
    assert memo.get(a.copy(), 16000, compute) is first and len(calls) == 1
    memo.get(a, 22050, compute)
    memo.get(b, 16000, compute)  # full: a at 16 kHz, the oldest, goes
    memo.get(a, 16000, compute)
    assert len(calls) == 4
    with pytest.raises(ValueError):
        first[0] = 0.0
