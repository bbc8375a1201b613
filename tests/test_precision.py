"""fp16 and bf16 on the CPU: asked for only, the fp32 islands hold under autocast, a pretrained start
stays finite under fp16 for hundreds of steps, and the gradient scaler skips a step whose gradients
overflow for real (through the loss) and recovers.

A micro VITS (27k parameters, a 2-period discriminator of a few thousand) on two 0.4 s slices of demo
clips, 4-frame segments: a step in fp16 takes a tenth of a second or so on one free CPU core."""

import copy
import math
import os

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import finetune.data.features as features_module
import finetune.training.step as step_module
import finetune.vits.losses as losses_module
import finetune.vits.objective as objective_module
from finetune.data.features import FeatureConfig, Features
from finetune.training.precision import Precision, precision_warning, resolve_precision
from finetune.training.step import StepSettings, TrainStep
from finetune.vits.discriminator import Discriminator, DiscriminatorConfig
from finetune.vits.losses import LossWeights
from tests.conftest import demo_batch, tiny_generator

MICRO = dict(
    hidden_size=16,
    ffn_dim=32,
    flow_size=8,
    num_hidden_layers=1,
    upsample_initial_channel=16,
    posterior_encoder_num_wavenet_layers=1,
    prior_encoder_num_wavenet_layers=1,
    prior_encoder_num_flows=1,
    duration_predictor_filter_channels=16,
    duration_predictor_num_flows=1,
    depth_separable_num_layers=1,
)
FP32, FP16, BF16 = Precision("fp32", None), Precision("fp16", torch.float16), Precision("bf16", torch.bfloat16)
CPU = torch.device("cpu")
FRAMES = 24  # 0.38 s at hop 256
HALF = (torch.float16, torch.bfloat16)


def micro_setup(data_dir, precision: Precision, lr: float = 2e-3, weights: LossWeights = LossWeights()):
    loaded = tiny_generator(data_dir, **MICRO)
    batch = demo_batch(data_dir, loaded.tokenizer, count=2)
    keep = min(8, int(batch.text_lengths.min()))  # a few tokens of each text over the first FRAMES frames
    batch.input_ids, batch.attention_mask = batch.input_ids[:, :keep], batch.attention_mask[:, :keep]
    batch.text_lengths = torch.full_like(batch.text_lengths, keep)
    batch.audio, batch.frame_lengths = batch.audio[:, : FRAMES * 256], torch.full_like(batch.frame_lengths, FRAMES)
    batch.linear = batch.mel = None
    step = make_step(loaded.model.train(), precision, lr, weights)
    return loaded.model, step, batch


def make_step(
    model,
    precision: Precision,
    lr: float = 2e-3,
    weights: LossWeights = LossWeights(),
    discriminator: Discriminator | None = None,
) -> TrainStep:
    torch.manual_seed(0)
    discriminator = discriminator or Discriminator(DiscriminatorConfig(width=0.03125, periods=(2,)))
    settings = StepSettings(learning_rate=lr, discriminator_learning_rate=lr, segment_frames=4)
    return TrainStep(model, discriminator, Features(FeatureConfig()), weights, settings, precision, CPU)


def test_half_precision_runs_on_the_cpu_only_when_asked_with_one_warning():
    assert resolve_precision(CPU, None, False) == FP32
    assert resolve_precision(CPU, True, False) == FP16 and resolve_precision(CPU, None, True) == BF16
    assert resolve_precision(torch.device("cuda"), None, False) == FP16
    assert resolve_precision(torch.device("cuda"), False, False) == FP32
    assert "slow" in precision_warning(CPU, FP16) and "numerics" in precision_warning(CPU, BF16)
    assert precision_warning(CPU, FP32) == "" and precision_warning(torch.device("cuda"), FP16) == ""


