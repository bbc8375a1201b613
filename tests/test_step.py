"""The training step: gradient isolation, non-finite losses, both duration predictors, freezing, and a
seeded overfit run on real demo clips."""

import copy

import numpy as np
import pytest
import torch

from finetune.data.features import FeatureConfig, Features
from finetune.training.pacing import WindowShape
from finetune.training.precision import Precision
from finetune.training.step import ListSource, StepSettings, TrainStep
from finetune.vits.discriminator import Discriminator, DiscriminatorConfig
from finetune.vits.generator import freeze
from finetune.vits.losses import LossWeights, discriminator_loss
from finetune.vits.objective import generator_forward, real_segments, reconstruction_mel_l1
from tests.conftest import demo_batch, tiny_generator

SMALL_D = DiscriminatorConfig(width=0.0625, periods=(2, 3))
FP32 = Precision("fp32", None)


def make_step(model, lr=2e-3, seed=0) -> TrainStep:
    torch.manual_seed(seed)
    settings = StepSettings(learning_rate=lr, discriminator_learning_rate=lr)
    return TrainStep(
        model, Discriminator(SMALL_D), Features(FeatureConfig()), LossWeights(), settings, FP32, torch.device("cpu")
    )


def test_discriminator_gradients_hold_nothing_from_the_generator_loss(prepared_demo):
    loaded = tiny_generator(prepared_demo)
    model, batch = loaded.model.train(), demo_batch(prepared_demo, loaded.tokenizer)
    step = make_step(model)
    torch.manual_seed(1)
    step.accumulate(batch, scale=1.0)
    from_step = [p.grad.clone() for p in step.discriminator.parameters()]

    # The same micro-batch (same random draws), discriminator loss alone.
    torch.manual_seed(1)
    out = generator_forward(model, batch, step.features, 32)
    real, _ = real_segments(batch, step.features, out.segment_starts, 32)
    scores, _ = step.discriminator(torch.cat([real, out.audio.detach()]))
    size = real.shape[0]
    alone = discriminator_loss([s[:size] for s in scores], [s[size:] for s in scores])
    expected = torch.autograd.grad(alone, list(step.discriminator.parameters()))
    for got, want in zip(from_step, expected):
        assert torch.allclose(got, want, rtol=1e-4, atol=1e-6)
    assert any(g.abs().sum() > 0 for g in from_step)


def test_a_non_finite_loss_never_reaches_the_weights(prepared_demo):
    loaded = tiny_generator(prepared_demo)
    model, good = loaded.model.train(), demo_batch(prepared_demo, loaded.tokenizer)
    bad = copy.copy(good)
    bad.audio = good.audio.clone()
    bad.audio[0, 1000:2000] = float("nan")
    step = make_step(model)
    before_g = copy.deepcopy(model.state_dict())
    before_d = copy.deepcopy(step.discriminator.state_dict())
    result = step.run([good, bad])
    assert not result.applied and result.reason == "non-finite loss" and step.skips.nonfinite == 1
    for key, value in model.state_dict().items():
        assert torch.equal(value, before_g[key]), key
    for key, value in step.discriminator.state_dict().items():
        assert torch.equal(value, before_d[key]), key
    assert step.optimizer_g.state_dict()["state"] == {} and step.optimizer_d.state_dict()["state"] == {}
    assert all(p.grad is None for p in model.parameters())
    assert step.run([good]).applied  # and training goes on


def test_deterministic_duration_predictor_trains_too(prepared_demo):
    loaded = tiny_generator(prepared_demo, use_stochastic_duration_prediction=False)
    model = loaded.model.train()
    result = make_step(model).run([demo_batch(prepared_demo, loaded.tokenizer)])
    assert result.applied and result.losses["duration"] > 0


def test_frozen_parts_do_not_change(prepared_demo):
    loaded = tiny_generator(prepared_demo)
    model = loaded.model.train()
    freeze(model, ["text_encoder", "decoder"])
    frozen_before = copy.deepcopy(
        {k: v for k, v in model.state_dict().items() if k.startswith(("text_encoder", "decoder"))}
    )
    flow_before = copy.deepcopy(model.flow.state_dict())
    assert make_step(model).run([demo_batch(prepared_demo, loaded.tokenizer)]).applied
    for key, value in frozen_before.items():
        assert torch.equal(model.state_dict()[key], value), key
    assert any(not torch.equal(v, flow_before[k]) for k, v in model.flow.state_dict().items())
    with pytest.raises(ValueError, match="choose from"):
        freeze(model, ["vocoder"])


