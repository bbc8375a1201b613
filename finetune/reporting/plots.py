"""The run's figures as images, drawn with matplotlib (no display needed): curves from metrics.jsonl for
the run report, and a generated-vs-recorded mel spectrogram for TensorBoard and the report."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np


def _figure(width: float = 7.0, height: float = 3.0):
    import matplotlib

    matplotlib.use("Agg")  # files only: works on a server with no display
    from matplotlib import pyplot

    return pyplot, pyplot.figure(figsize=(width, height), dpi=100)


# A figure's margins in inches, fixed: room for tick labels of up to about 7 characters, an axis label
# and a one-line title. tight_layout measured every label to fit them and cost a third of each figure
# (0.63 against 0.41 s for a run report's five curves, bench/RESULTS.md). tests/test_plots.py draws every
# figure at the extremes a run can log and checks that no label reaches an edge.
MARGINS_IN = {"left": 0.85, "right": 0.15, "bottom": 0.5, "top": 0.35}
TICKS = 5  # at most this many labelled ticks an axis (matplotlib's default, up to 10, drew each figure 10-20% slower)
ROW_GAP_IN = 0.55  # between stacked axes: the lower one's title and the upper one's tick labels
CHARACTER_IN = 0.085  # a tick label's character at the default 10 pt, with room to spare


def _lay_out(figure, left_in: float = MARGINS_IN["left"]) -> None:
    width, height = figure.get_size_inches()
    rows = max(1, len(figure.axes))  # stacked one above the other, as every figure here is
    row_height = (height - MARGINS_IN["bottom"] - MARGINS_IN["top"] - (rows - 1) * ROW_GAP_IN) / rows
    figure.subplots_adjust(
        left=left_in / width,
        right=1 - MARGINS_IN["right"] / width,
        bottom=MARGINS_IN["bottom"] / height,
        top=1 - MARGINS_IN["top"] / height,
        hspace=ROW_GAP_IN / row_height,  # a fraction of the axes' height
    )


def _save(pyplot, figure, path: Path | None, left_in: float = MARGINS_IN["left"]) -> bytes:
    buffer = io.BytesIO()
    _lay_out(figure, left_in)
    figure.savefig(buffer, format="png")
    pyplot.close(figure)
    data = buffer.getvalue()
    if path is not None:
        path.write_bytes(data)
    return data


def mel_comparison_rgb(generated: np.ndarray, recorded: np.ndarray, title: str) -> np.ndarray:
    """Two log-mels [n_mels, frames] one above the other, as an RGB image [height, width, 3] (uint8)."""
    pyplot, figure = _figure(7.0, 4.0)
    low, high = float(np.min(recorded)), float(np.max(recorded))
    for row, (label, mel) in enumerate((("synthesised from text", generated), ("recording", recorded)), start=1):
        axis = figure.add_subplot(2, 1, row)
        axis.imshow(mel, origin="lower", aspect="auto", vmin=low, vmax=high, interpolation="nearest")
        axis.set_ylabel("mel band")
        axis.set_title(f"{title}: {label}" if row == 1 else label, fontsize=9)
    axis.set_xlabel("frame")
    _lay_out(figure)
    figure.canvas.draw()  # the pixels themselves: no PNG encoded here only to be decoded again
    rgb = np.ascontiguousarray(np.asarray(figure.canvas.buffer_rgba())[:, :, :3])
    pyplot.close(figure)
    return rgb


def curves(
    path: Path,
    title: str,
    xlabel: str,
    ylabel: str,
    series: dict[str, tuple[list, list]],
    log_y: bool = False,
    bands: list[tuple[float, float, str]] = (),
    errors: dict[str, list[float]] | None = None,
) -> None:
    """Line plot of named (x, y) series to a PNG; `bands` shade horizontal ranges (low, high, label);
    `errors` shade each named series' y +/- its error (one per point, nan: none)."""
    pyplot, figure = _figure()
    axis = figure.add_subplot(1, 1, 1)
    for name, (xs, ys) in series.items():
        if xs:
            (line,) = axis.plot(xs, ys, label=name, marker="o" if len(xs) < 30 else None, markersize=3)
            spread = np.nan_to_num(np.asarray((errors or {}).get(name, []), dtype=float))
            if len(spread) == len(ys) and spread.any():
                axis.fill_between(
                    xs,
                    np.asarray(ys) - spread,
                    np.asarray(ys) + spread,
                    alpha=0.2,
                    color=line.get_color(),
                    label=f"{name} ± its standard error",
                )
    for low, high, label in bands:
        axis.axhspan(low, high, alpha=0.12, color="green", label=label)
    from matplotlib.ticker import MaxNLocator

    axis.xaxis.set_major_locator(MaxNLocator(TICKS))
    if log_y:
        axis.set_yscale("log")
    else:
        axis.yaxis.set_major_locator(MaxNLocator(TICKS))
    axis.set_title(title, fontsize=10, y=1.0)  # fixed at the top, where no tick labels are: none measured to place it
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    if len(series) > 1 or bands:
        axis.legend(fontsize=8)
    axis.grid(alpha=0.3)
    _save(pyplot, figure, path)


def bars(path: Path, title: str, values: dict[str, float], unit: str) -> None:
    pyplot, figure = _figure(7.0, 2.6)
    axis = figure.add_subplot(1, 1, 1)
    names = list(values)
    axis.barh(names, [values[n] for n in names])
    axis.invert_yaxis()
    axis.set_title(title, fontsize=10)
    axis.set_xlabel(unit)
    axis.grid(alpha=0.3, axis="x")
    _save(pyplot, figure, path, left_in=0.3 + CHARACTER_IN * max(map(len, names), default=0))  # the names, left
