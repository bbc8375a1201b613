"""How a recipe ends on an error (finetune/cli.py run_script): the tool's own failures in one line, anything
else with its traceback, the machine out of RAM in words."""

from finetune.cli import run_script
from finetune.data.metadata import CorpusError
from finetune.system.errors import ConfigError


def test_a_tool_error_is_one_line_and_status_1(capsys):
    def main():
        raise CorpusError("training/metadata.csv not found: run prepare_data.py first")

    assert run_script(main) == 1
    err = capsys.readouterr().err
    assert err == "error: training/metadata.csv not found: run prepare_data.py first\n"


def test_bad_settings_are_status_2(capsys):
    def main():
        raise ConfigError(["--batch_size 0: must be positive"])

    assert run_script(main) == 2
    assert "--batch_size 0: must be positive" in capsys.readouterr().err


def test_a_library_value_error_keeps_its_traceback():
    """A ValueError the tool did not expect is a bug: it must not be hidden behind one line."""

    def main():
        return int("not a number")  # the ValueError Python itself raises

    try:
        run_script(main)
    except ValueError as error:
        assert "invalid literal" in str(error)
    else:
        raise AssertionError("the ValueError was swallowed")


def test_running_out_of_ram_is_said_in_words_with_where_it_happened(capsys):
    def main():
        return bytearray(2**62)  # Python's own MemoryError: no machine has this much

    assert run_script(main) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "bytearray" in err
    assert "ran out of RAM" in err and "--max_samples" in err


def test_help_shows_the_flags_in_groups_by_what_they_govern_the_scripts_own_first():
    """train_feedback.py declares --learning_rate again with a round's default: it stays in the Schedule group.
    Every shared flag sits in exactly one group, and the loss weights reach the optimizer step by name."""
    import dataclasses

    from finetune.cli import build_parser, declared_in
    from finetune.settings import TrainingFlags
    from train_feedback import FeedbackConfig

    parser = build_parser(FeedbackConfig, "")
    titles = [group.title for group in parser._action_groups]
    assert titles[:3] == ["positional arguments", "options", "train_feedback.py's flags"]
    assert titles[3:] == ["Data", "Model", "Schedule", "Objective", "Evaluation", "Reporting"]
    by_group = {group.title: {a.dest for a in group._group_actions} for group in parser._action_groups}
    assert "learning_rate" in by_group["Schedule"] and "learning_rate" not in by_group["train_feedback.py's flags"]
    assert "feedback_dir" in by_group["train_feedback.py's flags"]
    shared = {f.name for f in dataclasses.fields(TrainingFlags)}
    for name in shared:
        assert sum(name in names for names in by_group.values()) == 1, name
        assert declared_in(FeedbackConfig, name).__name__.endswith("Flags")
    assert "mel_loss_weight" in by_group["Objective"] and "device" in by_group["Model"]
