"""The VITS discriminator: one scale discriminator on raw audio plus period discriminators (2, 3, 5, 7,
11), each returning a score map and its intermediate features (for feature matching).

Module names follow the original VITS (`discriminators.<i>.convs.<j>`, `conv_post`; the scale
discriminator first), so an original `D_*.pth` loads after renaming its weight-norm keys
(`weight_g`/`weight_v` -> `parametrizations.weight.original0/1`). The size is configurable: `width`
scales every channel count (1.0 is the standard 46.7M parameters, which on a CPU with a tiny generator
is nearly all of a step's time); extra `scales` add HiFi-GAN-style discriminators on average-pooled
audio, after the original ones so the original layout stays intact; `scales` 0 leaves the period
discriminators alone (a layout finetune-hf-vits can also hold at any width, for a side-by-side start).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from finetune.system.model_source import ModelSourceError

LEAKY_SLOPE = 0.1
FORMAT_NAME = "vits-finetune-discriminator"
PERIOD_CHANNELS = (32, 128, 512, 1024, 1024)
SCALE_CHANNELS = (16, 64, 256, 1024, 1024, 1024)
SCALE_GROUPS = (1, 4, 16, 64, 256, 1)
SCALE_KERNELS = (15, 41, 41, 41, 41, 5)
SCALE_STRIDES = (1, 4, 4, 4, 4, 1)


@dataclass(frozen=True)
class DiscriminatorConfig:
    periods: tuple[int, ...] = (2, 3, 5, 7, 11)
    width: float = 1.0  # channel multiplier; 1.0 = original VITS (46.7M parameters)
    scales: int = 1  # scale discriminators; 1 = original VITS, more add pooled-audio ones, 0 = periods alone

    def __post_init__(self):
        if self.scales < 0 or (self.scales == 0 and not self.periods):
            raise ValueError(
                f"a discriminator needs at least one sub-discriminator: scales {self.scales}, "
                f"periods {list(self.periods)}"
            )

    def to_dict(self) -> dict:
        return {**asdict(self), "periods": list(self.periods)}


def scaled(channels: int, width: float) -> int:
    return max(1, int(round(channels * width)))


def run_layers(convs: nn.ModuleList, post: nn.Module, hidden: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Convolutions with leaky ReLU, then the output layer: (flattened scores, every layer's output)."""
    features = []
    for conv in convs:
        hidden = F.leaky_relu(conv(hidden), LEAKY_SLOPE)
        features.append(hidden)
    hidden = post(hidden)
    features.append(hidden)
    return torch.flatten(hidden, 1, -1), features


