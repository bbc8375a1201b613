"""The ONNX export: the graph speaks as PyTorch does at any text length, and sherpa-onnx loads and speaks it."""

import numpy as np
import pytest
import torch

import export_onnx
from finetune.reporting.tracking import installed
from finetune.vits.inference import ceiling_for_text, speak_tokens, synthesise_graph
from finetune.vits.onnx_export import export_voice, sherpa_speech, tokens_lines
from tests.test_inference import tiny_model

SENTENCES = [
    "ez",
    "ez baş im",
    "rojbaş tu çawa yî li vir",
    "sibê em ê zû rabin ji ber ku rêwîtiyek dirêj li pêşiya me ye",
]


def one_thread_session(path):
    """An onnxruntime session on one thread (its default is a spinning thread a core: the suite runs a test
    on each core)."""
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def test_tokens_file_follows_the_sherpa_onnx_character_format():
    lines = tokens_lines({"<pad>": 0, " ": 1, "a": 2, "ç": 3, "'": 4, "B": 5, "b": 6})
    # The blank (<pad>) is left out (its id is the metadata's blank_id); the space is a bare id; each
    # letter gets a capital line unless the vocabulary has one of its own.
    assert lines == [" 1", "a 2", "ç 3", "' 4", "B 5", "b 6", "A 2", "Ç 3"]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    model, _ = tiny_model()
    from finetune.vits.generator import scratch_tokenizer
    from tests.conftest import KURMANJI_LETTERS

    tokenizer = scratch_tokenizer(list(KURMANJI_LETTERS + " "))
    out = export_voice(model, tokenizer, tmp_path_factory.mktemp("onnx") / "voice", "kmr")
    return model, tokenizer, out


def ids_of(tokenizer, text: str) -> torch.Tensor:
    return torch.tensor([tokenizer(text).input_ids], dtype=torch.long)


def scales(noise: float, length: float, noise_w: float) -> list[torch.Tensor]:
    return [torch.tensor([noise]), torch.tensor([length]), torch.tensor([noise_w])]


def test_the_graph_equals_the_bounded_inference_without_noise(exported):
    model, tokenizer, _ = exported
    for text in SENTENCES:
        ids = ids_of(tokenizer, text)
        model.noise_scale = model.noise_scale_duration = 0.0
        ceiling = [ceiling_for_text(ids.shape[1])]  # the graph's own per-clip ceiling
        reference = speak_tokens(model, [ids[0].numpy().astype(np.int32)], torch.device("cpu"), ceiling).waveforms[0]
        with torch.no_grad():
            graph = synthesise_graph(model, ids, *scales(0.0, 1.0, 0.0))[0, 0].numpy()
        assert np.allclose(graph, reference, atol=1e-5)


def test_onnxruntime_speaks_as_pytorch_at_every_length_and_speed(exported):
    model, tokenizer, out = exported
    session = one_thread_session(out / "model.onnx")
    assert [i.name for i in session.get_inputs()] == ["x", "x_length", "noise_scale", "length_scale", "noise_scale_w"]
    for text in SENTENCES:
        for length in (1.0, 1.5):
            ids = ids_of(tokenizer, text)
            with torch.no_grad():
                expected = synthesise_graph(model, ids, *scales(0.0, length, 0.0))[0, 0].numpy()
            got = session.run(
                None,
                {
                    "x": ids.numpy(),
                    "x_length": np.array([ids.shape[1]]),
                    **dict(
                        zip(
                            ["noise_scale", "length_scale", "noise_scale_w"],
                            [s.numpy() for s in scales(0.0, length, 0.0)],
                        )
                    ),
                },
            )[0][0, 0]
            assert got.shape == expected.shape and np.abs(got - expected).max() < 1e-4, (text, length)
    # With noise the speech differs from PyTorch's draw, but stays speech-shaped and finite.
    noisy = session.run(
        None,
        {
            "x": ids.numpy(),
            "x_length": np.array([ids.shape[1]]),
            "noise_scale": np.array([0.667], np.float32),
            "length_scale": np.array([1.0], np.float32),
            "noise_scale_w": np.array([0.8], np.float32),
        },
    )[0]
    assert noisy.ndim == 3 and np.isfinite(noisy).all()


