"""One connector replica using a grant: `python -m tests.replica_worker COUNT ISSUER SUBJECT [PROVIDER]`.

Settings come from CONNECTOR_* variables (the same database as the other replicas). The process prints `ready`
once its connector has started, waits for a line `go` on stdin, then makes COUNT concurrent uses of the user's
grant (COUNT concurrent `GET user` requests through one `connector.http(user, provider)` client, as an agent
serving many tool calls at once does), and prints one JSON line:
{"statuses": {"200": n, ...}, "errors": {"NotAuthorized": n, ...}}. Used by tests/test_replicas.py and bench/.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter

import httpx

from service import Connector, Identity


async def use_once(api: httpx.AsyncClient) -> str:
    try:
        return str((await api.get("user")).status_code)
    except Exception as exc:  # reported by kind: the test counts failures, whatever they are
        return type(exc).__name__


async def run(count: int, user: Identity, provider: str) -> dict[str, dict[str, int]]:
    connector = Connector.from_config()
    await connector.start()
    try:
        print("ready", flush=True)
        line = await asyncio.to_thread(sys.stdin.readline)
        if line.strip() != "go":
            raise SystemExit("expected `go` on stdin")
        async with connector.http(user, provider, timeout=60.0) as api:
            results = Counter(await asyncio.gather(*(use_once(api) for _ in range(count))))
    finally:
        await connector.close()
    return {
        "statuses": {k: v for k, v in results.items() if k.isdigit()},
        "errors": {k: v for k, v in results.items() if not k.isdigit()},
    }


def main() -> None:
    count, issuer, subject = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    provider = sys.argv[4] if len(sys.argv) > 4 else "github"
    print(json.dumps(asyncio.run(run(count, Identity(issuer, subject), provider))), flush=True)


if __name__ == "__main__":
    main()
