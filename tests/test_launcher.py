"""bench/launcher.py: a recipe launched by a benchmark sees the platform's own multiprocessing start method,
as under `python script.py`, not the forkserver it was started through; one past its time limit is killed."""

import multiprocessing
import os

import pytest

from bench import launcher


@pytest.mark.timeout(60)
def test_a_recipe_started_through_the_forkserver_gets_the_platforms_start_method(tmp_path, monkeypatch):
    script = tmp_path / "recipe.py"
    script.write_text("import multiprocessing\nprint('start method:', multiprocessing.get_start_method())\n")
    monkeypatch.setattr(launcher, "_context", multiprocessing.get_context("forkserver"))  # a real forkserver
    log = tmp_path / "recipe.log"
    assert launcher.run_script(script, [], log) == 0
    seen = log.read_text().split("start method:")[1].strip()
    assert seen == multiprocessing.get_start_method()  # this test's own: the platform's (fork on Linux < 3.14)


@pytest.mark.timeout(60)
def test_a_script_still_running_after_its_time_limit_is_killed_and_said(tmp_path):
    script = tmp_path / "hangs.py"
    marker = tmp_path / "pid"
    script.write_text(f"import os, time\nopen({str(marker)!r}, 'w').write(str(os.getpid()))\ntime.sleep(600)\n")
    assert launcher.run_script(script, [], tmp_path / "hangs.log", timeout_s=1.0) is None
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):  # gone, and reaped: no zombie left either
        os.kill(pid, 0)
    quick = tmp_path / "quick.py"
    quick.write_text("raise SystemExit(3)\n")
    assert launcher.run_script(quick, [], tmp_path / "quick.log", timeout_s=30.0) == 3  # ended in time: its status
