#!/usr/bin/env python3
"""Find the clips whose transcript does not match their audio, with a model trained on the corpus.

    python check_transcripts.py --model training/checkpoints/best_model --data_dir training
    python check_transcripts.py --model training/checkpoints/best_model --data_dir training --exclude

Every clip of DATA_DIR's metadata.csv and metadata_val.csv is aligned to its text by the model, as
training aligns it, and scored by its alignment cost (KL per frame); a clip whose cost lies more than
--max_z robust standard deviations above its speaker's median is flagged (finetune/reporting/transcripts.py).
A crowd's run (a model folder with multi_speaker/) scores each clip in its own speaker's voice.

Writes DATA_DIR/transcript_check.csv (id, speaker, alignment_cost, z, flagged; worst first) and prints
the flagged clips: listen to them. With --exclude, their rows move from metadata.csv / metadata_val.csv
to metadata_excluded.csv (each with its reason), and the next train_vits.py run leaves them out (a
resumed run refuses changed data: start a new one, or resume before excluding).

Exit status: 0 done, 1 bad model or data, 2 bad flags, 130/143 interrupted.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from finetune.cli import ConfigError, flag, parse_config, run_script


@dataclass
class CheckConfig:
    model: str = flag(
        "training/checkpoints/best_model", "a model folder train_vits.py wrote after training on DATA_DIR"
    )
    data_dir: str = flag("training", "the prepared corpus (prepare_data.py)")
    max_z: float = flag(
        3.5,
        "flag clips whose alignment cost is more than this many robust standard deviations "
        "above their speaker's median",
    )
    exclude: bool = flag(
        False, "move the flagged clips out of metadata.csv / metadata_val.csv into metadata_excluded.csv"
    )
    seed: int = flag(0, "seed of the posterior sample each clip is scored with")
    device: str = flag("auto", "cuda, cpu, or auto")

    def __post_init__(self):
        problems = []
        if not (Path(self.model) / "config.json").is_file():
            problems.append(
                f"--model {self.model}: no model folder there (config.json); give a folder train_vits.py "
                "wrote, e.g. training/checkpoints/best_model"
            )
        if not (Path(self.data_dir) / "metadata.csv").is_file():
            problems.append(f"--data_dir {self.data_dir}: no metadata.csv; prepare the corpus first (prepare_data.py)")
        if problems:
            raise ConfigError(problems)


def main(argv: list[str] | None = None) -> int:
    config = parse_config(CheckConfig, argv, __doc__)
    # torch and transformers load below, once the flags are read (--help never waits for them)
    import json

    import numpy as np
    from transformers import VitsTokenizer

    from finetune.data.corpus import load_examples
    from finetune.recipes.shared import features_for
    from finetune.reporting import transcripts
    from finetune.system.interrupt import StopRequest, StopRequested
    from finetune.system.progress import Progress
    from finetune.training.assembly import pick_device
    from finetune.vits.generator import load_complete_model
    from finetune.vits.speaker_layers import MULTI_SPEAKER_DIR

    data_dir, folder = Path(config.data_dir), Path(config.model)
    speakers = transcripts.speakers_of(data_dir)
    several = folder / MULTI_SPEAKER_DIR
    crowd = set(speakers.values()) != {""} and (several / "speakers.json").is_file()
    if crowd:  # each clip in its own speaker's voice; speakers the run did not train on, in the target's
        folder = several
        ids = json.loads((several / "speakers.json").read_text(encoding="utf-8"))["speakers"]
    device = pick_device(config.device)
    model = load_complete_model(folder, str(folder), speakers=crowd).to(device).eval()
    tokenizer = VitsTokenizer.from_pretrained(str(folder))
    features = features_for(model, device)
    hop, rate = features.config.hop_length, features.config.sample_rate
    mapping = {name: ids.get(name, 0) for name in set(speakers.values())} if crowd else None
    stop = StopRequest()
    costs = []
    with stop.installed():
        try:
            for name in transcripts.METADATA_NAMES:
                if not (data_dir / name).is_file():
                    continue
                examples, report = load_examples(data_dir, name, tokenizer, hop, rate, stop=stop, speakers=mapping)
                if report.skipped:
                    print(f"{name}: {report.describe(str(data_dir / name))}", file=sys.stderr)
                progress = Progress(f"align {name}", total=len(examples), unit="clips")
                for example in examples:
                    stop.check()
                    cost = transcripts.alignment_cost(model, example, features, device, config.seed + len(costs))
                    costs.append(transcripts.ClipCost(example.item_id, speakers.get(example.item_id, ""), cost))
                    progress.update()
                progress.close()
        except StopRequested as request:
            print(f"interrupted ({request.signal_name}): nothing written, {data_dir} unchanged", file=sys.stderr)
            return stop.exit_status
    ranked = transcripts.flag_outliers(costs, config.max_z)
    report_path = transcripts.write_report(data_dir, ranked)
    flagged = [c for c in ranked if c.flagged]
    costs_array = np.array([c.cost for c in ranked])
    print(
        f"{len(ranked)} clips aligned by {config.model}: alignment cost median {np.median(costs_array):.3f}, "
        f"{len(flagged)} above z {config.max_z:g} -> {report_path}"
    )
    print(f"each clip's z measured within: {transcripts.how_judged(ranked)}")
    for clip in flagged[:20]:
        print(
            f"  {clip.item_id}{' (' + clip.speaker + ')' if clip.speaker else ''}: cost {clip.cost:.3f}, z {clip.z:.1f}"
        )
    if len(flagged) > 20:
        print(f"  ... and {len(flagged) - 20} more in {report_path}")
    if config.exclude and flagged:
        moved = transcripts.exclude(
            data_dir, {c.item_id for c in flagged}, f"transcript mismatch (alignment cost z {config.max_z:g}+)"
        )
        print(
            f"excluded: {moved} rows moved to {data_dir / transcripts.EXCLUDED_NAME}; the next train_vits.py run "
            "leaves them out"
        )
    elif flagged:
        print("listen to them; --exclude leaves them out of the next training run")
    return 0


if __name__ == "__main__":
    sys.exit(run_script(main))
