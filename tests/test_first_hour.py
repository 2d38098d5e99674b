"""The first hour, as a newcomer spends it in a fresh clone with nothing configured.

1. `make run`: its own .venv (runtime dependencies only, from the package cache), the SQLite default migrated, and
   the demo: a mock provider on loopback and a start page whose demo link walks through consent, the provider and
   the callback. The test is the newcomer's browser (`ScriptedBrowser`).
2. The example agent's README, "Run it", followed literally: `make run` once, then `try_it --demo`, answering `y`
   and going through the page the agent links to. Then the TypeScript example's README against `make run`, as
   pasted: an API key, the package and the agent built with npm, the terminal client, the page it links to.

3. The README, block by block: every shell block runs or says why not (`<!-- doctest: ... -->` before it: it serves,
   needs `make run`, real credentials or Docker, or is the suite itself). The block that serves the demo on another
   port runs, and Chromium goes through that demo (the consent page's form posts and the redirects reach that port);
   with it serving, the block that needs `make run` and the local sidecar recipe of docs/sidecar.md run as pasted
   (a scripted browser is the user at the link); then `make testing-kit`, the testing kit's README.

One test does it all, in one clone: each step needs what the one before created (.venv, the database).
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
TS_EXAMPLE_README = REPO / "examples" / "ts_agent" / "README.md"
BOOT_SECONDS = 300  # a fresh venv from a warm package cache takes well under a minute; CI machines vary
README_STEPS = ["make run", ".venv/bin/python -m examples.github_agent.try_it --demo"]


def newcomer_env(port: int) -> dict[str, str]:
    """This machine's environment without our own settings, serving on `port` (tests run side by side)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONNECTOR_", "VIRTUAL_ENV", "PYTHON"))}
    env.update(CONNECTOR_SERVER__PORT=str(port), CONNECTOR_PUBLIC_BASE_URL=f"http://127.0.0.1:{port}")
    return env


class MakeRun:
    """`make run` in `clone`, in its own process group (make, pip and the server stop together)."""

    def __init__(self, clone: Path, *, follow_listener: bool = False) -> None:
        """`follow_listener`: leave public_base_url unset, as the README's other-port block does."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        env = newcomer_env(self.port)
        if follow_listener:
            del env["CONNECTOR_PUBLIC_BASE_URL"]
        make = shutil.which("make")
        assert make is not None, "make is not installed"
        self.process = subprocess.Popen(
            [make, "run"],
            cwd=clone,
            env=env,
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


@pytest.mark.duration(120)
async def test_the_first_hour_in_a_fresh_clone(clone: Path) -> None:
    await make_run_serves_a_demo_that_completes_a_whole_flow(clone)
    await the_example_readme_steps_work_literally_against_the_demo_provider(clone)
    await the_ts_example_readme_steps_work_against_make_run(clone)
    await the_readme_blocks_run_in_the_clone(clone)


async def make_run_serves_a_demo_that_completes_a_whole_flow(clone: Path) -> None:
    run = MakeRun(clone)
    try:
        await asyncio.to_thread(run.wait_healthy)
        base_url = run.base_url
        async with ScriptedBrowser() as browser:
            home = await browser.get(f"{base_url}/")
            assert home.status_code == 200 and "Demo mode" in home.text and "Demo provider (mock)" in home.text
            assert "nothing leaves this machine" in home.text  # the mock signs in on loopback
            link = re.search(r'<a class="button primary" href="([^"]+)">Start a demo authorization</a>', home.text)
            assert link is not None, home.text
            consent = await browser.follow(await browser.get(f"{base_url}{link.group(1)}"))
            assert consent.status_code == 200 and "Connect your Demo provider (mock) account" in consent.text
            done = await browser.follow(await browser.submit(consent, "continue"))
        assert done.status_code == 200, done.text
        assert "Your Demo provider (mock) account demo-user is connected" in done.text
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
    output, err = await answered_and_authorized(clone, env, README_STEPS[1])
    assert "demo-user/hello-world" in output and "demo-user/connector-demo" in output
    assert "agent | " in err  # the agent's log is shown as it runs
    assert "Traceback" not in err


def ts_readme_steps() -> list[str]:
    """The commands of the TypeScript example README's second block under "Run it" (comments dropped)."""
    section = TS_EXAMPLE_README.read_text().split("## Run it", 1)[1]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    assert len(blocks) >= 2 and blocks[0].strip().startswith("make run")
    return [line.split("  #")[0].strip() for line in blocks[1].splitlines() if line.strip()]