class PeriodDiscriminator(nn.Module):
    """Audio [batch, 1, samples] folded into [batch, 1, samples / period, period], 2-D convolutions."""

    def __init__(self, period: int, width: float):
        super().__init__()
        self.period = period
        channels = [1] + [scaled(c, width) for c in PERIOD_CHANNELS]
        self.convs = nn.ModuleList(
            weight_norm(nn.Conv2d(channels[i], channels[i + 1], (5, 1), (3 if i < 4 else 1, 1), padding=(2, 0)))
            for i in range(5)
        )
        self.conv_post = weight_norm(nn.Conv2d(channels[-1], 1, (3, 1), 1, padding=(1, 0)))

    def forward(self, audio: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        batch, chans, samples = audio.shape
        if samples % self.period:
            audio = F.pad(audio, (0, self.period - samples % self.period), mode="reflect")
        return run_layers(self.convs, self.conv_post, audio.view(batch, chans, -1, self.period))


class ScaleDiscriminator(nn.Module):
    """Grouped 1-D convolutions over raw (or pooled) audio [batch, 1, samples]."""

    def __init__(self, width: float):
        super().__init__()
        channels = [1] + [scaled(c, width) for c in SCALE_CHANNELS]
        convs = []
        for i in range(6):
            groups = max(1, int(round(SCALE_GROUPS[i] * width))) if SCALE_GROUPS[i] > 1 else 1
            if channels[i] % groups or channels[i + 1] % groups:
                raise ValueError(
                    f"discriminator width {width} gives {channels[i]}->{channels[i + 1]} channels "
                    f"in {groups} groups; use a power-of-two width such as 1, 0.5, 0.25, 0.0625"
                )
            kernel = SCALE_KERNELS[i]
            convs.append(
                weight_norm(
                    nn.Conv1d(
                        channels[i], channels[i + 1], kernel, SCALE_STRIDES[i], groups=groups, padding=(kernel - 1) // 2
                    )
                )
            )
        self.convs = nn.ModuleList(convs)
        self.conv_post = weight_norm(nn.Conv1d(channels[-1], 1, 3, 1, padding=1))

    def forward(self, audio: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        return run_layers(self.convs, self.conv_post, audio)


class Discriminator(nn.Module):
    """All sub-discriminators; `forward(audio)` -> (scores per sub-discriminator, features per sub-discriminator)."""

    def __init__(self, config: DiscriminatorConfig = DiscriminatorConfig()):
        super().__init__()
        self.config = config
        subs: list[nn.Module] = [ScaleDiscriminator(config.width)] if config.scales >= 1 else []
        subs += [PeriodDiscriminator(p, config.width) for p in config.periods]
        subs += [ScaleDiscriminator(config.width) for _ in range(config.scales - 1)]
        self.discriminators = nn.ModuleList(subs)
        self.pool = nn.AvgPool1d(4, 2, padding=2)
        self.first_extra_scale = min(1, config.scales) + len(config.periods)

    def forward(self, audio: torch.Tensor) -> tuple[list[torch.Tensor], list[list[torch.Tensor]]]:
        scores, features = [], []
        pooled = audio
        for index, sub in enumerate(self.discriminators):
            if index >= self.first_extra_scale:
                pooled = self.pool(pooled)  # each extra scale sees audio at half the previous rate
            score, feats = sub(pooled if index >= self.first_extra_scale else audio)
            scores.append(score)
            features.append(feats)
        return scores, features


def parameter_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


# ---------------------------------------------------------------- saving and loading


def save_discriminator(discriminator: Discriminator, path: str | Path) -> None:
    """Our format: {"format", "version", "config", "state_dict"} (written by the caller atomically)."""
    torch.save(
        {
            "format": FORMAT_NAME,
            "version": 1,
            "config": discriminator.config.to_dict(),
            "state_dict": discriminator.state_dict(),
        },
        str(path),
    )


def to_original_layout(discriminator: Discriminator) -> dict[str, torch.Tensor]:
    """Our weights under the original VITS key names (old-style weight norm: weight_g, weight_v), as an
    original D_*.pth's "model" holds them."""
    renamed = {}
    for key, value in discriminator.state_dict().items():
        key = key.replace("parametrizations.weight.original0", "weight_g").replace(
            "parametrizations.weight.original1", "weight_v"
        )
        renamed[key] = value
    return renamed


def from_original_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Original VITS key names (old-style weight norm, maybe a DDP 'module.' prefix) -> ours."""
    renamed = {}
    for key, value in state.items():
        key = key.removeprefix("module.")
        if key.endswith(".weight_g"):
            key = key[: -len("weight_g")] + "parametrizations.weight.original0"
        elif key.endswith(".weight_v"):
            key = key[: -len("weight_v")] + "parametrizations.weight.original1"
        renamed[key] = value
    return renamed


def infer_original_config(state: dict[str, torch.Tensor]) -> DiscriminatorConfig:
    """The original layout is one scale discriminator then periods 2, 3, 5, 7, 11; the width comes
    from the first period discriminator's first layer (32 channels at width 1)."""
    count = len({k.split(".")[1] for k in state if k.startswith("discriminators.")})
    if count != 6:
        raise ModelSourceError(f"an original VITS discriminator has 6 sub-discriminators; this one has {count}")
    first = state["discriminators.1.convs.0.parametrizations.weight.original1"]
    return DiscriminatorConfig(periods=(2, 3, 5, 7, 11), width=first.shape[0] / PERIOD_CHANNELS[0], scales=1)


@dataclass
class LoadedDiscriminator:
    discriminator: Discriminator
    source: str  # what was loaded, for the log
    extra: dict = field(default_factory=dict)


def load_discriminator(path: str | Path) -> LoadedDiscriminator:
    """Load ours (discriminator.pt) or an original VITS D_*.pth ({"model": state_dict, ...}) or a bare
    state dict in the original layout. Raises ValueError naming what was found when it is neither."""
    saved = torch.load(str(path), map_location="cpu", weights_only=True)
    if isinstance(saved, dict) and saved.get("format") == FORMAT_NAME:
        cfg = saved["config"]
        config = DiscriminatorConfig(periods=tuple(cfg["periods"]), width=cfg["width"], scales=cfg["scales"])
        discriminator = Discriminator(config)
        discriminator.load_state_dict(saved["state_dict"])
        return LoadedDiscriminator(discriminator, f"{path} (this tool's format)")
    state = saved.get("model", saved) if isinstance(saved, dict) else None
    if not isinstance(state, dict) or not any(
        str(k).removeprefix("module.").startswith("discriminators.") for k in state
    ):
        found = sorted(saved)[:8] if isinstance(saved, dict) else type(saved).__name__
        raise ModelSourceError(
            f"--discriminator {path}: neither this tool's discriminator.pt nor an original VITS "
            f"D_*.pth (found keys {found})"
        )
    state = from_original_layout(state)
    discriminator = Discriminator(infer_original_config(state))
    discriminator.load_state_dict(state)
    iteration = saved.get("iteration") if isinstance(saved, dict) else None
    return LoadedDiscriminator(discriminator, f"{path} (original VITS layout, iteration {iteration})")
