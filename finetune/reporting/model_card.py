"""The model card (README.md) every exported voice folder carries: what it is, where it came from, its
licence, how well it did on held-out clips, its tempo, and how to load it (transformers' pipeline,
sherpa-onnx through export_onnx.py). The Hugging Face Hub shows it as the model's page; its YAML
header (language, license, base_model, pipeline_tag) is what the Hub indexes.

Where the facts come from (`card_facts`):
    base model   --model_name (a hub id, a folder, scratch:SIZE)
    language     an MMS hub id names it (facebook/mms-tts-kmr-script_latin -> kmr); a folder this tool
                 wrote carries it in its own card; else "unknown"
    licence      MMS checkpoints: CC-BY-NC 4.0 (no commercial use), whatever the fine-tune data is; a
                 folder this tool wrote: its card's; a scratch model: the recordings' own terms; else
                 unknown (the user must check the base model's)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

MMS_ID = re.compile(r"(?:^|/)mms-tts-(?P<language>[a-z]{3})(?:-script_[a-z]+)?$")
MMS_LICENCE = "cc-by-nc-4.0"


@dataclass(frozen=True)
class CardFacts:
    """What a card says about a voice's origin, fixed for a run."""

    base_model: str  # as the user named it
    hub_base_model: str  # the Hub id it descends from, for the card's header ("" when none is known)
    language: str  # ISO 639-3 code, or "unknown"
    licence: str  # a Hub licence id (cc-by-nc-4.0, other, unknown)
    licence_note: str  # one sentence for people
    data_hours: float  # hours of training audio
    data_clips: int
    script: str = "train_vits.py"  # what made it


def _front_matter(folder: Path) -> dict[str, str]:
    """The YAML header of a folder's README.md (this tool's cards: flat `key: value` lines only)."""
    card = folder / "README.md"
    if not card.is_file():
        return {}
    text = card.read_text(encoding="utf-8")
    if not text.startswith("---\n"):
        return {}
    header = text[4 : text.find("\n---", 4)]
    return {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in header.splitlines()) if _}


def _config_licence(folder: Path) -> dict[str, str]:
    """{"license": ...} from a model folder's config.json when it names one, else {}."""
    import json

    path = folder / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (OSError, ValueError):
        return {}
    licence = config.get("license") or config.get("licence")
    return {"license": str(licence)} if licence else {}


def card_facts(base_model: str, data_hours: float, data_clips: int, script: str = "train_vits.py") -> CardFacts:
    """Language and licence of a voice trained from `base_model` (see the module docstring)."""
    mms = MMS_ID.search(base_model.rstrip("/"))
    local = Path(base_model).is_dir()
    inherited = _front_matter(Path(base_model)) if local else {}
    if local and not inherited.get("license"):  # a folder without this tool's card: its config.json may say
        inherited = {**inherited, **_config_licence(Path(base_model))}
    hub = inherited.get("base_model", "") if local else "" if base_model.startswith("scratch") else base_model
    if inherited.get("license"):
        licence, note = inherited["license"], f"inherited from {base_model}"
        language = inherited.get("language") or (mms.group("language") if mms else "unknown")  # a hub card has none
    elif mms:
        licence, language = MMS_LICENCE, mms.group("language")
        note = (
            "Meta's MMS-TTS checkpoints are released under CC-BY-NC 4.0, and a voice fine-tuned from one keeps "
            "that licence: attribution, no commercial use"
        )
    elif base_model.startswith("scratch"):
        licence, language = "other", "unknown"
        note = "trained from new weights: the licence is that of the recordings it was trained on"
    else:
        licence, language = "unknown", "unknown"
        note = f"check the licence of the base model ({base_model}): a fine-tuned voice inherits it"
    return CardFacts(base_model, hub, language, licence, note, round(data_hours, 3), data_clips, script)


def licence_sentence(facts: CardFacts) -> str:
    """One plain sentence for the log and the report: the licence the voice inherits."""
    return f"licence: {facts.licence} ({facts.licence_note}); the voice made in this run inherits it"


JUDGE_MEANING = {  # finetune/reporting/judges.py; which vote: bench/RESULTS.md
    "speaker": "similarity to the voice's own recordings, -1..1, higher is nearer",
    "phonetic": "phoneme-posterior distance to the recording, lower says the words more as recorded",
    "phone_errors": "phone error rate against the recording, lower is better",
    "asr": "character error rate of an ASR model's transcript, lower is better",
}