def test_overfitting_a_few_clips_lowers_mel_l1_by_30_percent(prepared_demo):
    # One thread, whatever the process has now (a run in this process may have lowered it on a busy
    # machine). The trajectory is chaotic: it changes with the order of the sums (threads, the CPU's vector
    # width). 75 steps, where every trajectory tried had settled: 0.40-0.43 of the start at one and two
    # threads, seeds 0 and 3, on an AVX-512 machine; after 50 steps the same runs ranged 0.43-0.71.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        overfit(prepared_demo, steps=75)
    finally:
        torch.set_num_threads(threads)


def overfit(prepared_demo, steps: int):
    loaded = tiny_generator(prepared_demo, seed=0)
    model, batch = loaded.model, demo_batch(prepared_demo, loaded.tokenizer, count=4)
    step = make_step(model, lr=2e-3, seed=0)
    before = reconstruction_mel_l1(model.eval(), batch, step.features).mean().item()
    model.train()
    for _ in range(steps):
        assert step.run([batch]).applied
    after = reconstruction_mel_l1(model.eval(), batch, step.features).mean().item()
    assert after <= 0.7 * before, (before, after)


def test_cuda_out_of_memory_skips_the_window_and_training_goes_on(prepared_demo, monkeypatch):
    loaded = tiny_generator(prepared_demo)
    model, batch = loaded.model.train(), demo_batch(prepared_demo, loaded.tokenizer)
    step = make_step(model)
    before = copy.deepcopy(model.state_dict())
    real = TrainStep.accumulate

    def out_of_memory(self, *args, **kwargs):
        real(self, *args, **kwargs)  # gradients half accumulated when the error strikes
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(TrainStep, "accumulate", out_of_memory)
    result = step.run([batch])
    assert not result.applied and "--batch_size" in result.reason and step.skips.oom == 1
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())
    monkeypatch.setattr(TrainStep, "accumulate", real)
    assert step.run([batch]).applied


def test_a_checkpoint_without_fp16_resumes_under_fp16_and_back(prepared_demo):
    """A CPU or bf16 run saves an empty scaler state; resuming it with fp16 (the CUDA default) starts a
    fresh scale instead of failing, and the other way round the saved scale is simply not needed."""
    model = tiny_generator(prepared_demo).model
    fp32_step = make_step(model)
    scaled = TrainStep(
        model,
        Discriminator(SMALL_D),
        Features(FeatureConfig()),
        LossWeights(),
        StepSettings(learning_rate=1e-3, discriminator_learning_rate=1e-3),
        Precision("fp16", torch.float16),
        torch.device("cpu"),
    )
    scaled.load_state_dict(fp32_step.state_dict())
    assert scaled.scaler_g.is_enabled() and scaled.scaler_g.get_scale() == 65536.0
    fp32_step.load_state_dict(scaled.state_dict())


def test_evaluation_out_of_gpu_memory_retries_with_smaller_groups(prepared_demo):
    """Synthesising 8 clips at once (each up to 3x its recording) may not fit a small GPU: the evaluation
    halves its group size and scores every clip, rather than ending the run. The error is raised where a
    GPU raises it: in the decoder's forward, here for groups of more than 2 clips."""
    from finetune.data.corpus import load_examples
    from finetune.reporting import evaluation

    loaded = tiny_generator(prepared_demo)
    examples, _ = load_examples(
        prepared_demo, "metadata.csv", loaded.tokenizer, hop=256, sample_rate=16000, max_samples=6
    )

    def small_gpu(module, inputs):
        if inputs[0].shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 3.00 GiB")

    loaded.model.decoder.register_forward_pre_hook(small_gpu)
    evaluator = evaluation.Evaluator(examples, Features(FeatureConfig()), torch.device("cpu"), 16000, batch_size=8)
    result = evaluator.evaluate(loaded.model, step=0)
    assert evaluator.batch_size == 2 and len(result.per_clip) == 6
    assert all(np.isfinite(v.mcd_db) for v in result.per_clip.values())


