"""The test kit as an agent author gets it: a fresh virtualenv, `pip install '<this repo>[testing]'` (a built wheel,
not this checkout), and `pytest` on the example test in `examples/testing/`, which uses only the plugin's fixtures."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _pip_into(python: Path) -> list[str]:
    """A pip that installs into the venv of `python`: this interpreter's (or its base's) with --python, else the
    venv's own."""
    for base in dict.fromkeys((sys.executable, getattr(sys, "_base_executable", sys.executable))):
        probe = subprocess.run([base, "-m", "pip", "--help"], capture_output=True, text=True, check=False)
        if probe.returncode == 0 and "--python <python>" in probe.stdout:
            return [base, "-m", "pip", "--python", str(python)]
    subprocess.run([str(python), "-m", "ensurepip", "--default-pip"], check=True, capture_output=True)
    return [str(python), "-m", "pip"]


@pytest.mark.duration(30)
def test_the_example_test_passes_from_a_fresh_install_of_the_testing_extra(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONNECTOR_", "PYTHON", "VIRTUAL_ENV"))}
    install = subprocess.run(
        [*_pip_into(python), "install", "--quiet", "--no-compile", "--disable-pip-version-check", f"{REPO}[testing]"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    # Only the examples, outside this checkout: `service` must come from the installed wheel.
    work = tmp_path / "work"
    shutil.copytree(REPO / "examples", work / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    run = subprocess.run(
        [str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "examples/testing"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert "2 passed" in run.stdout
    where = subprocess.run(
        [str(python), "-c", "import service, service.testing.pytest_plugin as p; print(service.__file__, p.__file__)"],
        cwd=work,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert str(venv) in where.stdout and str(REPO) not in where.stdout
