"""Discriminator: size, outputs, and loading both the original VITS D_*.pth layout and our own format."""

import warnings

import pytest
import torch
from torch import nn

from finetune.system.model_source import ModelSourceError
from finetune.vits.discriminator import (
    Discriminator,
    DiscriminatorConfig,
    load_discriminator,
    parameter_count,
    save_discriminator,
)


def test_standard_size_is_the_vits_discriminator():
    assert round(parameter_count(Discriminator(DiscriminatorConfig())) / 1e6, 1) == 46.7


def test_one_score_and_feature_list_per_sub_discriminator():
    d = Discriminator(DiscriminatorConfig(width=0.0625, periods=(2, 3), scales=2))
    scores, features = d(torch.randn(2, 1, 8192))
    assert len(scores) == len(features) == 1 + 2 + 1
    assert all(s.shape[0] == 2 for s in scores)
    assert all(len(f) == 6 for f in features[1:3])  # period: 5 convs + post
    assert len(features[0]) == 7  # scale: 6 convs + post


def old_weight_norm(layer: nn.Module) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.nn.utils.weight_norm(layer)  # the pre-parametrization API that wrote weight_g/weight_v


def original_layout_state(width: float) -> dict:
    """A state dict named and shaped as jaywalnut310/vits' MultiPeriodDiscriminator (built here from
    its published layer table, with the old weight-norm API), at a channel width multiplier."""
    c = lambda n: max(1, int(round(n * width)))  # noqa: E731
    root = nn.Module()
    root.discriminators = nn.ModuleList()
    scale = nn.Module()
    spec = [
        (1, c(16), 15, 1, 1, 7),
        (c(16), c(64), 41, 4, 4, 20),
        (c(64), c(256), 41, 4, 16, 20),
        (c(256), c(1024), 41, 4, 64, 20),
        (c(1024), c(1024), 41, 4, 256, 20),
        (c(1024), c(1024), 5, 1, 1, 2),
    ]
    scale.convs = nn.ModuleList(
        old_weight_norm(nn.Conv1d(i, o, k, s, groups=max(1, int(round(g * width))) if g > 1 else 1, padding=p))
        for i, o, k, s, g, p in spec
    )
    scale.conv_post = old_weight_norm(nn.Conv1d(c(1024), 1, 3, 1, padding=1))
    root.discriminators.append(scale)
    for _period in (2, 3, 5, 7, 11):
        period = nn.Module()
        chans = [1, c(32), c(128), c(512), c(1024), c(1024)]
        period.convs = nn.ModuleList(
            old_weight_norm(nn.Conv2d(chans[i], chans[i + 1], (5, 1), (3 if i < 4 else 1, 1), padding=(2, 0)))
            for i in range(5)
        )
        period.conv_post = old_weight_norm(nn.Conv2d(c(1024), 1, (3, 1), 1, padding=(1, 0)))
        root.discriminators.append(period)
    return root.state_dict()


def test_original_vits_checkpoint_layout_loads(tmp_path):
    state = original_layout_state(0.0625)
    assert any(k.endswith("weight_g") for k in state)
    path = tmp_path / "D_5000.pth"
    torch.save({"model": state, "iteration": 5000, "optimizer": {}, "learning_rate": 2e-4}, path)
    loaded = load_discriminator(path)
    assert "original VITS layout" in loaded.source and loaded.discriminator.config.width == 0.0625
    ours = loaded.discriminator.state_dict()
    g = ours["discriminators.3.convs.2.parametrizations.weight.original0"]
    assert torch.equal(g, state["discriminators.3.convs.2.weight_g"])
    assert torch.equal(ours["discriminators.0.conv_post.bias"], state["discriminators.0.conv_post.bias"])
    # and it computes the same function as the weights it was given
    torch.manual_seed(0)
    audio = torch.randn(1, 1, 4096)
    v, g = state["discriminators.1.convs.0.weight_v"], state["discriminators.1.convs.0.weight_g"]
    weight = g * v / v.flatten(1).norm(dim=1).view(-1, 1, 1, 1)
    folded = torch.nn.functional.conv2d(
        audio.view(1, 1, -1, 2), weight, state["discriminators.1.convs.0.bias"], (3, 1), (2, 0)
    )
    assert torch.allclose(loaded.discriminator.discriminators[1].convs[0](audio.view(1, 1, -1, 2)), folded, atol=1e-5)


def test_our_format_round_trips(tmp_path):
    original = Discriminator(DiscriminatorConfig(width=0.125, periods=(2, 5), scales=2))
    save_discriminator(original, tmp_path / "discriminator.pt")
    loaded = load_discriminator(tmp_path / "discriminator.pt")
    assert loaded.discriminator.config == original.config
    for key, value in original.state_dict().items():
        assert torch.equal(value, loaded.discriminator.state_dict()[key])


def test_something_else_is_refused_with_what_was_found(tmp_path):
    torch.save({"weights": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ModelSourceError, match="weights"):
        load_discriminator(tmp_path / "other.pt")
