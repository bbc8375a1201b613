"""One line saying what machine a benchmark ran on: CPU model, cores, RAM, GPU, library versions."""

from __future__ import annotations

import os
import platform


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo", encoding="utf-8"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def describe() -> str:
    import psutil

    parts = [f"{cpu_model()}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.0f} GiB RAM"]
    try:
        import torch

        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            parts.append(f"GPU {props.name} ({props.total_memory / 2**30:.0f} GiB)")
        else:
            parts.append("no GPU")
        parts.append(f"torch {torch.__version__}")
    except ImportError:
        parts.append("torch not installed")
    parts.append(f"Python {platform.python_version()}")
    return "; ".join(parts)


if __name__ == "__main__":
    print(describe())
