"""Models in and out: scratch and local pretrained models, export that stock transformers loads."""

import numpy as np
import torch
from transformers import VitsConfig, VitsModel, pipeline

from finetune.system.model_source import resolve_model
from finetune.vits.discriminator import Discriminator, DiscriminatorConfig, load_discriminator
from finetune.vits.generator import (
    SCRATCH_CONFIGS,
    has_weight_norm,
    load_generator,
    ready_for_training,
    scratch_tokenizer,
    without_dropout,
)
from finetune.vits.voice_on_disk import export_model
from tests.conftest import KURMANJI_LETTERS, make_tokenizer_dir


def test_scratch_tokenizer_puts_the_blank_between_characters():
    tokenizer = scratch_tokenizer(list("abç "))
    ids = tokenizer("Abç").input_ids
    assert ids[0::2] == [0, 0, 0, 0] and len(ids) == 7
    assert tokenizer.convert_ids_to_tokens(ids[1::2]) == ["a", "b", "ç"]


def test_export_loads_in_stock_transformers_and_speaks(tmp_path):
    loaded = load_generator(resolve_model("scratch:tiny"), list(KURMANJI_LETTERS + " "), 16000)
    ready_for_training(loaded.model)
    discriminator = Discriminator(DiscriminatorConfig(width=0.0625))
    out = tmp_path / "final_model"
    export_model(loaded.model, loaded.tokenizer, out, discriminator, {"training_summary.json": {"steps": 3}})
    export_model(loaded.model, loaded.tokenizer, out, discriminator)  # replacing an export works too
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_model"]  # no staging folders left
    from finetune.system.atomic import FILE_MODE

    assert {p.stat().st_mode & 0o777 for p in out.iterdir()} == {FILE_MODE}  # readable by a server's user too
    model, info = VitsModel.from_pretrained(str(out), output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert not has_weight_norm(model.decoder)
    speech = pipeline("text-to-speech", model=str(out))("Rojbaş, tu çawa yî?")
    assert speech["sampling_rate"] == 16000 and speech["audio"].size > 1000
    assert np.isfinite(speech["audio"]).all()
    assert load_discriminator(out / "discriminator.pt").discriminator.config.width == 0.0625


def test_local_pretrained_folder_round_trips_through_training_layout(tmp_path):
    folder = make_tokenizer_dir(tmp_path / "pretrained", KURMANJI_LETTERS + " ")
    config = VitsConfig(vocab_size=len(KURMANJI_LETTERS) + 1, **SCRATCH_CONFIGS["tiny"])
    torch.manual_seed(0)
    VitsModel(config).save_pretrained(str(folder))
    original = VitsModel.from_pretrained(str(folder)).eval()

    loaded = load_generator(resolve_model(str(folder)), [], 16000)
    assert loaded.pretrained
    ready_for_training(loaded.model)
    assert has_weight_norm(loaded.model.decoder)
    export_model(loaded.model, loaded.tokenizer, tmp_path / "out")
    exported = VitsModel.from_pretrained(str(tmp_path / "out")).eval()
    for key, value in original.state_dict().items():
        assert torch.allclose(exported.state_dict()[key], value, atol=1e-6), key


def test_a_model_folder_with_missing_weights_is_refused_by_name(tmp_path):
    from safetensors.torch import load_file, save_file

    from finetune.system.model_source import ModelSourceError

    folder = make_tokenizer_dir(tmp_path / "broken", KURMANJI_LETTERS + " ")
    VitsModel(VitsConfig(vocab_size=len(KURMANJI_LETTERS) + 1, **SCRATCH_CONFIGS["tiny"])).save_pretrained(str(folder))
    weights = load_file(str(folder / "model.safetensors"))
    missing = sorted(k for k in weights if k.startswith("flow."))[0]
    del weights[missing]
    save_file(weights, str(folder / "model.safetensors"), metadata={"format": "pt"})
    import pytest

    with pytest.raises(ModelSourceError, match=f"missing from the saved model.*{missing}"):
        load_generator(resolve_model(str(folder)), [], 16000)


def test_a_multi_speaker_model_is_refused(tmp_path):
    import pytest

    from finetune.system.model_source import ModelSourceError

    folder = make_tokenizer_dir(tmp_path / "speakers", KURMANJI_LETTERS + " ")
    config = VitsConfig(
        vocab_size=len(KURMANJI_LETTERS) + 1, num_speakers=4, speaker_embedding_size=16, **SCRATCH_CONFIGS["tiny"]
    )
    VitsModel(config).save_pretrained(str(folder))
    with pytest.raises(ModelSourceError, match="multi-speaker VITS model \\(4 speakers\\)"):
        load_generator(resolve_model(str(folder)), [], 16000)


def test_an_incomplete_model_folder_says_what_it_lacks(tmp_path):
    import pytest

    from finetune.system.model_source import ModelSourceError

    folder = make_tokenizer_dir(tmp_path / "half", KURMANJI_LETTERS + " ")
    VitsConfig(vocab_size=len(KURMANJI_LETTERS) + 1, **SCRATCH_CONFIGS["tiny"]).save_pretrained(str(folder))
    with pytest.raises(ModelSourceError, match=r"incomplete, it has no model.safetensors \(the weights\)"):
        load_generator(resolve_model(str(folder)), [], 16000)


def test_dropout_off_trains_the_network_inference_runs_and_exports_the_same_config():
    """--dropout off: in training mode the text encoder gives what it gives in eval mode (no layer drops
    anything), where with dropout on two passes differ; the config keeps its rates for an export."""
    loaded = load_generator(resolve_model("scratch:tiny"), list(KURMANJI_LETTERS + " "), 16000)
    model = ready_for_training(loaded.model)
    ids = torch.tensor([loaded.tokenizer("ez bi kurdî dipeyivim").input_ids])
    mask = torch.ones_like(ids)

    def encoded(mode: str) -> torch.Tensor:
        getattr(model, mode)()
        with torch.no_grad():
            out = model.text_encoder(input_ids=ids, padding_mask=mask.unsqueeze(-1).float(), attention_mask=mask)
        return out.last_hidden_state

    rates = (model.config.hidden_dropout, model.config.attention_dropout, model.config.duration_predictor_dropout)
    assert min(rates) > 0 and not torch.equal(encoded("train"), encoded("train"))
    without_dropout(model)
    assert torch.equal(encoded("train"), encoded("eval"))
    assert all(m.p == 0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    assert (
        model.config.hidden_dropout,
        model.config.attention_dropout,
        model.config.duration_predictor_dropout,
    ) == rates
