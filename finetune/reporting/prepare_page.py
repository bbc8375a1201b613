"""prepare_report.html: what preparation kept, per speaker, and how the recordings sound by the numbers.

One self-contained page (plots inline as PNG): the counts and drops by reason, a table of speakers (clips,
hours, held-out clips, median noise estimate, clipping, silence, characters a second, DNSMOS when
measured), and histograms of each measure over all kept clips, so a person can choose thresholds for
prepare_data.py's quality flags and a --target_speaker for train_vits.py.
"""

from __future__ import annotations

import base64
import html
from pathlib import Path

from finetune.data.prepare import NotWritten, Tally
from finetune.reporting.plots import _figure, _save
from finetune.system.atomic import write_text_atomic
from finetune.system.disk import describe_failure

MEASURES = {
    "snr_db": "noise estimate (dB, higher is cleaner)",
    "silence": "silence share",
    "clipping": "clipped samples share",
    "chars_per_s": "characters a second",
    "dnsmos": "DNSMOS overall",
}
MAX_SPEAKER_ROWS = 200


def histogram(values: list[float], title: str) -> str:
    pyplot, figure = _figure(4.0, 2.4)
    axes = figure.add_subplot(1, 1, 1)
    axes.hist(values, bins=30, color="#4a7ab0")
    axes.set_title(title, fontsize=9)
    return base64.b64encode(_save(pyplot, figure, None)).decode()


def cell(value) -> str:
    if value is None:
        return "-"
    return f"{value:.3g}" if isinstance(value, float) else html.escape(str(value))


def write_page(data_dir: Path, report: dict, tally: Tally) -> None:
    """DATA_DIR/prepare_report.html from the report and the kept clips' measures; NotWritten (what to free)
    when the disk refuses it, as the report itself."""
    try:
        write_text_atomic(data_dir / "prepare_report.html", page(report, tally))
    except OSError as error:
        raise NotWritten(
            f"could not write {data_dir}/prepare_report.html: "
            f"{describe_failure(error, data_dir, 'it', 0)}; free space and run the same command again"
        ) from None


def page(report: dict, tally: Tally) -> str:
    speakers = report.get("speakers", {})
    columns = ["clips", "hours", "val_clips", *[m for m in MEASURES if any(m in s for s in speakers.values())]]
    rows = "".join(
        "<tr><td>" + html.escape(name) + "</td>" + "".join(f"<td>{cell(entry.get(c))}</td>" for c in columns) + "</tr>"
        for name, entry in list(speakers.items())[:MAX_SPEAKER_ROWS]
    )
    more = (
        f"<p>... and {len(speakers) - MAX_SPEAKER_ROWS} more (all in prepare_report.json)</p>"
        if len(speakers) > MAX_SPEAKER_ROWS
        else ""
    )
    plots = []
    for name, title in MEASURES.items():
        values = [clip.quality[name] for clip in tally.kept.values() if clip.quality.get(name) is not None]
        if values:
            plots.append(f'<img alt="{html.escape(title)}" src="data:image/png;base64,{histogram(values, title)}">')
    drops = "".join(
        f"<li>{html.escape(reason)}: {count} ({html.escape(report['drop_reasons'].get(reason, ''))})</li>"
        for reason, count in report.get("dropped_by_reason", {}).items()
    )
    counts = report["counts"]
    text = f"""<!doctype html><html><head><meta charset="utf-8"><title>prepare report</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;
padding:2px 8px;text-align:right}}td:first-child{{text-align:left}}</style></head><body>
<h1>Prepared corpus</h1>
<p>{counts["kept"]} clips kept of {counts["items"]} ({report["hours"]["kept"]:.2f} h) from {counts.get("speakers", 1)}
speaker(s); {counts["train"]} for training, {counts["val"]} held out; {counts["dropped"]} dropped.</p>
<ul>{drops}</ul>
<h2>Speakers (most hours first)</h2>
<table><tr><th>speaker</th>{"".join(f"<th>{html.escape(c)}</th>" for c in columns)}</tr>{rows}</table>{more}
<h2>Quality of the kept clips</h2>
{"".join(plots)}
<p>Every clip's figures: quality.csv. Drop by them with prepare_data.py --min_snr_db, --max_clipping,
--max_silence, --max_rate_deviation, --min_dnsmos.</p>
</body></html>
"""
    return text