def test_a_discriminator_warm_up_step_moves_the_discriminator_and_leaves_the_generator(prepared_demo):
    loaded = tiny_generator(prepared_demo)
    model, batch = loaded.model.train(), demo_batch(prepared_demo, loaded.tokenizer)
    step = make_step(model)
    generator_before = copy.deepcopy(model.state_dict())
    discriminator_before = copy.deepcopy(step.discriminator.state_dict())
    result = step.run([batch], generator=False)
    assert result.applied and set(result.losses) == {"discriminator", "margin"}
    for key, value in model.state_dict().items():
        assert torch.equal(value, generator_before[key]), key
    assert step.optimizer_g.state_dict()["state"] == {}  # the generator's optimizer never stepped
    assert any(
        not torch.equal(value, discriminator_before[key]) for key, value in step.discriminator.state_dict().items()
    )


def test_a_discriminator_warm_up_step_runs_only_what_the_discriminator_needs(prepared_demo, monkeypatch):
    """No text encoder, flow, duration predictor or alignment search: only posterior encoder and decoder,
    without gradients (their results would be thrown away)."""
    import finetune.vits.objective as objective

    loaded = tiny_generator(prepared_demo)
    model, batch = loaded.model.train(), demo_batch(prepared_demo, loaded.tokenizer)
    step = make_step(model)
    ran = []
    for name in ("text_encoder", "flow", "duration_predictor", "posterior_encoder", "decoder"):
        getattr(model, name).register_forward_hook(
            lambda module, args, out, name=name: ran.append((name, torch.is_grad_enabled()))
        )

    def no_alignment(*args, **kwargs):
        raise AssertionError("the warm-up ran the alignment search")

    monkeypatch.setattr(objective, "maximum_path", no_alignment)
    assert step.run([batch], generator=False).applied
    assert ran == [("posterior_encoder", False), ("decoder", False)]


def test_a_clip_shorter_than_a_segment_reads_as_silence_past_its_end_precomputed_or_not(prepared_demo):
    from finetune.data.corpus import load_examples, precompute_features
    from finetune.data.examples import collate
    from finetune.vits.objective import real_segments

    loaded = tiny_generator(prepared_demo)
    examples, _ = load_examples(
        prepared_demo, "metadata.csv", loaded.tokenizer, hop=256, sample_rate=16000, max_samples=2
    )
    examples[0].audio = examples[0].audio[: 20 * 256]  # 20 frames, shorter than the 32 of a segment
    features = Features(FeatureConfig())
    starts = torch.zeros(2, dtype=torch.long)
    _, computed = real_segments(collate(examples, 256).to("cpu"), features, starts, 32)
    precompute_features(examples, features, torch.device("cpu"), 256)
    _, precomputed = real_segments(collate(examples, 256).to("cpu"), features, starts, 32)
    # Past frame 20 the first clip is padding: silence either way (precomputed padding used to be 0, loud).
    # Frames 20-22 straddle the end (a 1024-sample window spans four hops), so the comparison starts at 23.
    assert torch.allclose(precomputed[0, :, 23:], computed[0, :, 23:], atol=1e-4)
    assert precomputed[0, :, 23:].max() < -9.0


def test_each_clip_of_a_window_weighs_the_same_however_its_micro_batches_were_cut(prepared_demo):
    """A window of two micro-batches of 4 clips, the second cut to 2 at the deadline: each micro-batch's mean
    loss counts by its clips (4/6 and 2/6 of the window), not half each (which weighed each cut clip twice)."""
    loaded = tiny_generator(prepared_demo)
    step = make_step(loaded.model.train())
    batch = demo_batch(prepared_demo, loaded.tokenizer)
    assert len(batch) >= 4
    whole = batch.first(4)
    seen = []

    def accumulate(micro_batch, scale, generator=True, discriminator=True, duration=True):
        for param in step.generator_params:  # a gradient of 1 a clip's mean loss, weighed by `scale`
            param.grad = (param.grad if param.grad is not None else torch.zeros_like(param)) + scale
        seen.append((len(micro_batch), scale))
        return {"mel": torch.tensor(float(len(micro_batch)))}

    step.accumulate = accumulate
    step.settings.max_grad_norm = 0.0  # no clipping: the optimizer sees the mean itself
    grads = []  # what the generator's optimizer steps with (after the rescaling)
    step.optimizer_g.register_step_pre_hook(lambda *_: grads.append([p.grad.clone() for p in step.generator_params]))
    # The loop's decision: two micro-batches of 4 clips, the second cut to 2 (the source gives whole ones).
    result = step.optimizer_step(
        ListSource([whole, whole]), WindowShape(planned=2, micro_batches=2, clips=4, last_clips=2)
    )
    assert [clips for clips, _ in seen] == [4, 2] and result.clips == 6 and result.used == 2 and result.cut_to == 2
    weights = [scale * 8 / 6 for _, scale in seen]  # after the window's rescaling to the clips used
    assert weights == pytest.approx([4 / 6, 2 / 6])
    assert all(torch.allclose(g, torch.ones_like(g)) for g in grads[0])  # a mean: the weights sum to 1
    assert len(result.micro_batch_s) == 1  # the cut one is not timed as a whole micro-batch
    assert result.applied and result.losses["mel"] == pytest.approx((4 * 4 + 2 * 2) / 6)  # a mean over the 6 clips


