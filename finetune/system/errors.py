"""The one base of the tool's expected failures.

A ToolError is a failure the user can act on: a wrong flag, a prepared folder that does not match, a
checkpoint that cannot be resumed, a full disk, a folder another run holds. Its message says what was
expected, what was found and what to do; the recipes print it as one `error:` line (finetune/cli.py
run_script). Every other exception, a ValueError from a library included, is a bug or the machine
failing and keeps its traceback.

Light on purpose (no torch): the recipes catch it before their heavy parts are imported.
"""

from __future__ import annotations


class ToolError(Exception):
    """An expected failure; the message tells the user what to do."""


class ConfigError(ToolError):
    """Every problem found in a config at once, each saying which flag fixes it."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(f"  - {problem}" for problem in problems))