class HalfArithmetic(TorchDispatchMode):
    """Records every op that makes a half-precision tensor (views and casts of one aside), and whether it
    ran inside a marked fp32 island. Dispatch modes sit below autocast: they see the ops as cast."""

    def __init__(self):
        super().__init__()
        self.islands: list[str] = []  # the islands entered, innermost last
        self.inside: list[tuple[str, str]] = []  # (island, op) that computed in half precision
        self.outside = 0
        self.entered: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        made_half = any(isinstance(t, torch.Tensor) and t.dtype in HALF for t in tree_leaves(out))
        if made_half and not func.is_view and func.__name__ not in ("detach.default", "clone.default"):
            if self.islands:
                self.inside.append((self.islands[-1], str(func)))
            else:
                self.outside += 1
        return out

    def mark(self, name: str, function):
        def marked(*args, **kwargs):
            self.islands.append(name)
            self.entered.add(name)
            try:
                return function(*args, **kwargs)
            finally:
                self.islands.pop()

        return marked

    def mark_module(self, name: str, module: torch.nn.Module) -> None:
        module.register_forward_pre_hook(lambda *_: (self.islands.append(name), self.entered.add(name)) and None)
        module.register_forward_hook(lambda *_: self.islands.pop() and None)


ISLAND_FUNCTIONS = [
    (losses_module, n) for n in ("kl_loss", "mel_loss", "generator_adversarial_loss", "feature_matching_loss")
]
ISLAND_FUNCTIONS += [
    (step_module, "discriminator_loss"),
    (objective_module, "stochastic_duration_nll"),
    (objective_module, "prior_log_likelihood"),
    (objective_module, "maximum_path"),
    (features_module, "linear_spectrogram"),
    (features_module, "log_mel_from_linear"),
]


@pytest.mark.parametrize("precision", [FP16, BF16], ids=["fp16", "bf16"])
def test_the_fp32_islands_hold_under_autocast(prepared_demo, monkeypatch, precision):
    """A whole training step under CPU autocast: the flow, the duration predictor (flows and spline),
    the alignment, the KL and every loss, and the spectrograms compute nothing in half precision, while
    the rest (encoders, decoder, discriminator) does."""
    model, step, batch = micro_setup(prepared_demo, precision)
    recorder = HalfArithmetic()
    for module, name in ISLAND_FUNCTIONS:
        monkeypatch.setattr(module, name, recorder.mark(name, getattr(module, name)))
    recorder.mark_module("flow", model.flow)
    recorder.mark_module("duration_predictor", model.duration_predictor)
    with recorder:
        terms = step.accumulate(batch, scale=1.0)
    assert recorder.inside == []
    expected = {name for _, name in ISLAND_FUNCTIONS} | {"flow"}
    assert expected <= recorder.entered  # every island really ran in this step
    assert recorder.outside > 50  # autocast really ran the rest in half precision
    assert all(t.dtype == torch.float32 and torch.isfinite(t) for t in terms.values())


def test_a_loss_called_under_autocast_still_computes_in_fp32():
    with torch.autocast("cpu", dtype=torch.float16):
        z_p, logs_q, m_p = (torch.randn(1, 4, 6).half() for _ in range(3))
        logs_p = torch.full((1, 4, 6), -6.0).half()  # exp(-2 logs_p) = 1.6e5: inf in fp16
        kl = losses_module.kl_loss(z_p, logs_q, m_p, logs_p, torch.ones(1, 1, 6))
    assert kl.dtype == torch.float32 and torch.isfinite(kl)


def fp16_run(step: TrainStep, batch, steps: int) -> list:
    return [step.run([batch]) for _ in range(steps)]