def test_the_anchor_pulls_each_trained_weight_back_toward_its_start(prepared_demo):
    """--anchor_weight: after AdamW's step (its decay toward zero off) each trained generator weight moves
    anchor_weight x lr of the way back to where the run started; the discriminator is not anchored."""
    lr = 1e-3
    moved = {}
    for anchor in (0.0, 0.25 / lr, 1.0 / lr):
        loaded = tiny_generator(prepared_demo, seed=0)
        model, batch = loaded.model.train(), demo_batch(prepared_demo, loaded.tokenizer)
        start = copy.deepcopy(model.state_dict())
        torch.manual_seed(0)
        settings = StepSettings(
            learning_rate=lr, discriminator_learning_rate=lr, anchor_weight=anchor, weight_decay=0.0
        )
        step = TrainStep(
            model, Discriminator(SMALL_D), Features(FeatureConfig()), LossWeights(), settings, FP32, torch.device("cpu")
        )
        discriminator_before = copy.deepcopy(step.discriminator.state_dict())
        torch.manual_seed(1)
        assert step.run([batch]).applied
        moved[anchor] = {k: v - start[k] for k, v in model.state_dict().items()}
        assert any(not torch.equal(v, discriminator_before[k]) for k, v in step.discriminator.state_dict().items())
    free, quarter, full = moved[0.0], moved[0.25 / lr], moved[1.0 / lr]
    assert any(v.abs().max() > 0 for v in free.values())
    for key, change in free.items():
        assert torch.allclose(quarter[key], 0.75 * change, atol=1e-6), key  # changes are about lr: 1e-3
        assert torch.equal(full[key], torch.zeros_like(change)), key


def test_a_resumed_run_keeps_the_anchor_where_the_first_run_started(prepared_demo):
    loaded = tiny_generator(prepared_demo, seed=0)
    model, batch = loaded.model.train(), demo_batch(prepared_demo, loaded.tokenizer)
    start = [p.detach().clone() for p in model.parameters() if p.requires_grad]
    settings = StepSettings(learning_rate=1e-3, discriminator_learning_rate=1e-3, anchor_weight=10.0)
    step = TrainStep(
        model, Discriminator(SMALL_D), Features(FeatureConfig()), LossWeights(), settings, FP32, torch.device("cpu")
    )
    assert step.run([batch]).applied
    saved = copy.deepcopy(step.state_dict())
    resumed = TrainStep(model, step.discriminator, step.features, LossWeights(), settings, FP32, torch.device("cpu"))
    assert not all(torch.equal(a, b) for a, b in zip(resumed.start_weights, start))  # built from the moved weights
    resumed.load_state_dict(saved)
    assert all(torch.equal(a, b) for a, b in zip(resumed.start_weights, start))


def test_the_optimizers_are_fused_on_the_cpu_and_make_the_loop_s_update(prepared_demo):
    """AdamW's fused kernel where torch has one: the update the per-tensor loop makes, at our settings."""
    from finetune.training.step import ADAM_BETAS

    step = make_step(tiny_generator(prepared_demo).model.train())
    assert step.optimizer_g.defaults["fused"] and step.optimizer_d.defaults["fused"]
    generator = torch.Generator().manual_seed(0)
    start = [torch.randn(64, 64, generator=generator) for _ in range(8)]
    gradients = [[torch.randn(64, 64, generator=generator) for _ in start] for _ in range(20)]
    weights = {}
    for fused in (False, True):
        params = [torch.nn.Parameter(w.clone()) for w in start]
        optimizer = torch.optim.AdamW(params, lr=8e-3, betas=ADAM_BETAS, eps=1e-9, weight_decay=0.01, fused=fused)
        for grads in gradients:
            for param, grad in zip(params, grads):
                param.grad = grad.clone()
            optimizer.step()
        weights[fused] = params
    assert max(float((a - b).detach().abs().max()) for a, b in zip(weights[False], weights[True])) < 1e-5


