"""The command line as an operator meets it: `make run`'s two steps in an empty directory, and refusals."""

from __future__ import annotations

import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "service.cli"]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scratch_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONNECTOR_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


def test_migrate_then_serve_on_loopback_creates_a_dev_key_and_serves(tmp_path: Path) -> None:
    shutil.copytree(REPO / "config", tmp_path / "config")
    port = free_port()
    env = scratch_env(tmp_path, CONNECTOR_SERVER__PORT=str(port), CONNECTOR_PUBLIC_BASE_URL=f"http://127.0.0.1:{port}")
    migrated = subprocess.run([*CLI, "migrate"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert migrated.returncode == 0, migrated.stderr
    server = subprocess.Popen(
        [*CLI, "--log-format", "json", "serve"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    try:
        ready = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        assert ready is not None and ready.status_code == 200 and ready.json() == {"status": "ready"}
        page = httpx.get(f"http://127.0.0.1:{port}/connect/unknown-id", timeout=5)
        assert page.status_code == 404 and page.headers["x-connector-error"] == "unknown_elicitation"
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=20)
    key_file = tmp_path / "var" / "vault.keys"
    assert key_file.is_file() and stat.S_IMODE(key_file.stat().st_mode) == 0o600
    assert "created a development key file at var/vault.keys" in stderr
    # With --log-format json every log line is one JSON object (the two "acp-connector:" lines are plain notices).
    log_lines = [line for line in stderr.splitlines() if line and not line.startswith("acp-connector:")]
    records = [json.loads(line) for line in log_lines]
    assert any(r["logger"] == "service.web" and r["message"].startswith("GET /readyz 200") for r in records)
    assert key_file.read_text().split(":", 1)[1].strip()[:16] not in stderr  # the key itself is never printed


def test_serve_refuses_an_unmigrated_database_and_says_what_to_run(tmp_path: Path) -> None:
    shutil.copytree(REPO / "config", tmp_path / "config")
    result = subprocess.run(
        [*CLI, "serve"], cwd=tmp_path, env=scratch_env(tmp_path), capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "acp-connector migrate" in result.stderr and "Traceback" not in result.stderr


def test_non_loopback_deployment_without_a_key_is_refused(tmp_path: Path) -> None:
    shutil.copytree(REPO / "config", tmp_path / "config")
    env = scratch_env(tmp_path, CONNECTOR_PUBLIC_BASE_URL="https://connector.example.com")
    result = subprocess.run([*CLI, "serve"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "vault.keys" in result.stderr and "not a loopback deployment" in result.stderr
    assert not (tmp_path / "var" / "vault.keys").exists()
    assert len(result.stderr.strip().splitlines()) == 1  # one line, no traceback


def test_invalid_setting_is_one_line_naming_key_and_file(tmp_path: Path) -> None:
    config = tmp_path / "connector.toml"
    config.write_text("[elicitation]\nttl_seconds = -5\n")
    result = subprocess.run(
        [*CLI, "--config", str(config), "migrate"],
        cwd=tmp_path,
        env=scratch_env(tmp_path),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    (line,) = result.stderr.strip().splitlines()
    assert str(config) in line and "elicitation.ttl_seconds" in line
