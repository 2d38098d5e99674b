"""2,000 random and malformed JSON-RPC frames to a live agent over stdio, then a normal flow on the same connection.

Frames are generated from a fixed seed (reproducible). Each kind of frame says what the agent must answer, per
JSON-RPC 2.0: a request it can read gets a response with its id (an error, since none of them is valid); an invalid
request whose id cannot be read (a `null` line included) gets -32600 with id null; a line that is not JSON gets -32700
with id null; notifications and responses get nothing. The
agent must never crash or hang, and afterwards the SDK's client initializes and completes a whole authorization.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from acp import text_block

from service.testing import ScriptedBrowser, ScriptedClient

from .stdio_support import REPO, StdioSetup, stdio_setup

__all__ = ["stdio_setup"]  # the fixture

FRAMES = 2_000
SEED = 20261203
MB = 1024 * 1024
KNOWN = ["initialize", "session/new", "session/prompt", "session/load", "session/set_mode", "authenticate"]


@dataclass(frozen=True)
class Frame:
    line: bytes
    answer: str  # "id": a response with `request_id`; "null": -32600 with id null; "parse": -32700, id null; "none"
    request_id: Any = None


def _line(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode() + b"\n"


def _junk(rng: random.Random) -> Any:
    return rng.choice(
        [None, True, 0, -1, 1.5, "x" * rng.randint(0, 50), [], [1, "a"], {"cwd": 5}, {"sessionId": []}, {"_meta": 1}]
    )


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = {"a": value} if level % 2 else [value]
    return value


class Generator:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.count = 0

    def next_id(self) -> Any:
        self.count += 1
        kind = self.rng.randrange(4)
        if kind == 0:
            return f"fuzz-{self.count}"
        if kind == 1:
            return 10**300 + self.count  # a huge integer
        if kind == 2:
            return f"fuzz-{self.count}-" + "i" * self.rng.randint(1000, 5000)  # a long string
        return 1_000_000 + self.count

    def frame(self) -> Frame:
        rng = self.rng
        makers: list[Callable[[], Frame]] = [
            self.bad_json,
            self.not_an_object,
            self.unknown_method,
            self.known_method_bad_params,
            self.bad_request_with_id,
            self.bad_id,
            self.bad_notification,
            self.notification,
            self.response,
            self.deep_request,
            self.cancel_request,
        ]
        if rng.random() < 0.005:
            return self.megabyte()
        if rng.random() < 0.01:
            return Frame(b"\n", "none")  # blank lines are skipped
        return rng.choice(makers)()

    def bad_json(self) -> Frame:
        rng = self.rng
        options = [
            b"{",
            b'{"jsonrpc": "2.0", "id": 1, "method": ',
            b"not json at all",
            b"\xff\xfe\xfa garbage",
            b"[" * 100_000,  # nested beyond the parser's own limit
            b'{"id": 1' + b"9" * 5000 + b', "method": "x"}',  # an integer too long to parse
            b"#" + bytes(rng.randrange(32, 127) for _ in range(rng.randint(1, 200))),  # never valid JSON
        ]
        return Frame(rng.choice(options) + b"\n", "parse")

    def not_an_object(self) -> Frame:
        value = self.rng.choice([1, "text", None, True, [], [{"jsonrpc": "2.0", "id": 1, "method": "session/new"}]])
        return Frame(_line(value), "null")

    def unknown_method(self) -> Frame:
        request_id = self.next_id()
        method = self.rng.choice(["foo/bar", "$/unknown", "_vendor/thing", "", "session/" + "x" * 300])
        return Frame(_line({"jsonrpc": "2.0", "id": request_id, "method": method, "params": {}}), "id", request_id)

    def known_method_bad_params(self) -> Frame:
        request_id = self.next_id()
        params = self.rng.choice([{"garbage": True}, {"cwd": 5}, {"sessionId": None, "prompt": "x"}, [1, 2]])
        message = {"jsonrpc": "2.0", "id": request_id, "method": self.rng.choice(KNOWN), "params": params}
        return Frame(_line(message), "id", request_id)

    def bad_request_with_id(self) -> Frame:
        request_id = self.next_id()
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": request_id, "method": "session/new", "params": {}}
        spoil = self.rng.randrange(3)
        if spoil == 0:
            message["jsonrpc"] = self.rng.choice(["1.0", None, 2])
        elif spoil == 1:
            message["method"] = self.rng.choice([5, None, ["session/new"], {"m": 1}])
        else:
            message["params"] = self.rng.choice(["string", 5, True])
        return Frame(_line(message), "id", request_id)

    def bad_id(self) -> Frame:
        bad = self.rng.choice([[1], {"id": 1}, True, 1.5, float("nan")])
        message = {"jsonrpc": "2.0", "id": bad, "method": "session/new", "params": {"cwd": "/"}}
        return Frame(json.dumps(message).encode() + b"\n", "null")

    def bad_notification(self) -> Frame:
        message = {"jsonrpc": "2.0", "method": self.rng.choice([7, None, []]), "params": _junk(self.rng)}
        return Frame(_line(message), "null")

    def notification(self) -> Frame:
        method = self.rng.choice(["session/cancel", "foo/bar", "$/progress", "_vendor/note", "session/update"])
        params = self.rng.choice([{}, {"sessionId": []}, {"sessionId": "sess-9"}, [1, "a"], {"_meta": 1}])
        return Frame(_line({"jsonrpc": "2.0", "method": method, "params": params}), "none")

    def response(self) -> Frame:
        rng = self.rng
        message: dict[str, Any] = {"jsonrpc": "2.0", "id": rng.choice([0, 5, "x", [1], None, 10**300])}
        message[rng.choice(["result", "error"])] = rng.choice(["boom", {"code": "x"}, {"action": "accept"}, None])
        return Frame(_line(message), "none")

    def deep_request(self) -> Frame:
        request_id = self.next_id()
        params = {"cwd": "/", "mcpServers": [], "deep": _nested(self.rng.randint(70, 400))}
        message = {"jsonrpc": "2.0", "id": request_id, "method": "session/new", "params": params}
        return Frame(_line(message), "id", request_id)

    def cancel_request(self) -> Frame:
        params = self.rng.choice([{"requestId": 1}, {"requestId": [1]}, {"requestId": None}, [], {}])
        return Frame(_line({"jsonrpc": "2.0", "method": "$/cancel_request", "params": params}), "none")

    def megabyte(self) -> Frame:
        if self.rng.random() < 0.5:
            return Frame(b"x" * MB + b"\n", "parse")  # a 1 MB line that is not JSON
        request_id = self.next_id()
        params = {"cwd": "y" * MB, "mcpServers": "not a list"}
        message = {"jsonrpc": "2.0", "id": request_id, "method": "session/new", "params": params}
        return Frame(_line(message), "id", request_id)  # 1 MB of params: still answered (-32602)


def _key(value: Any) -> str:
    return json.dumps(value)


async def test_fuzzed_frames_never_crash_or_hang_the_agent(stdio_setup: StdioSetup) -> None:
    generator = Generator(SEED)
    frames = [generator.frame() for _ in range(FRAMES)]
    kinds = Counter(f.answer for f in frames)
    assert min(kinds["id"], kinds["null"], kinds["parse"], kinds["none"]) > 100  # the mix is broad
    assert any(len(f.line) > MB for f in frames)

    agent = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.stdio_agent",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=stdio_setup.env,
        cwd=REPO,
        limit=64 * MB,
    )
    assert agent.stdin is not None and agent.stdout is not None and agent.stderr is not None
    stderr = bytearray()

    async def drain_stderr() -> None:
        assert agent.stderr is not None
        while chunk := await agent.stderr.read(65536):
            stderr.extend(chunk)

    draining = asyncio.create_task(drain_stderr())
    try:
        expected_ids = {_key(f.request_id) for f in frames if f.answer == "id"}
        expected_nulls = kinds["null"] + kinds["parse"]
        answered: dict[str, dict[str, Any]] = {}
        nulls: list[dict[str, Any]] = []
        unexpected: list[dict[str, Any]] = []

        async def read_answers() -> None:
            assert agent.stdout is not None
            while len(answered) < len(expected_ids) or len(nulls) < expected_nulls:
                line = await agent.stdout.readline()
                assert line, "the agent closed its stdout (it crashed, or took a message for the end)"
                message = json.loads(line)
                if message.get("id") is None and "error" in message:
                    nulls.append(message)
                elif _key(message.get("id")) in expected_ids:
                    assert _key(message["id"]) not in answered, "answered twice"
                    answered[_key(message["id"])] = message
                else:
                    unexpected.append(message)

        async def write_frames() -> None:
            assert agent.stdin is not None
            for frame in frames:
                agent.stdin.write(frame.line)
                await agent.stdin.drain()

        reader = asyncio.create_task(read_answers())
        await asyncio.wait_for(write_frames(), 120)
        await asyncio.wait_for(reader, 120)  # every request answered: nothing hung

        assert agent.returncode is None  # never crashed
        assert unexpected == []  # nothing answered that was not a request
        assert all("error" in m and isinstance(m["error"].get("code"), int) for m in answered.values())
        codes = Counter(m["error"]["code"] for m in nulls)
        assert codes == {-32600: kinds["null"], -32700: kinds["parse"]}

        # A normal flow on the same connection: the SDK's client, from initialize to elicitation/complete.
        client = ScriptedClient("accept")
        conn = client.connect_streams(agent.stdout, agent.stdin)
        await asyncio.wait_for(client.initialize(conn), 30)
        session = await asyncio.wait_for(conn.new_session(cwd="/"), 30)
        turn = asyncio.create_task(conn.prompt(session_id=session.session_id, prompt=[text_block("go")]))
        async with ScriptedBrowser() as browser:
            assert (await browser.authorize(await client.next_consented_url(within=30))).status_code == 200
        assert (await asyncio.wait_for(turn, 30)).stop_reason == "end_turn"
        assert len(client.received("elicitation/complete")) == 1
        assert "Your repositories" in client.agent_text()
        await conn.close()
    finally:
        if agent.stdin is not None and not agent.stdin.is_closing():
            agent.stdin.close()
        try:
            await asyncio.wait_for(agent.wait(), 10)
        finally:
            if agent.returncode is None:
                agent.kill()
                await agent.wait()
            await asyncio.wait_for(draining, 10)
    assert agent.returncode == 0, stderr.decode(errors="replace")[-2000:]