def test_segment_frames_from_the_command_line_set_what_a_step_decodes_and_discriminates(prepared_demo, capsys):
    """--segment_frames 8: each clip's decoded segment, and the real audio the discriminators compare it with,
    are 8 frames x the hop (2048 samples), not VITS's 32."""
    from types import SimpleNamespace

    from finetune.cli import parse_config
    from finetune.recipes import shared as recipe
    from finetune.training.distributed import Distributed
    from train_vits import TrainConfig

    flags = parse_config(TrainConfig, ["--segment_frames", "8"], "")
    loaded = tiny_generator(prepared_demo)
    model, batch = loaded.model.train(), demo_batch(prepared_demo, loaded.tokenizer)
    run = SimpleNamespace(precision=FP32, device=torch.device("cpu"), dist=Distributed())
    step = recipe.train_step(flags, run, model, Discriminator(SMALL_D), Features(FeatureConfig()))
    seen = []
    step.discriminator.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].shape))
    step.accumulate(batch, scale=1.0)
    assert seen and all(shape[-1] == 8 * 256 for shape in seen)
    with pytest.raises(SystemExit):
        parse_config(TrainConfig, ["--segment_frames", "0"], "")
    assert "--segment_frames 0: must be positive" in capsys.readouterr().err


def test_the_objective_flags_reach_the_step_by_name(prepared_demo):
    """Each loss weight from its --<name>_loss_weight flag, each step setting from the flag of its name
    (recipes/shared.py train_step): none left at its default when the command line sets it."""
    argv = ["--mel_loss_weight", "7", "--kl_loss_weight", "0.5", "--duration_loss_weight", "2", "--adam_eps", "1e-7"]
    argv += ["--adversarial_loss_weight", "3", "--feature_matching_loss_weight", "4", "--max_grad_norm", "3"]
    argv += ["--discriminator_every", "2", "--duration_every", "3", "--anchor_weight", "0.1", "--segment_frames", "16"]
    step, _, _ = step_from_flags(prepared_demo, argv)
    assert (step.weights.mel, step.weights.kl, step.weights.duration) == (7.0, 0.5, 2.0)
    assert (step.weights.adversarial, step.weights.feature_matching) == (3.0, 4.0)
    settings = step.settings
    assert (settings.adam_eps, settings.max_grad_norm, settings.anchor_weight) == (1e-7, 3.0, 0.1)
    assert (settings.discriminator_every, settings.duration_every, settings.segment_frames) == (2, 3, 16)
    assert settings.learning_rate == settings.discriminator_learning_rate == 2e-3  # 0: the same as the generator's


def step_from_flags(data_dir, argv: list[str]):
    """train_vits's optimizer step built from its command line (`argv`, at 2e-3) on a tiny voice, the way a run
    builds it (recipe.train_step): (step, model, a demo batch)."""
    from types import SimpleNamespace

    from finetune.cli import parse_config
    from finetune.recipes import shared as recipe
    from finetune.training.distributed import Distributed
    from train_vits import TrainConfig

    flags = parse_config(TrainConfig, [*argv, "--learning_rate", "2e-3"], "")
    loaded = tiny_generator(data_dir)
    model, batch = loaded.model.train(), demo_batch(data_dir, loaded.tokenizer)
    run = SimpleNamespace(precision=FP32, device=torch.device("cpu"), dist=Distributed())
    torch.manual_seed(0)
    return recipe.train_step(flags, run, model, Discriminator(SMALL_D), Features(FeatureConfig())), model, batch


