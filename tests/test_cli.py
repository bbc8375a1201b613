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