def test_fp16_training_from_a_pretrained_start_stays_finite_for_a_hundred_steps(prepared_demo):
    """After 30 fp32 steps, 120 fp16 steps: every loss finite, every weight finite, no window dropped as
    non-finite (fp16 overflow is the scaler's to skip, not a NaN in the losses), the scales settled rather
    than collapsing, and the weights moved. The scaler skips while its scale comes down from 2^16 to its
    level (near 2^8 for this voice's generator), then rarely: how often depends on the run's path on this
    CPU, so the bound is loose (a storm, the failure this guards against, skips most steps)."""
    model, step, batch = micro_setup(prepared_demo, FP32)
    fp16_run(step, batch, 30)  # "pretraining" in fp32
    pretrained = copy.deepcopy(model.state_dict())
    scaled = make_step(model, FP16, discriminator=step.discriminator)
    results = fp16_run(scaled, batch, 20)
    settling = scaled.skips.overflow
    results += fp16_run(scaled, batch, 100)
    assert all(r.applied for r in results)  # no non-finite loss reached the drop path
    assert all(math.isfinite(v) for r in results for v in r.losses.values())
    assert scaled.skips.overflow - settling <= 25
    assert scaled.scaler_g.get_scale() >= 2.0**3 and scaled.scaler_d.get_scale() >= 2.0**3
    assert all(torch.isfinite(p).all() for p in model.parameters())
    moved = [not torch.equal(v, pretrained[k]) for k, v in model.state_dict().items() if v.is_floating_point()]
    assert any(moved)


def test_the_scaler_skips_a_step_whose_gradients_overflow_and_recovers(prepared_demo):
    """Gradients made inf for real: the mel loss weighted 1e6 sends ~1e9 times the loss scale back into
    the decoder's fp16 backward, past fp16's 65504. The loss itself is finite, so the window is not
    dropped: the scaler finds the inf gradients, skips the generator's update and halves its scale; with
    the usual weight the scale grows back (every 3 clean steps here) and the updates apply again. The
    scales start below their natural level (see the test above), so only the injected step overflows."""
    model, step, batch = micro_setup(prepared_demo, FP16)
    step.scaler_g = torch.amp.GradScaler("cpu", init_scale=2.0**5, growth_interval=3)
    step.scaler_d = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    assert step.run([batch]).applied and step.skips.overflow == 0
    before = copy.deepcopy(model.state_dict())
    step.weights = LossWeights(mel=1e6)
    result = step.run([batch])
    assert math.isfinite(result.losses["generator"]) and not math.isfinite(result.grad_norm_generator)
    assert step.skips.overflow == 1 and step.scaler_g.get_scale() == 2.0**4
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key]), key  # the skipped step changed nothing
    step.weights = LossWeights()
    fp16_run(step, batch, 3)
    assert step.scaler_g.get_scale() == 2.0**5 and step.skips.overflow == 1
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items() if v.is_floating_point())
    assert step.scaler_figures() == {
        "loss_scale_generator": 2.0**5,
        "loss_scale_discriminator": 2.0**10,
        "fp16_overflow_skips": 1,
    }


# ---------------------------------------------------------------- out of memory inside an fp16 update


def out_of_memory_in(optimizer: torch.optim.Optimizer, times: int = 1) -> dict:
    """The optimizer's next `times` steps raise CUDA's out-of-memory error from inside the update, where
    AdamW's state or its temporaries would not fit (after both scalers have unscaled their gradients)."""
    state = {"left": times}

    def no_room(opt, args, kwargs):
        if state["left"] > 0:
            state["left"] -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 96.00 MiB")

    optimizer.register_step_pre_hook(no_room)
    return state


def low_scale_fp16(data_dir):
    """An fp16 step whose scalers start below the level where this tiny voice's gradients overflow (see the
    tests above), so that its first updates are applied, not skipped."""
    model, step, batch = micro_setup(data_dir, FP16)
    step.scaler_g = torch.amp.GradScaler("cpu", init_scale=2.0**5)
    step.scaler_d = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    return model, step, batch


