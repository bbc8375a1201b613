"""The stochastic duration predictor trains in the flow order its inference path inverts (finetune/vits/duration.py)."""

import copy

import pytest
import torch
from transformers import VitsConfig
from transformers.models.vits.modeling_vits import VitsStochasticDurationPredictor

from finetune.vits.duration import stochastic_duration_nll, vits_order_flows

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
