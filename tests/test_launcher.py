"""bench/launcher.py: a recipe launched by a benchmark sees the platform's own multiprocessing start method,
as under `python script.py`, not the forkserver it was started through."""

import multiprocessing

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