def test_fp16_out_of_memory_inside_the_update_leaves_the_scalers_ready_for_the_next_step(prepared_demo):
    """The discriminator stepped, the generator's update ran out of memory: its scaler had unscaled and was
    never updated. The next step must run (a scaler left in that stage refuses: 'unscale_() has already been
    called'), at the scale the scaler had."""
    model, step, batch = low_scale_fp16(prepared_demo)
    assert step.run([batch]).applied and len(step.optimizer_g.state) > 0  # a real update, not an overflow skip
    scale = step.scaler_g.get_scale()
    out_of_memory_in(step.optimizer_g)
    failed = step.run([batch])
    assert failed.update_failed and not failed.applied and "inside the optimizer update" in failed.reason
    assert step.scaler_g.get_scale() == scale
    assert step.run([batch]).applied
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_going_back_frees_the_optimizer_state_before_loading_the_saved_one(prepared_demo, monkeypatch):
    """On a card that just ran out of memory, the saved optimizer state is loaded where the old one was,
    not beside it: the old state is gone when loading starts."""
    model, step, batch = low_scale_fp16(prepared_demo)
    step.run([batch])
    saved = copy.deepcopy(step.state_dict())
    step.run([batch])
    held_when_loading = []
    real_load = torch.optim.AdamW.load_state_dict

    def load(self, state_dict):
        held_when_loading.append(len(self.state))
        return real_load(self, state_dict)

    monkeypatch.setattr(torch.optim.AdamW, "load_state_dict", load)
    step.load_optimizers(saved)
    assert held_when_loading == [0, 0]
    assert len(step.optimizer_g.state) > 0 and step.run([batch]).applied


def fake_cuda(monkeypatch, count: int) -> list:
    """CUDA as this CPU machine cannot have it: `count` devices, and set_device checking its argument the way
    torch's own does (torch.cuda._utils._get_device_index raises ValueError on a device without an index)."""
    from torch.cuda._utils import _get_device_index

    chosen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: chosen.append(_get_device_index(device)))
    return chosen


def test_a_cuda_device_always_gets_an_index(monkeypatch):
    """--device auto or cuda on a GPU machine: a bare "cuda" made torch.cuda.set_device raise ValueError before
    training started (seen on the first lent H200); every CUDA device the tool picks carries its index."""
    from finetune.system.errors import ConfigError
    from finetune.training.assembly import pick_device

    chosen = fake_cuda(monkeypatch, count=2)
    assert pick_device("auto") == torch.device("cuda", 0)
    assert pick_device("cuda") == torch.device("cuda", 0)
    assert pick_device("cuda:1") == torch.device("cuda", 1)
    assert pick_device("cuda", local_rank=1) == torch.device("cuda", 1)
    assert chosen == [0, 0, 1, 1]
    with pytest.raises(ConfigError, match="--device cuda:2: this machine has 2 CUDA"):
        pick_device("cuda:2")


def listed_card(tmp_path, monkeypatch) -> None:
    """An nvidia-smi on PATH that lists a card, as on a machine with a GPU whose PyTorch install cannot use it
    (here: the CPU build the tests run on)."""
    program = tmp_path / "bin" / "nvidia-smi"
    program.parent.mkdir()
    program.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA GeForce RTX 2070 (UUID: GPU-0000)'\n")
    program.chmod(0o755)
    monkeypatch.setenv("PATH", f"{program.parent}:{os.environ['PATH']}")


def test_a_card_torch_cannot_use_is_an_error_that_names_the_fix_unless_the_cpu_is_asked_for(tmp_path, monkeypatch):
    """--device auto with a listed card and a CPU build of torch: before, 9.5 hours went to the CPU, said only as
    "device cpu" in one line. Synthesis (a sentence) may still take the CPU; the recipes' --device cpu too."""
    from finetune.system.errors import ConfigError
    from finetune.training.assembly import pick_device

    assert torch.version.cuda is None  # the suite's torch: the CPU build
    listed_card(tmp_path, monkeypatch)
    with pytest.raises(ConfigError, match=r"nvidia-smi lists GPU 0: NVIDIA GeForce RTX 2070.*CPU build.*--device cpu"):
        pick_device("auto", training=True)
    assert pick_device("cpu", training=True) == torch.device("cpu")
    assert pick_device("auto") == torch.device("cpu")  # synthesis, review: a sentence on the CPU is fine
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))  # no nvidia-smi at all: the CPU, as before
    assert pick_device("auto", training=True) == torch.device("cpu")
