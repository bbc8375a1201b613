"""The stochastic duration predictor trains in the flow order its inference path inverts (finetune/vits/duration.py)."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import VitsConfig
from transformers.models.vits.modeling_vits import VitsStochasticDurationPredictor

from finetune.vits.duration import conv_flow, rational_quadratic_spline, stochastic_duration_nll, vits_order_flows

CLASS_FRAMES = torch.tensor([2.0, 5.0, 9.0, 14.0])  # frames per token, by token class


def predictor(seed: int = 0, hidden: int = 16):
    torch.manual_seed(seed)
    config = VitsConfig(hidden_size=hidden, duration_predictor_num_flows=4, duration_predictor_dropout=0.0)
    return VitsStochasticDurationPredictor(config), torch.nn.Embedding(4, hidden)


def text_conditioning(sdp, hidden, mask):
    """What both directions condition the main flows on (transformers' own preamble)."""
    return sdp.conv_proj(sdp.conv_dds(sdp.conv_pre(hidden), mask)) * mask


def inference_chain(sdp, hidden, mask, z, monkeypatch):
    """transformers' own inference path (reverse=True), fed `z` as its noise."""
    with monkeypatch.context() as patch:
        patch.setattr(torch, "randn", lambda *shape, **kwargs: z.clone())
        return sdp(hidden, mask, reverse=True, noise_scale=1.0)


def transformers_training_order(flows, z, mask, conditioning):
    """transformers' training path: a flip after every flow, the elementwise affine's included."""
    for flow in flows:
        z, _ = flow(z, mask, global_conditioning=conditioning)
        z = torch.flip(z, [1])
    return z


def test_inference_inverts_the_training_chain_in_float64(monkeypatch):
    sdp, _ = predictor()
    sdp = sdp.double().eval()
    torch.manual_seed(1)
    hidden = torch.randn(2, 16, 7, dtype=torch.float64)
    mask = torch.ones(2, 1, 7, dtype=torch.float64)
    log_durations = torch.randn(2, 1, 7, dtype=torch.float64)
    z = torch.cat([log_durations, torch.randn(2, 1, 7, dtype=torch.float64)], dim=1)
    with torch.no_grad():
        conditioning = text_conditioning(sdp, hidden, mask)
        ours, _ = vits_order_flows(sdp.flows, z, mask, conditioning)
        assert torch.allclose(inference_chain(sdp, hidden, mask, ours, monkeypatch), log_durations, atol=1e-10)
        # transformers' training order is not what its inference inverts: that was the bug.
        theirs = transformers_training_order(sdp.flows, z, mask, conditioning)
        assert not torch.allclose(inference_chain(sdp, hidden, mask, theirs, monkeypatch), log_durations, atol=1e-3)


def train(sdp, embedding, steps: int, lr: float, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW([*sdp.parameters(), *embedding.parameters()], lr=lr, betas=(0.8, 0.99))
    sdp.train()
    for _ in range(steps):
        classes = torch.randint(0, 4, (4, 16), generator=generator)
        mask = torch.ones(4, 1, 16)
        nll = stochastic_duration_nll(sdp, embedding(classes).transpose(1, 2), mask, CLASS_FRAMES[classes].unsqueeze(1))
        optimizer.zero_grad()
        (nll.sum() / mask.sum()).backward()
        optimizer.step()


def predicted_frames(sdp, embedding) -> torch.Tensor:
    """Median frames per token class at inference (noise scale 0.8, as MMS configs set), 50 tokens a class."""
    sdp.eval()
    classes = torch.arange(4).repeat(50).unsqueeze(0)
    torch.manual_seed(7)
    with torch.no_grad():
        log_w = sdp(embedding(classes).transpose(1, 2), torch.ones(1, 1, 200), reverse=True, noise_scale=0.8)
    frames = torch.ceil(torch.exp(log_w))[0, 0]
    return torch.stack([frames[classes[0] == c].median() for c in range(4)])


@pytest.fixture(scope="module")
def pretrained():
    sdp, embedding = predictor()
    train(sdp, embedding, steps=150, lr=3e-3, seed=0)
    return sdp, embedding


def test_a_predictor_trained_through_our_loss_predicts_those_durations(pretrained):
    assert torch.all((predicted_frames(*pretrained) - CLASS_FRAMES).abs() <= 1.0), predicted_frames(*pretrained)


def test_a_pretrained_predictor_keeps_its_predictions_under_fine_tuning(pretrained):
    sdp, embedding = copy.deepcopy(pretrained[0]), copy.deepcopy(pretrained[1])
    train(sdp, embedding, steps=150, lr=1e-4, seed=1)
    assert torch.all((predicted_frames(sdp, embedding) - CLASS_FRAMES).abs() <= 1.0), predicted_frames(sdp, embedding)


def spline_inputs(seed: int, tail_bound: float = 5.0):
    """Random spline inputs in float64, a third of x outside [-tail_bound, tail_bound], one exactly at each bound."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 1, 40, generator=generator, dtype=torch.float64) * tail_bound * 0.9
    x[0, 0, :2] = torch.tensor([-tail_bound, tail_bound])
    raw = [torch.randn(3, 1, 40, n, generator=generator, dtype=torch.float64) for n in (10, 10, 9)]
    return [t.requires_grad_() for t in (x, *raw)]


def test_the_spline_computes_what_transformers_computes_values_and_gradients():
    """Every position computed and chosen by torch.where (no boolean gathers): the same outputs,
    log-determinants and gradients as transformers' spline, inside the interval, outside it and at its ends."""
    from transformers.models.vits.modeling_vits import _unconstrained_rational_quadratic_spline

    inputs = spline_inputs(seed=3)
    assert (inputs[0].abs() > 5).float().mean() > 0.2
    ours = rational_quadratic_spline(*inputs, tail_bound=5.0)
    ours_grads = torch.autograd.grad(sum(t.square().sum() for t in ours), inputs)
    theirs = _unconstrained_rational_quadratic_spline(*inputs, reverse=False, tail_bound=5.0)
    their_grads = torch.autograd.grad(sum(t.square().sum() for t in theirs), inputs)
    for a, b in zip([*ours, *ours_grads], [*theirs, *their_grads]):
        assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


def test_the_conv_flow_computes_what_transformers_computes():
    sdp, _ = predictor()
    sdp = sdp.double()
    torch.manual_seed(2)
    z, conditioning = torch.randn(2, 2, 9, dtype=torch.float64) * 4, torch.randn(2, 16, 9, dtype=torch.float64)
    mask = torch.ones(2, 1, 9, dtype=torch.float64)
    mask[1, :, 6:] = 0
    for flow in sdp.flows[1:]:
        for a, b in zip(conv_flow(flow, z, mask, conditioning), flow(z, mask, global_conditioning=conditioning)):
            assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)


class HostWaits(TorchDispatchMode):
    """Counts the operations that make the host wait for a GPU: a tensor read on the host (item), nonzero,
    and indexing with a boolean mask (a nonzero inside). On the CPU they are visible without a GPU."""

    def __init__(self):
        super().__init__()
        self.found: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        indices = args[1] if name.startswith("index") and len(args) > 1 and isinstance(args[1], (list, tuple)) else []
        if name in ("_local_scalar_dense", "nonzero", "masked_select") or any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in indices
        ):
            self.found.append(name)
        return func(*args, **(kwargs or {}))