@pytest.mark.skipif(not installed("sherpa_onnx"), reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
def test_sherpa_onnx_loads_the_export_and_speaks_the_expected_length(exported):
    model, tokenizer, out = exported
    text = "rojbaş tu çawa yî li vir"
    with torch.no_grad():
        expected = synthesise_graph(model, ids_of(tokenizer, text), *scales(0.0, 1.0, 0.0))[0, 0].numpy()
    speech = sherpa_speech(out, text)  # no noise: the same ids must give the same audio
    assert speech["sample_rate"] == 16000 and speech["samples"] == expected.shape[0]
    capitals = sherpa_speech(out, "Rojbaş Tu Çawa Yî Li Vir")  # sherpa lower-cases ASCII only: Ç needs its line
    assert capitals["samples"] == expected.shape[0]


def test_the_script_exports_and_checks_a_saved_model(tmp_path, capsys):
    from finetune.system.model_source import resolve_model
    from finetune.vits.generator import load_generator, ready_for_training
    from finetune.vits.voice_on_disk import export_model
    from tests.conftest import KURMANJI_LETTERS

    loaded = load_generator(resolve_model("scratch:tiny"), list(KURMANJI_LETTERS + " "), 16000)
    export_model(ready_for_training(loaded.model), loaded.tokenizer, tmp_path / "model")
    assert export_onnx.main([str(tmp_path / "model"), str(tmp_path / "onnx")]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime equals PyTorch on 3 sentences" in out
    assert sorted(p.name for p in (tmp_path / "onnx").iterdir()) == [
        "README.md",
        "model.onnx",
        "tokens.txt",
        "voice.json",
    ]
    assert "licence: unknown" in out and "Licence: unknown" in (tmp_path / "onnx" / "README.md").read_text()


@pytest.mark.skipif(not installed("sherpa_onnx"), reason="sherpa-onnx is not installed (pip install sherpa-onnx)")
def test_sherpa_onnx_with_nothing_set_speaks_at_the_fitted_tempo_of_config_json(tmp_path, capsys):
    """A voice whose config.json speaks 25% slower than the model's own setting (speaking_rate 0.8), its
    duration noise fitted to 0 (so every draw is the same length): sherpa-onnx's documented snippet, which
    sets nothing, speaks each sentence exactly as long as the stock pipeline does; before the settings were
    folded into the graph it spoke at the model's own rate (shorter)."""
    import json

    from transformers import VitsModel, VitsTokenizer

    from finetune.system.model_source import resolve_model
    from finetune.vits.generator import load_generator, ready_for_training
    from finetune.vits.onnx_export import sherpa_run
    from finetune.vits.voice_on_disk import export_model
    from tests.conftest import KURMANJI_LETTERS

    loaded = load_generator(resolve_model("scratch:tiny"), list(KURMANJI_LETTERS + " "), 16000)
    export_model(
        ready_for_training(loaded.model),
        loaded.tokenizer,
        tmp_path / "model",
        inference={"speaking_rate": 0.8, "noise_scale_duration": 0.0, "noise_scale": 0.667},
    )
    assert export_onnx.main([str(tmp_path / "model"), str(tmp_path / "onnx")]) == 0
    assert "sherpa-onnx at its defaults speaks at config.json's tempo (speaking_rate 0.8)" in capsys.readouterr().out
    stock, tokenizer = (
        VitsModel.from_pretrained(tmp_path / "model").eval(),
        VitsTokenizer.from_pretrained(tmp_path / "model"),
    )
    texts = SENTENCES[1:]
    with torch.no_grad():
        expected = [int(stock(**tokenizer(t, return_tensors="pt")).sequence_lengths[0]) for t in texts]
    heard = sherpa_run(tmp_path / "onnx", texts, None, None, repeats=2)["samples"]  # the documented snippet
    assert heard == [[n, n] for n in expected]
    stock.speaking_rate = 1.0  # what the model's own setting speaks: what sherpa-onnx spoke before
    with torch.no_grad():
        own = [int(stock(**tokenizer(t, return_tensors="pt")).sequence_lengths[0]) for t in texts]
    assert sum(own) < sum(expected)  # (less than by 1/0.8: an untrained voice's tokens are a frame or two, rounded up)
    voice = json.loads((tmp_path / "onnx" / "voice.json").read_text())
    assert (voice["length_scale"], voice["folded_speaking_rate"], voice["noise_scale_w"]) == ("1.0", "0.8", "0.8")


def test_a_crowd_model_exports_its_voice_and_every_speaker_behind_a_sid_input(tmp_path, capsys):
    """A conditioned model's folder: the target alone at the top, all speakers in multi_speaker/ with sherpa-onnx's
    sid input, each checked against PyTorch."""
    import json

    from finetune.system.model_source import resolve_model
    from finetune.vits.generator import load_generator, ready_for_training
    from finetune.vits.speaker_layers import MULTI_SPEAKER_DIR, add_speakers, conditioning_layers
    from finetune.vits.voice_on_disk import export_model
    from tests.conftest import KURMANJI_LETTERS

    loaded = load_generator(resolve_model("scratch:tiny"), list(KURMANJI_LETTERS + " "), 16000)
    model = add_speakers(ready_for_training(loaded.model), 3, seed=0)
    model.config.speaker_names = ["ciya", "axin", "baran"]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # as after training: each speaker's conditioning moves the voice
        for layer in conditioning_layers(model):
            weight = getattr(getattr(layer, "parametrizations", None), "weight", None)
            target = weight.original0 if weight is not None else layer.weight
            target.copy_(0.05 * torch.randn(target.shape, generator=generator))
    export_model(model, loaded.tokenizer, tmp_path / "model")
    assert export_onnx.main([str(tmp_path / "model"), str(tmp_path / "onnx")]) == 0
    out = capsys.readouterr().out
    assert "onnxruntime equals PyTorch on 3 sentences" in out  # the target alone
    assert "onnxruntime equals PyTorch as speaker 0" in out and "as speaker 2" in out
    several = tmp_path / "onnx" / MULTI_SPEAKER_DIR
    assert json.loads((several / "speakers.json").read_text())["speakers"] == {"ciya": 0, "axin": 1, "baran": 2}
    assert json.loads((several / "voice.json").read_text())["n_speakers"] == "3"
    assert json.loads((tmp_path / "onnx" / "voice.json").read_text())["n_speakers"] == "0"
    session = one_thread_session(several / "model.onnx")
    assert [i.name for i in session.get_inputs()][-1] == "sid"
    ids = np.array([[3, 5, 7, 9, 11, 13]], dtype=np.int64)
    speech = [
        session.run(
            None,
            {
                "x": ids,
                "x_length": np.array([6]),
                "noise_scale": np.array([0.0], np.float32),
                "length_scale": np.array([1.0], np.float32),
                "noise_scale_w": np.array([0.0], np.float32),
                "sid": np.array([sid]),
            },
        )[0]
        for sid in (0, 2)
    ]
    assert speech[0].shape != speech[1].shape or not np.allclose(speech[0], speech[1])
