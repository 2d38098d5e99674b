"""The first hour, as a newcomer spends it in a fresh clone with nothing configured.

1. `make run`: its own .venv (runtime dependencies only, from the package cache), the SQLite default migrated, and
   the demo: a mock provider on loopback and a start page whose demo link walks through consent, the provider and
   the callback. The test is the newcomer's browser (`ScriptedBrowser`).
2. The example agent's README, "Run it", followed literally: `make run` once, then `try_it --demo`, answering `y`
   and going through the page the agent links to.

One test does both, in one clone: the second step needs what the first created (.venv, the database).
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest

from service.testing import ScriptedBrowser

from .test_cli import free_port

REPO = Path(__file__).resolve().parent.parent
EXAMPLE_README = REPO / "examples" / "github_agent" / "README.md"
BOOT_SECONDS = 300  # a fresh venv from a warm package cache takes well under a minute; CI machines vary
README_STEPS = ["make run", ".venv/bin/python -m examples.github_agent.try_it --demo"]


def newcomer_env(port: int) -> dict[str, str]:
    """This machine's environment without our own settings, serving on `port` (tests run side by side)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONNECTOR_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(CONNECTOR_SERVER__PORT=str(port), CONNECTOR_PUBLIC_BASE_URL=f"http://127.0.0.1:{port}")
    return env


class MakeRun:
    """`make run` in `clone`, in its own process group (make, pip and the server stop together)."""

    def __init__(self, clone: Path) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        make = shutil.which("make")
        assert make is not None, "make is not installed"
        self.process = subprocess.Popen(
            [make, "run"],
            cwd=clone,
            env=newcomer_env(self.port),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def wait_healthy(self) -> float:
        started = time.monotonic()
        while time.monotonic() - started < BOOT_SECONDS:
            if self.process.poll() is not None:
                output = self.process.stdout.read() if self.process.stdout else ""
                raise AssertionError(f"make run exited with {self.process.returncode}:\n{output[-4000:]}")
            try:
                if httpx.get(f"{self.base_url}/readyz", timeout=2).status_code == 200:
                    return time.monotonic() - started
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise AssertionError(f"make run was not healthy within {BOOT_SECONDS} s")

    def stop(self) -> None:  # Ctrl-C, as the newcomer would
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGINT)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """A fresh clone of this repository (its committed HEAD)."""
    git = shutil.which("git")
    if git is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout to clone")
    path = tmp_path / "clone"
    subprocess.run([git, "clone", "--quiet", str(REPO), str(path)], check=True, timeout=120)
    return path


@pytest.mark.duration(30)
async def test_the_first_hour_in_a_fresh_clone(clone: Path) -> None:
    await make_run_serves_a_demo_that_completes_a_whole_flow(clone)
    await the_example_readme_steps_work_literally_against_the_demo_provider(clone)


async def make_run_serves_a_demo_that_completes_a_whole_flow(clone: Path) -> None:
    run = MakeRun(clone)
    try:
        await asyncio.to_thread(run.wait_healthy)
        base_url = run.base_url
        async with ScriptedBrowser() as browser:
            home = await browser.get(f"{base_url}/")
            assert home.status_code == 200 and "Demo mode" in home.text and "Demo provider (mock)" in home.text
            link = re.search(r'<a class="button primary" href="([^"]+)">Start a demo authorization</a>', home.text)
            assert link is not None, home.text
            consent = await browser.follow(await browser.get(f"{base_url}{link.group(1)}"))
            assert consent.status_code == 200 and "Connect your Demo provider (mock) account" in consent.text
            done = await browser.follow(await browser.submit(consent, "continue"))
        assert done.status_code == 200, done.text
        assert "Your Demo provider (mock) account is connected" in done.text
    finally:
        run.stop()  # Ctrl-C, as the README's first step says


def readme_steps() -> list[str]:
    """The commands of the example README's first code block under "Run it" (comments dropped)."""
    text = EXAMPLE_README.read_text()
    section = text[text.index("## Run it") :]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block is not None
    return [line.split(" #")[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_example_readme_steps_are_the_ones_tested() -> None:
    assert readme_steps() == README_STEPS


async def the_example_readme_steps_work_literally_against_the_demo_provider(clone: Path) -> None:
    # Step 1 (`make run` once, then Ctrl-C) is what the demo above did; step 2, interactively:
    env = {**newcomer_env(free_port()), "BROWSER": "true"}  # the test is the browser: `webbrowser` opens nothing
    process = await asyncio.create_subprocess_exec(
        *shlex.split(README_STEPS[1]),
        cwd=clone,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    process.stdin.write(b"y\n")  # "Open it in your browser? [y/N]"
    await process.stdin.drain()
    seen: list[str] = []
    try:
        opening = None
        while opening is None:  # "Open it in your browser? [y/N] Opening http://... finish there; ..."
            line = await asyncio.wait_for(process.stdout.readline(), 120)
            assert line, "try_it ended before it opened a link:\n" + "".join(seen)
            seen.append(line.decode())
            opening = re.search(r"Opening (http\S+) \.\.\.", seen[-1])
        url = opening.group(1)
        async with ScriptedBrowser() as browser:
            page = await browser.authorize(url)
        assert page.status_code == 200 and "is connected" in page.text, page.text
        out, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    output = "".join(seen) + out.decode()
    assert process.returncode == 0, output + err.decode()
    assert "demo-user/hello-world" in output and "demo-user/connector-demo" in output
    assert "agent | " in err.decode()  # the agent's log is shown as it runs
    assert "Traceback" not in err.decode()
