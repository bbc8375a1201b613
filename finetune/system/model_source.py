"""Where a model comes from: a Hugging Face hub id, a local folder, or `scratch:<size>`.

Hub ids are resolved here rather than handed straight to `from_pretrained`: offline, transformers retries
for minutes and then fails with an unrelated TypeError. We look in the local hub cache first, then probe
the hub for a few seconds, then download; when that cannot work we say which flag gets the user going.

`scratch:<size>` means no pretrained weights: a fresh VITS of a named size whose vocabulary is built
from the training text (the demo uses `scratch:tiny`, the tests `scratch:micro`; neither needs a network).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from finetune.system.errors import ToolError

SCRATCH_PREFIX = "scratch"
SCRATCH_SIZES = ("micro", "tiny", "small", "mms")
DEFAULT_SAMPLE_RATE = 16_000
HUB_PROBE_TIMEOUT_S = 5.0


class ModelSourceError(ToolError):
    """The model named by --model_name cannot be used; the message says what to do instead."""


@dataclass(frozen=True)
class ModelSource:
    name: str  # as the user gave it
    local_dir: Path | None  # folder holding config.json / vocab.json; None when training from scratch
    scratch_size: str | None  # one of SCRATCH_SIZES for scratch models

    @property
    def is_scratch(self) -> bool:
        return self.scratch_size is not None


def parse_scratch(name: str) -> str | None:
    """'scratch' -> 'tiny', 'scratch:small' -> 'small', anything else -> None."""
    if name != SCRATCH_PREFIX and not name.startswith(SCRATCH_PREFIX + ":"):
        return None
    size = name.partition(":")[2] or "tiny"
    if size not in SCRATCH_SIZES:
        raise ModelSourceError(
            f"unknown scratch size {size!r} in --model_name {name}: use one of "
            + ", ".join(f"scratch:{s}" for s in SCRATCH_SIZES)
        )
    return size


def hub_endpoint() -> tuple[str, int]:
    url = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co"))
    return url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80)


def hub_reachable(timeout_s: float = HUB_PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to the hub opens within `timeout_s` (and HF_HUB_OFFLINE is not set)."""
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        return False
    try:
        with socket.create_connection(hub_endpoint(), timeout=timeout_s):
            return True
    except OSError:
        return False


def offline_advice(kind: str, repo_id: str, flag: str) -> str:
    host, _ = hub_endpoint()
    command = f"hf download {repo_id}" + (" --repo-type dataset" if kind == "dataset" else "") + " --local-dir DIR"
    return (
        f"cannot reach the Hugging Face hub ({host}) to download the {kind} {repo_id!r}, and it is not in "
        f"the local hub cache. On a machine with network run `{command}`, copy DIR here and pass {flag} DIR"
    )


def download_model(repo_id: str) -> Path:
    """The local folder of a hub model: from the hub cache, else downloaded (config, weights, tokenizer)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    patterns = ["*.json", "*.safetensors", "*.txt", "*.model"]
    try:
        return Path(snapshot_download(repo_id, allow_patterns=patterns, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    if not hub_reachable():
        raise ModelSourceError(
            offline_advice("model", repo_id, "--model_name") + ", or train from scratch with --model_name scratch:tiny"
        )
    return Path(snapshot_download(repo_id, allow_patterns=patterns))


def resolve_model(name: str) -> ModelSource:
    """Turn --model_name into a ModelSource, downloading hub models when needed."""
    scratch = parse_scratch(name)
    if scratch is not None:
        return ModelSource(name=name, local_dir=None, scratch_size=scratch)
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file() and not (path / "vocab.json").is_file():
            raise ModelSourceError(
                f"--model_name {name}: the folder has no config.json or vocab.json; "
                "give a folder written by save_pretrained (or by this tool)"
            )
        return ModelSource(name=name, local_dir=path, scratch_size=None)
    if path.exists() or name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise ModelSourceError(f"--model_name {name}: no such model folder")
    return ModelSource(name=name, local_dir=download_model(name), scratch_size=None)


def load_tokenizer(source: ModelSource):
    """The model's VitsTokenizer, refusing the kinds whose text this tool cannot check (phonemes, uroman)."""
    from transformers import VitsTokenizer

    if source.local_dir is None or not (source.local_dir / "vocab.json").is_file():
        raise ModelSourceError(
            f"--model_name {source.name}: no vocab.json, so no tokenizer to take the vocabulary from"
        )
    tokenizer = VitsTokenizer.from_pretrained(str(source.local_dir))
    if tokenizer.phonemize:
        raise ModelSourceError(
            f"{source.name}: its tokenizer turns text into phonemes with espeak "
            "(phonemizer); only character-vocabulary models such as MMS are supported"
        )
    if getattr(tokenizer, "is_uroman", False):
        raise ModelSourceError(
            f"{source.name}: its tokenizer romanises text with uroman; give text already "
            "in Latin script and a model without is_uroman"
        )
    return tokenizer


def model_vocabulary(source: ModelSource) -> frozenset[str] | None:
    """The characters the model can say, or None (open vocabulary) for a scratch model."""
    if source.is_scratch:
        return None
    tokenizer = load_tokenizer(source)
    return frozenset(token for token in tokenizer.encoder if isinstance(token, str) and len(token) == 1)


def model_sample_rate(source: ModelSource) -> int:
    """The model's audio rate from its config.json (16 kHz for MMS and for scratch models)."""
    if source.is_scratch or source.local_dir is None or not (source.local_dir / "config.json").is_file():
        return DEFAULT_SAMPLE_RATE
    from transformers import VitsConfig

    return int(VitsConfig.from_pretrained(str(source.local_dir)).sampling_rate)