def test_the_duration_loss_never_makes_the_host_wait_for_the_gpu():
    """Forwards and backwards: transformers' spline made about 140 such waits a micro-batch of the MMS predictor
    on CUDA (profiled on an H200), which keep the CPU from queueing kernels while the GPU works."""
    sdp, embedding = predictor()
    classes = torch.randint(0, 4, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 1, 12)
    mask[2, :, 8:] = 0
    with HostWaits() as waits:
        nll = stochastic_duration_nll(sdp, embedding(classes).transpose(1, 2), mask, CLASS_FRAMES[classes].unsqueeze(1))
        nll.sum().backward()
    assert waits.found == []


def test_durations_far_outside_the_spline_leave_the_loss_finite():
    """A runaway predictor (every value outside the spline's interval; transformers' gather of nothing
    raised a RuntimeError there) gives a finite loss and finite gradients."""
    sdp, embedding = predictor()
    with torch.no_grad():
        sdp.flows[0].translate.fill_(1e3)  # the elementwise affine throws every value far outside [-5, 5]
    classes = torch.randint(0, 4, (2, 6), generator=torch.Generator().manual_seed(0))
    nll = stochastic_duration_nll(
        sdp, embedding(classes).transpose(1, 2), torch.ones(2, 1, 6), CLASS_FRAMES[classes].unsqueeze(1)
    )
    nll.sum().backward()
    assert torch.isfinite(nll).all()
    assert all(torch.isfinite(p.grad).all() for p in sdp.parameters() if p.grad is not None)


def test_a_nan_passes_through_the_spline_as_transformers_lets_it():
    """A NaN input (what an overflowed encoder hands on) comes out as NaN at its position and nowhere else;
    it must not find no bin (an out-of-bounds gather, a device assert on CUDA): the step's non-finite guard
    then drops the step."""
    x, *raw = spline_inputs(seed=4)
    x = x.detach().clone()
    x[1, 0, 3] = float("nan")
    y, log_abs_det = rational_quadratic_spline(x, *raw, tail_bound=5.0)
    assert torch.isnan(y[1, 0, 3]) and torch.isfinite(log_abs_det[1, 0, 3])
    y[1, 0, 3] = 0.0
    assert torch.isfinite(y).all() and torch.isfinite(log_abs_det).all()