async def the_ts_example_readme_steps_work_against_make_run(clone: Path) -> None:
    create_key, build_package, build_agent, export, try_it = ts_readme_steps()
    assert export.startswith("export SIDECAR_URL=http://127.0.0.1:8700 SIDECAR_API_KEY=acpk_... ")
    run = MakeRun(clone)  # the README's terminal 1
    try:
        await asyncio.to_thread(run.wait_healthy)
        env = newcomer_env(run.port)
        created = await bash(clone, create_key, env)
        printed = re.search(r"^acpk_\S+$", created, re.MULTILINE)  # the key, alone on its line
        assert printed is not None, created
        key = printed.group(0)
        for build in (build_package, build_agent):
            await bash(clone, build, env, within=600)
        # The README's export, with this run's port and key in place of 8700 and acpk_...
        exported = export.replace("http://127.0.0.1:8700", run.base_url).replace("acpk_...", key)
        for assignment in shlex.split(exported)[1:]:
            name, _, value = assignment.partition("=")
            env[name] = value
        env["BROWSER"] = "true"  # the test is the browser: `webbrowser` opens nothing
        output, err = await answered_and_authorized(clone, env, try_it)
        await disconnect_all(run.base_url, key, env)  # the next steps start from a user without grants
    finally:
        run.stop()
    assert "demo-user/hello-world" in output, output + err
    assert "Traceback" not in err


async def disconnect_all(base_url: str, key: str, env: dict[str, str]) -> None:
    """Disconnect every grant of the agent's user through `/v1` (as an agent's "disconnect" would)."""
    headers = {"Authorization": f"Bearer {key}"}
    user = {"issuer": env["AGENT_USER_ISSUER"], "subject": env["AGENT_USER_SUBJECT"]}
    async with httpx.AsyncClient(base_url=base_url, headers=headers) as api:
        listed = await api.get("/v1/grants", params=user)
        assert listed.status_code == 200, listed.text
        for grant in listed.json()["grants"]:
            assert (await api.delete(f"/v1/grants/{grant['grantId']}")).status_code == 204