def test_with_discriminator_every_2_a_step_without_it_moves_the_generator_alone_by_the_same_gradients(
    prepared_demo, capsys
):
    """--discriminator_every 2: the discriminator learns in steps 1, 3, 5...; in the others it scores the audio
    without gradients, its weights and optimizer untouched, and the generator's gradients are those of a step
    where it learns (the features it matches are the same real audio's)."""
    from finetune.cli import parse_config
    from train_vits import TrainConfig

    step, model, batch = step_from_flags(prepared_demo, ["--discriminator_every", "2"])
    assert [step.discriminator_learns(n) for n in range(1, 6)] == [True, False, True, False, True]

    gradients = {}
    for learns in (True, False):
        torch.manual_seed(1)
        terms = step.accumulate(batch, scale=1.0, discriminator=learns)
        assert ("discriminator" in terms) == learns
        gradients[learns] = [p.grad.clone() for p in step.generator_params if p.grad is not None]
        assert all(p.grad is None for p in step.discriminator.parameters()) != learns
        step.zero_grad()
    assert len(gradients[True]) == len(gradients[False]) > 0
    for with_it, without in zip(gradients[True], gradients[False]):
        assert torch.allclose(with_it, without, rtol=1e-4, atol=1e-6)

    generator_before = copy.deepcopy(model.state_dict())
    discriminator_before = copy.deepcopy(step.discriminator.state_dict())
    result = step.run([batch], discriminator=False)
    assert result.applied and "discriminator" not in result.losses and np.isnan(result.grad_norm_discriminator)
    assert np.isfinite(result.grad_norm_generator)
    for key, value in step.discriminator.state_dict().items():
        assert torch.equal(value, discriminator_before[key]), key
    assert step.optimizer_d.state_dict()["state"] == {}  # the discriminator's optimizer never stepped
    assert any(not torch.equal(value, generator_before[key]) for key, value in model.state_dict().items())

    with pytest.raises(SystemExit):
        parse_config(TrainConfig, ["--discriminator_every", "0"], "")
    assert "--discriminator_every 0: must be positive" in capsys.readouterr().err


def test_with_duration_every_2_a_step_without_it_leaves_the_duration_predictor_and_every_other_gradient_alone(
    prepared_demo, capsys
):
    """--duration_every 2: the duration predictor learns in steps 1, 3, 5...; in the others its loss is not
    computed, so it gets no gradient and its weights and AdamW moments stay as they were, while every other
    parameter's gradient is the same as in a step where it learns (its input is the text encoder's output,
    detached: the duration loss reaches nothing else)."""
    from finetune.cli import parse_config
    from train_vits import TrainConfig

    step, model, batch = step_from_flags(prepared_demo, ["--duration_every", "2"])
    assert [step.duration_learns(n) for n in range(1, 6)] == [True, False, True, False, True]
    predictor = {id(p) for p in model.duration_predictor.parameters()}

    gradients = {}
    for learns in (True, False):
        torch.manual_seed(1)
        terms = step.accumulate(batch, scale=1.0, duration=learns)
        assert ("duration" in terms) == learns
        assert all((p.grad is None) != learns for p in model.duration_predictor.parameters())
        gradients[learns] = [p.grad.clone() for p in step.generator_params if id(p) not in predictor]
        step.zero_grad()
    assert len(gradients[True]) == len(gradients[False]) > 0
    for with_it, without in zip(gradients[True], gradients[False]):
        assert torch.allclose(with_it, without, rtol=1e-4, atol=1e-6)

    predictor_before = copy.deepcopy(model.duration_predictor.state_dict())
    decoder_before = copy.deepcopy(model.decoder.state_dict())
    result = step.run([batch], duration=False)
    assert result.applied and "duration" not in result.losses and np.isfinite(result.losses["generator"])
    for key, value in model.duration_predictor.state_dict().items():
        assert torch.equal(value, predictor_before[key]), key
    stepped = {id(p) for p in step.generator_params if p in step.optimizer_g.state}
    assert stepped and not stepped & predictor  # AdamW never touched the predictor's moments
    assert any(not torch.equal(value, decoder_before[key]) for key, value in model.decoder.state_dict().items())

    with pytest.raises(SystemExit):
        parse_config(TrainConfig, ["--duration_every", "0"], "")
    assert "--duration_every 0: must be positive" in capsys.readouterr().err


