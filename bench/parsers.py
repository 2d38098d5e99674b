"""How the sidecar answers malformed HTTP/1.1 requests under each HTTP parser: h11 (`acp-connector serve`, what
`tests/test_api_bad_input.py` pins), httptools under uvicorn, and granian's (Rust). Each request is written raw to
a socket; the table gives the status line and the start of the body (the connector's JSON error, or the server's
own refusal). None of the other servers is a dependency (`pip install httptools granian`); one not installed is
left out of the table, with a line on stderr saying what to install.

    .venv/bin/python -m bench.parsers
"""

from __future__ import annotations

import asyncio
import socket
import sys
import tempfile
from pathlib import Path

from bench.harness import connector_env, free_port, wait_until_up
from bench.proxy import seed, server_missing

MALFORMED = {
    "a control character in a header value": b"GET /v1/grants HTTP/1.1\r\nHost: x\r\nIdempotency-Key: a\x01b\r\n\r\n",
    "a NUL in the path": b"GET /v1/gra\x00nts HTTP/1.1\r\nHost: x\r\n\r\n",
    "a DEL in the path": b"GET /v1/gr\x7fants HTTP/1.1\r\nHost: x\r\n\r\n",
    "non-ASCII bytes in the path": b"GET /v1/gr\xc3\xa9ants HTTP/1.1\r\nHost: x\r\n\r\n",
    "a space in a header name": b"GET /v1/grants HTTP/1.1\r\nHost: x\r\nBad Name: v\r\n\r\n",
    "an obsolete line fold": b"GET /v1/grants HTTP/1.1\r\nHost: x\r\nX-A: a\r\n b\r\n\r\n",
    "two Content-Lengths": (
        b"POST /v1/elicitations HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\n{}"
    ),
    "a bad chunk size": (
        b"POST /v1/elicitations HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n"
    ),
    "Content-Length and chunked": (
        b"POST /v1/elicitations HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
    ),
    "no Host (HTTP/1.1)": b"GET /healthz HTTP/1.1\r\n\r\n",
    "bare LF line ends": b"GET /healthz HTTP/1.1\nHost: x\n\n",
    "HTTP/1.2": b"GET /healthz HTTP/1.2\r\nHost: x\r\n\r\n",
    "an absolute-form target": b"GET http://elsewhere.example/v1/grants HTTP/1.1\r\nHost: x\r\n\r\n",
}
SERVERS = {
    "h11 (serve)": ["-m", "service.cli", "serve"],
    **{
        name: [str(Path(__file__).with_name("proxy.py")), "--serve-sidecar", name]
        for name in ("httptools", "granian")
        if not server_missing(name)
    },
}


def answer(port: int, raw: bytes) -> str:
    """The status line and the start of the body the server sends back for `raw`."""
    with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
        sock.sendall(raw)
        data = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = [line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")]
            if length and len(body) >= int(length[0].split(b":")[1]):
                break
    if not data:
        return "(closed, no answer)"
    head, _, body = data.partition(b"\r\n\r\n")
    status = head.split(b"\r\n")[0].decode("latin-1").removeprefix("HTTP/1.1 ")
    return f"{status}: {body[:60].decode('latin-1')!r}"


async def main() -> None:
    from service.vault import generate_key

    for name in ("httptools", "granian"):
        if need := server_missing(name):
            print(f"{name}: left out, not installed here ({need})", file=sys.stderr)

    with tempfile.TemporaryDirectory() as tmp:
        vault_key = generate_key("k1")
        db_url = f"sqlite+aiosqlite:///{tmp}/bench.db"
        await seed(db_url, vault_key)
        catalog = Path(tmp) / "providers.toml"
        catalog.write_text(
            '[bench]\ndisplay_name = "Bench API"\nauthorization_endpoint = "http://127.0.0.1:9/authorize"\n'
            'token_endpoint = "http://127.0.0.1:9/token"\napi_base_url = "http://127.0.0.1:9/api"\n'
        )
        ports = {name: free_port() for name in SERVERS}
        processes = []
        with open(Path(tmp) / "servers.log", "wb") as log:  # noqa: ASYNC230 - opened once, before serving
            for name, command in SERVERS.items():
                env = {**connector_env(ports[name], db_url, vault_key, catalog), "CONNECTOR_LOG_FORMAT": "json"}
                processes.append(
                    await asyncio.create_subprocess_exec(sys.executable, *command, env=env, stdout=log, stderr=log)
                )
            try:
                for name, port in ports.items():
                    try:
                        await wait_until_up(f"http://127.0.0.1:{port}/healthz", within=60)
                    except RuntimeError:
                        output = (Path(tmp) / "servers.log").read_text(errors="replace")[-2000:]
                        raise SystemExit(f"{name} did not come up; the servers' output ends:\n{output}") from None
                print(f"| request | {' | '.join(SERVERS)} |")
                print(f"|---|{'---|' * len(SERVERS)}")
                for what, raw in MALFORMED.items():
                    answers = [await asyncio.to_thread(answer, port, raw) for port in ports.values()]
                    print(f"| {what} | {' | '.join(a.replace('|', '/') for a in answers)} |")
            finally:
                for process in processes:
                    process.terminate()
                    await process.wait()


if __name__ == "__main__":
    asyncio.run(main())