def _figures(evaluation: dict | None) -> str:
    if not evaluation:
        return "Not evaluated on held-out clips."
    rows = [
        ("step", evaluation.get("step")),
        ("MCD-DTW, dB (lower is better)", evaluation.get("mcd_db")),
        ("MCD's standard error over the clips (the evaluation's noise)", evaluation.get("mcd_se_db")),
        (
            "median length ratio of one request (synthesised / recorded; 1 = the recordings' tempo)",
            evaluation.get("length_ratio"),
        ),
        (
            "how much one request's length varies from the next (geometric sd between draws)",
            evaluation.get("draw_spread"),
        ),
        ("duration error (share of frames the predicted rhythm misplaces)", evaluation.get("duration_error")),
        ("naturalness, DNSMOS OVRL 1..5 (higher is better)", evaluation.get("naturalness")),
        *(
            (f"{name} judge ({JUDGE_MEANING.get(name, 'see finetune/reporting/judges.py')})", value)
            for name, value in evaluation.get("judges", {}).items()
        ),
        ("held-out clips these figures are over", partial_clips(evaluation) or evaluation.get("clips_scored")),
        ("within the timing rule", evaluation.get("eligible")),
    ]
    table = "\n".join(f"| {name} | {value} |" for name, value in rows if value is not None)
    chosen = f"\n\nKept as: {evaluation['chosen_as']}." if evaluation.get("chosen_as") else ""
    return f"| figure | value |\n| --- | --- |\n{table}{chosen}"


def partial_clips(evaluation: dict) -> str:
    """For a model kept from an evaluation the deadline cut short (eval.json's summary): '14 of its 16 held-out
    clips (its evaluation was cut short by the deadline)', the clips its figures are over; '' for a whole one."""
    scored, planned = evaluation.get("clips_scored"), evaluation.get("clips_planned")
    if scored is None or planned is None or scored >= planned:
        return ""
    why = evaluation.get("cut_short") or "the deadline"
    return f"{scored} of its {planned} held-out clips (its evaluation was cut short by {why})"


def _tempo(evaluation: dict) -> str:
    """The Timing section: the tempo as evaluated, and the inference settings config.json speaks with."""
    ratio, fit = evaluation.get("length_ratio"), evaluation.get("inference_settings")
    measured = (
        f"At the model's own settings, one request speaks the held-out sentences at a median x{ratio:.2f} "
        "the recordings' length (below 1 is faster speech, above 1 slower)."
        if isinstance(ratio, float)
        else "Its tempo was not measured."
    )
    if not fit:
        return (
            f"{measured} config.json keeps the model's own inference settings. VITS samples each sound's "
            "duration: `noise_scale_duration` in config.json narrows that sampling (steadier, and after a short "
            "training shorter), `speaking_rate` changes the pace evenly (0.9 = 10% slower)."
        )
    before, after, own = fit["before"], fit["after"], fit["model_own"]
    return (
        f"{measured}\n\nconfig.json's inference settings were fitted on {fit['clips']} held-out recordings so that "
        "one request speaks at their tempo, steadily:\n\n| setting | model's own | fitted |\n| --- | --- | --- |\n"
        f"| speaking_rate | {own['speaking_rate']:g} | {fit['speaking_rate']:g} |\n"
        f"| noise_scale_duration | {own['noise_scale_duration']:g} | {fit['noise_scale_duration']:g} |\n"
        f"| noise_scale | {own['noise_scale']:g} | {fit['noise_scale']:g} (kept: it varies the timbre, not the length) |\n\n"
        f"Median length of one request x{before['length_ratio']:.2f} -> x{after['length_ratio']:.2f} the recordings'; "
        f"variation between requests x{before['draw_spread']:.2f} -> x{after['draw_spread']:.2f} (after: measured on "
        f"{fit.get('after_measured_on', 'the clips it was fitted on')})."
        + (f" Note: {fit['note']}." if fit.get("note") else "")
        + " To speak with the model's own settings, set them back in config.json (or train with "
        "--inference_settings model)."
    )


def card_text(facts: CardFacts, role: str, steps: int, evaluation: dict | None) -> str:
    """README.md for a model folder. `role`: what this folder is (e.g. "the best model of the run")."""
    tempo = _tempo(evaluation or {})
    return f"""---
{f"language: {facts.language}" + chr(10) if facts.language != "unknown" else ""}license: {facts.licence}
{f"base_model: {facts.hub_base_model}" + chr(10) if facts.hub_base_model else ""}library_name: transformers
pipeline_tag: text-to-speech
tags:
- vits
- text-to-speech
---

# VITS voice: {role}

{"Trained" if facts.base_model.startswith("scratch") else "Fine-tuned"} with {facts.script} (a time-budgeted VITS fine-tuning tool) from `{facts.base_model}` on
{facts.data_hours:.2f} hours of recordings ({facts.data_clips} clips), {steps} optimizer steps.

- Language: {facts.language}
- Licence: {facts.licence}: {facts.licence_note}.

## Held-out evaluation

{_figures(evaluation)}

## Timing

{tempo}

## Use it

```python
from transformers import pipeline
tts = pipeline("text-to-speech", model="PATH_OR_REPO_ID")
speech = tts("your sentence")          # speech["audio"], speech["sampling_rate"]
```

or `VitsModel.from_pretrained(...)` with `VitsTokenizer.from_pretrained(...)`. For phones and small boards
(sherpa-onnx), export it with the tool's `python export_onnx.py THIS_FOLDER voice_onnx --language
{facts.language}`, then load `voice_onnx/model.onnx` and `voice_onnx/tokens.txt` with
`sherpa_onnx.OfflineTtsVitsModelConfig`.

`discriminator.pt` beside the weights lets training continue from this voice (train_vits.py
--model_name THIS_FOLDER --discriminator THIS_FOLDER/discriminator.pt, or train_feedback.py).
"""