def test_token_weights_count_in_the_prior_loss_only_on_the_frames_aligned_to_those_tokens(prepared_demo):
    """A round's clip weighs its tokens: the KL runs over the frames the alignment gives the weighted tokens only.
    Weighting every token alike is the plain loss; weighting none gives a loss of 0; weighting one letter counts
    exactly the frames aligned to it."""
    from dataclasses import replace

    from finetune.vits import losses

    loaded = tiny_generator(prepared_demo)
    model, batch = loaded.model.train(), demo_batch(prepared_demo, loaded.tokenizer)
    features = Features(FeatureConfig())

    def kl(weights):
        torch.manual_seed(0)
        out = generator_forward(model, replace(batch, token_weights=weights), features, 8)
        mask = out.frame_mask if out.kl_weights is None else out.kl_weights
        return out, losses.kl_loss(out.z_p, out.logs_q, out.m_p, out.logs_p, mask)

    plain = kl(None)[1]
    ones = batch.attention_mask.float()
    assert torch.allclose(kl(ones)[1], plain, atol=1e-5)
    assert float(kl(torch.zeros_like(ones))[1].detach()) == 0.0
    token = int(batch.input_ids[0, 1])  # a letter of the first clip
    only = ones * (batch.input_ids == token).float()
    out, loss = kl(only)
    aligned = float((out.durations[:, 0] * only).sum())  # the frames the alignment gave that letter, every clip
    assert float(out.kl_weights.sum()) == pytest.approx(aligned) and 0 < aligned < float(out.frame_mask.sum())
    assert torch.isfinite(loss) and not torch.allclose(loss, plain)


class GivenUpAt(ListSource):
    """Micro-batches from a list, the one numbered `late` watched by a check that turns late at its `at`-th
    question (the watch asks before every module's forward and for every trained weight's gradient)."""

    def __init__(self, batches, late: int, at: int):
        super().__init__(batches)
        self.late, self.at, self.drawn, self.asked = late, at, 0, 0

    def draw(self, index):
        self.drawn = index
        return super().draw(index)

    def late_check(self):
        if self.drawn != self.late:
            return None

        def is_late():
            self.asked += 1
            return self.asked >= self.at

        return is_late


def test_a_micro_batch_given_up_mid_backward_leaves_the_step_the_earlier_ones_made(prepared_demo):
    """A window of two micro-batches whose second is given up inside its backward (the deadline came while
    the machine was slow): the update is the one the first micro-batch alone makes, and the step says so."""
    loaded = tiny_generator(prepared_demo)
    batch = demo_batch(prepared_demo, loaded.tokenizer)
    first, second = batch.first(2), batch.first(3)
    start = copy.deepcopy(loaded.model.state_dict())

    def stepped(source, window):
        loaded.model.load_state_dict(start)
        step = make_step(loaded.model.train())
        torch.manual_seed(7)
        return step, step.optimizer_step(source, window)

    counting = GivenUpAt(
        [first, second], late=2, at=10**9
    )  # watched, never late: how many questions a micro-batch asks
    stepped(counting, WindowShape(2, 2, 1, 1))
    questions = counting.asked
    assert questions > 50

    alone_step, alone = stepped(ListSource([first]), WindowShape(1, 1, 1, 1))
    alone_weights = [
        p.detach().clone() for p in alone_step.generator_params + list(alone_step.discriminator.parameters())
    ]
    late_source = GivenUpAt([first, second], late=2, at=questions - 10)  # among the last: the weights' gradients
    late_step, result = stepped(late_source, WindowShape(2, 2, 1, 1))
    assert result.cut_by_deadline and result.used == 1 and result.clips == len(first) and result.given_up_s > 0
    assert result.applied and alone.applied and result.losses == pytest.approx(alone.losses)
    late_weights = late_step.generator_params + list(late_step.discriminator.parameters())
    assert all(torch.allclose(a, b, atol=1e-7) for a, b in zip(alone_weights, late_weights))
    assert not all(torch.equal(p, start[name]) for name, p in loaded.model.state_dict().items())  # it did learn


def test_a_first_micro_batch_given_up_applies_nothing_and_leaves_no_gradient(prepared_demo):
    loaded = tiny_generator(prepared_demo)
    batch = demo_batch(prepared_demo, loaded.tokenizer)
    step = make_step(loaded.model.train())
    before = [p.detach().clone() for p in step.generator_params]
    result = step.optimizer_step(GivenUpAt([batch.first(2)], late=1, at=1), WindowShape(1, 1, 1, 1))
    assert not result.applied and result.used == 0 and result.clips == 0 and result.cut_by_deadline
    assert "given up" in result.reason
    assert all(p.grad is None for p in step.generator_params + list(step.discriminator.parameters()))
    assert all(torch.equal(a, b) for a, b in zip(before, step.generator_params))
