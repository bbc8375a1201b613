"""Command-line flags from a config dataclass, the single source of truth of each script.

A field becomes `--field_name`; `flag(default, "help")` gives its help text (units and meaning);
booleans become `--name/--no-name`; `list[str]` fields take several values. Parsed values build the
dataclass, whose `__post_init__` checks everything and raises one ConfigError listing every problem.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import logging
import os
import sys
import traceback
import types
import typing
from pathlib import Path
from typing import Any

from finetune.system.errors import ConfigError, ToolError

RESUME_RULES = ("checkpoint", "may_change", "command_line")  # a flag's `on_resume` (resume_rules)


def flag(default: Any, help: str, **metadata: Any) -> Any:
    """A dataclass field that is also a command-line flag (`choices=`, `metavar=` pass through). `on_resume`
    says what a resumed run does with it: "checkpoint" (the default: the checkpoint's value holds; another
    one given is refused), "may_change" (given again, it wins: budget, device, what is written and how
    often) or "command_line" (always this command line's: where to resume from)."""
    if metadata.get("on_resume", "checkpoint") not in RESUME_RULES:
        raise ValueError(f"on_resume {metadata['on_resume']!r}: choose from {', '.join(RESUME_RULES)}")
    if isinstance(default, list):
        return dataclasses.field(default_factory=lambda: list(default), metadata={"help": help, **metadata})
    return dataclasses.field(default=default, metadata={"help": help, **metadata})


def _unwrap_optional(annotation: Any) -> Any:
    """`int | None` -> int; anything else unchanged."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _add_field(parser: argparse.ArgumentParser, field: dataclasses.Field, annotation: Any, with_default: bool) -> None:
    kwargs: dict[str, Any] = {"help": field.metadata.get("help", "")}
    if with_default:
        kwargs["default"] = field.default_factory() if field.default is dataclasses.MISSING else field.default
    if "choices" in field.metadata:
        kwargs["choices"] = field.metadata["choices"]
    if "metavar" in field.metadata:
        kwargs["metavar"] = field.metadata["metavar"]
    base = _unwrap_optional(annotation)
    name = f"--{field.name}"
    if field.metadata.get("positional"):  # an optional positional argument, e.g. MODEL_DIR
        kwargs.pop("choices", None)
        parser.add_argument(field.name, nargs="?", type=base, metavar=field.name.upper(), **kwargs)
        return
    if base is bool:
        parser.add_argument(name, action=argparse.BooleanOptionalAction, **kwargs)
    elif typing.get_origin(base) is list:
        parser.add_argument(name, nargs="*", type=typing.get_args(base)[0], **kwargs)
    else:
        parser.add_argument(name, type=base, **kwargs)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the script docstring's layout and appends each flag's default to its help."""


def build_parser(config_cls: type, description: str, with_defaults: bool = True) -> argparse.ArgumentParser:
    """The flags of `config_cls`; without defaults, only the flags given end up in the namespace."""
    extra = {} if with_defaults else {"argument_default": argparse.SUPPRESS}
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter, **extra)
    hints = typing.get_type_hints(config_cls)
    shown = [f for f in dataclasses.fields(config_cls) if f.init and f.metadata.get("help") is not None]
    owners = {field.name: declared_in(config_cls, field.name) for field in shown}
    groups = {}
    if len(set(owners.values())) > 1:  # --help in parts, the script's own flags first (finetune/settings.py)
        for owner in sorted(dict.fromkeys(owners.values()), key=lambda cls: cls is not config_cls):
            groups[owner] = parser.add_argument_group(group_title(owner))
    for field in shown:
        _add_field(groups.get(owners[field.name], parser), field, hints[field.name], with_defaults)
    return parser


def declared_in(config_cls: type, name: str) -> type:
    """The class that first declares flag `name` among `config_cls`'s bases (a recipe declaring a shared flag
    again, with its own default, leaves it in the shared flag's group)."""
    return [cls for cls in config_cls.__mro__ if name in inspect.get_annotations(cls)][-1]


def group_title(cls: type) -> str:
    """A flag group's title in --help: its class docstring up to the first colon ("Data", "train_vits.py's
    flags"), else the class's name."""
    doc = (cls.__dict__.get("__doc__") or "").strip()
    if not doc or doc.startswith(f"{cls.__name__}("):  # the signature a dataclass without a docstring gets
        return cls.__name__
    return doc.splitlines()[0].split(":")[0]


def parse_config(config_cls: type, argv: list[str] | None, description: str) -> Any:
    """Parse argv into `config_cls`; on invalid settings print every problem and exit with status 2."""
    parser = build_parser(config_cls, description)
    namespace = parser.parse_args(argv)
    try:
        return config_cls(**vars(namespace))
    except ConfigError as error:
        parser.error(f"invalid settings:\n{error}")


def given_flags(config_cls: type, argv: list[str] | None) -> set[str]:
    """The fields whose flags this command line names (a resumed run takes the others from its checkpoint)."""
    return set(vars(build_parser(config_cls, "", with_defaults=False).parse_args(argv)))


def resume_rules(config_cls: type) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(the flags a resumed run's command line may change, those always taken from it): each flag's `on_resume`."""
    fields = dataclasses.fields(config_cls)
    return (
        tuple(f.name for f in fields if f.metadata.get("on_resume") == "may_change"),
        tuple(f.name for f in fields if f.metadata.get("on_resume") == "command_line"),
    )


def config_to_dict(config: Any) -> dict[str, Any]:
    """The resolved config as JSON-ready values, for saving beside the run's outputs."""

    def plain(value: Any) -> Any:
        if isinstance(value, Path):
            return str(value)
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        if isinstance(value, dict):
            return {k: plain(v) for k, v in value.items()}
        return value

    return {k: plain(v) for k, v in dataclasses.asdict(config).items()}


def run_script(main) -> int:
    """Run a recipe's main(): the tool's expected failures (finetune/system/errors.py) become one 'error:'
    line and an exit status (2 for settings, 1 for the rest). Anything else keeps its traceback: a bug, or a
    library's own error, must be seen whole. The machine running out of RAM is said in words after it."""
    try:
        return main()
    except ConfigError as error:
        print(f"error: invalid settings:\n{error}", file=sys.stderr)
        return 2
    except ToolError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    except MemoryError:
        traceback.print_exc()
        print(
            "error: this machine ran out of RAM (MemoryError, where is shown above): close other programs, or "
            "train on fewer clips (--max_samples N) with spectrograms computed per batch (--no-precompute_mels)",
            file=sys.stderr,
        )
        return 1


def exit_process(code: int) -> None:
    """End a budgeted run's process now, with `code`, without the interpreter's teardown. The run's last
    line is written inside its budget; what Python does after that (freeing every module's objects one by
    one, torch's among them, joining threads, atexit handlers) is not, and took 4.6 s after a 180 s run's
    last line on a machine with two busy processes (bench/RESULTS.md). By then the run has closed every
    file it writes (checkpoints, exports, metrics, TensorBoard) and the data loader's workers; the log
    handlers and the standard streams are flushed here."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can reach it anyway
            pass
    os._exit(code)
