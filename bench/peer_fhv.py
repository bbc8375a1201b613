"""finetune-hf-vits's saved training states as plain transformers voices; bench/bench_peers.py runs this
in the peer's own environment, with the peer's checkout as the working folder (its `utils` package).

    python peer_fhv.py export START_DIR CHECKPOINT_DIR OUT_DIR

START_DIR is the folder its conversion script wrote (the model the run started from: config, tokenizer);
CHECKPOINT_DIR an `accelerator.save_state` folder of its run (checkpoint-N/: model.safetensors holds the
generator with weight norm applied, as run_vits_finetuning.py trains it). The weights are put into the
peer's own VitsModelForPreTraining the way its training script prepares it (weight norm on the decoder and
on each flow's conv_pre / conv_post), loaded, the weight norm removed as its script does before its final
save, and the generator saved as a transformers VitsModel with the tokenizer: what its final save would
have written at that step.
"""

import sys
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, VitsModel
from utils import VitsConfig, VitsModelForPreTraining


def export(start: Path, checkpoint: Path, out: Path) -> None:
    config = VitsConfig.from_pretrained(str(start))
    model = VitsModelForPreTraining(config)
    model.decoder.apply_weight_norm()
    for flow in model.flow.flows:
        torch.nn.utils.weight_norm(flow.conv_pre)
        torch.nn.utils.weight_norm(flow.conv_post)
    del model.discriminator  # the run trains it apart (model_1.safetensors)
    state = load_file(str(checkpoint / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise SystemExit(f"{checkpoint}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.decoder.remove_weight_norm()
    for flow in model.flow.flows:
        torch.nn.utils.remove_weight_norm(flow.conv_pre)
        torch.nn.utils.remove_weight_norm(flow.conv_post)
    voice = VitsModel.from_pretrained(str(start))
    generator = {k: v for k, v in model.state_dict().items() if not k.startswith("discriminator.")}
    missing, unexpected = voice.load_state_dict(generator, strict=False)
    if unexpected or [k for k in missing if not k.endswith("num_batches_tracked")]:
        raise SystemExit(
            f"{checkpoint}: the generator does not fit VitsModel: missing {missing[:5]}, unexpected {unexpected[:5]}"
        )
    voice.save_pretrained(str(out))
    AutoTokenizer.from_pretrained(str(start)).save_pretrained(str(out))


if __name__ == "__main__":
    if len(sys.argv) != 5 or sys.argv[1] != "export":
        raise SystemExit(__doc__)
    export(Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