async def answered_and_authorized(clone: Path, env: dict[str, str], command: str) -> tuple[str, str]:
    """A terminal client of an example (`try_it`) answered `y`, and the link it opens authorized by a browser;
    its stdout and stderr once it ended (exit 0)."""
    process = await asyncio.create_subprocess_exec(
        *shlex.split(command),
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
        async with ScriptedBrowser() as browser:
            page = await browser.authorize(opening.group(1))
        assert page.status_code == 200 and "is connected" in page.text, page.text
        out, err = await asyncio.wait_for(process.communicate(), 60)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    output = "".join(seen) + out.decode()
    assert process.returncode == 0, output + err.decode()
    return output, err.decode()


# -- 3. the README's shell blocks ------------------------------------------------------------------------------

DOCTEST_MARKS = {"serves", "needs make run", "needs real credentials", "needs docker and real credentials"}


def shell_blocks(text: str) -> list[tuple[str | None, str]]:
    """(its `<!-- doctest: MARK -->`, or None; the block) for each ```sh block of a Markdown text."""
    return [
        (mark, block) for mark, block in re.findall(r"(?:<!-- doctest: ([^>]*?) -->\n)?```sh\n(.*?)```", text, re.S)
    ]


def test_every_readme_shell_block_runs_or_says_why_not() -> None:
    blocks = shell_blocks((REPO / "README.md").read_text())
    assert blocks
    for mark, block in blocks:
        assert not mark or mark in DOCTEST_MARKS or mark.startswith("skip ("), mark
        if mark and "credentials" in mark:
            assert "..." in block or "docker" in block  # a placeholder or Docker: it cannot run as written here
        if not mark or mark == "serves":
            assert "..." not in block and "example.com" not in block  # runs as written


async def the_readme_blocks_run_in_the_clone(clone: Path) -> None:
    blocks = shell_blocks((clone / "README.md").read_text())
    served = [block for mark, block in blocks if mark == "serves"]
    assert served[0].split("#")[0].strip() == "make run"  # what step 1 ran
    other_port = served[1].split("#")[0].strip()
    assert other_port == "CONNECTOR_SERVER__PORT=8790 make run"
    run = MakeRun(clone, follow_listener=True)  # the block's port 8790, changed to a free one (tests run side by side)
    env = {k: v for k, v in newcomer_env(run.port).items() if k != "CONNECTOR_PUBLIC_BASE_URL"}
    try:
        await asyncio.to_thread(run.wait_healthy)
        await chromium_goes_through_the_demo(run.base_url)
        for mark, block in blocks:
            if mark == "needs make run":
                out = await bash(clone, block, env)
                assert out.strip().startswith("acpk_"), out
        await the_local_sidecar_recipe_runs_as_pasted(clone, run.base_url, env)
    finally:
        run.stop()
    output = run.process.stdout.read() if run.process.stdout else ""
    assert f"serving on http://127.0.0.1:{run.port}" in output and "names port" not in output
    for mark, block in blocks:
        if not mark:  # `make testing-kit`: the testing kit's example, as its README runs it
            out = await bash(clone, block, newcomer_env(free_port()), within=600)
            assert re.search(r"\b2 passed\b", out), out[-3000:]


async def bash(clone: Path, script: str, env: dict[str, str], within: float = 300) -> str:
    """`script` in bash in the clone (stops at the first failing command); its stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-euo",
        "pipefail",
        "-c",
        script,
        cwd=clone,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(process.communicate(), within)
    assert process.returncode == 0, f"{script}\n-> exit {process.returncode}:\n{out.decode()[-3000:]}"
    return out.decode()


async def chromium_goes_through_the_demo(base_url: str) -> None:
    """Chromium at the demo's start page on a port that is not 8700: start, Continue, Approve, connected."""
    chromium = shutil.which("chromium")
    playwright = pytest.importorskip("playwright.async_api", reason="Playwright is not installed")
    if chromium is None:
        pytest.skip("the demo through a real browser needs Debian's chromium")
    from .test_real_browser import FLAGS  # the flags every real-browser test launches it with

    async with playwright.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=chromium, args=FLAGS)
        try:
            page = await browser.new_page()
            await page.goto(f"{base_url}/")
            await page.get_by_role("link", name="Start a demo authorization").click()
            await page.wait_for_load_state()
            assert page.url.startswith(f"{base_url}/connect/")
            await page.get_by_role("button", name=re.compile("Continue")).click()  # CSP form-action: this port
            await page.wait_for_load_state()
            await page.get_by_role("button", name="Approve").click()  # the mock provider's sign-in page
            await page.wait_for_load_state()
            assert page.url.startswith(base_url), page.url  # the redirect URI names this port
            assert "Your Demo provider (mock) account demo-user is connected" in await page.content()
        finally:
            await browser.close()


async def the_local_sidecar_recipe_runs_as_pasted(clone: Path, base_url: str, env: dict[str, str]) -> None:
    """docs/sidecar.md, "Locally, without Docker": its second block, line by line in one shell, with the user at the
    link between step 2 and step 3 (a scripted browser, approving at the mock provider)."""
    guide = (clone / "docs" / "sidecar.md").read_text()
    local = guide[guide.index("## Locally, without Docker") : guide.index("## With Docker")]
    block = shell_blocks(local)[1][1].replace("http://127.0.0.1:8700", base_url)
    before, after = block.split("# 3.", 1)
    shell = await asyncio.create_subprocess_exec(
        "bash",
        "-eu",
        cwd=clone,
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    assert shell.stdin is not None and shell.stdout is not None
    shell.stdin.write(f"{before}\necho; echo RECIPE-PAUSE\n".encode())  # curl prints no final newline
    await shell.stdin.drain()
    seen: list[str] = []
    while not seen or seen[-1] != "RECIPE-PAUSE":
        line = await asyncio.wait_for(shell.stdout.readline(), 120)
        assert line, "the recipe's first steps ended the shell:\n" + "".join(seen)
        seen.append(line.decode().rstrip("\n"))
    url = next((line.removeprefix("Open ") for line in seen if line.startswith("Open http")), None)
    assert url is not None, seen
    async with ScriptedBrowser() as browser:
        page = await browser.authorize(url)
    assert page.status_code == 200 and "is connected" in page.text, page.text
    shell.stdin.write(f"# 3.{after}\nexit\n".encode())
    out, _ = await asyncio.wait_for(shell.communicate(), 120)
    assert shell.returncode == 0, out.decode()
    compact = out.decode().replace(" ", "")
    assert '"status":"completed"' in compact and '"outcome":"authorized"' in compact, out.decode()
    assert "demo-user/hello-world" in out.decode()
