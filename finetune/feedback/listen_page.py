"""listen.html: a round's corrections on one page, each with its recording, the voice before and after, and the
words the voice said differently from the recording (finetune/feedback/differences.py), under the round's report.
"""

from __future__ import annotations

import html
from pathlib import Path

from finetune.feedback import differences
from finetune.system.atomic import write_text_atomic


def write_page(path: Path, examples: list, texts: dict[str, str], before: dict, after: dict, report: str) -> None:
    rows = []
    for example in examples:
        item = example.item_id
        players = "".join(
            f'<td><audio controls preload="none" src="{html.escape(item)}{suffix}.wav"></audio></td>'
            for suffix in ("_0_recording", "_1_before", "_2_after")
        )
        said_before = differences.describe(differences.said_differently(before.get(item, [])))
        said_after = differences.describe(differences.said_differently(after.get(item, [])))
        rows.append(
            f"<tr><td>{html.escape(item)}</td><td>{html.escape(texts.get(item, ''))}</td>{players}"
            f"<td>{html.escape(said_before)}</td><td>{html.escape(said_after)}</td></tr>"
        )
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>Corrections</title>"
        "<style>body{font-family:sans-serif}td,th{border-bottom:1px solid #ddd;padding:4px;text-align:left}"
        "pre{white-space:pre-wrap}</style></head><body>"
        f"<pre>{html.escape(report)}</pre>"
        "<table><tr><th>clip</th><th>text</th><th>recording</th><th>before</th><th>after</th>"
        "<th>said differently before</th><th>after</th></tr>" + "".join(rows) + "</table></body></html>\n"
    )
    write_text_atomic(path, page)
