"""The store's part of a connect flow, alone in one process: CPU and statements per flow on SQLite.

    python -m bench.store_steps [--flows 400] [--rounds 5] [--code DIR ...]

Runs the store calls a connect flow makes (the agent's grant check, the insert with `created`, `consented`, the
consent page's read with `opened`, the start with `verified` and its flow, the callback's claim, the completion with
a first grant, `completed` and its event-log row, the telling settled with `completion_sent`), one flow at a time on
a fresh SQLite file, and reports the process's CPU and the wall time per flow (`time.process_time`), the median wall
time of the completion's transaction (on the callback's path) and the statements per flow.
With `--code DIR` (a checkout of another revision, e.g. main's in a second worktree; repeatable) each round runs
every checkout in its own subprocess, alternating, so that the ratios are taken in the same minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parents[1]


async def one_run(flows: int) -> dict[str, float]:
    """In this process (the checkout on sys.path): `flows` connect flows' store calls; CPU ms and statements each."""
    from sqlalchemy import event

    from service.core.events import ElicitationEvent
    from service.core.identity import Identity
    from service.core.records import AuditEntry, ElicitationRecord, FlowRecord, GrantRecord
    from service.core.states import START_FROM, CompletionDelivery, ElicitationStatus
    from service.store import Store, migrate

    callback_statuses = [s.value for s in ElicitationStatus if not s.terminal or s is ElicitationStatus.CANCELLED]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/steps.db"
        migrate(url)
        store = Store.from_url(url)
        seen = [0]
        completions: list[float] = []  # the completion's transaction (on the callback's path), wall seconds

        def count(*_: Any) -> None:
            seen[0] += 1

        for engine in {store.db.writer.sync_engine, store.db.reader.sync_engine}:
            event.listen(engine, "before_cursor_execute", count)

        async def flow(n: int) -> None:
            now = datetime.now(UTC)
            user = Identity("https://login.example.com", f"user-{n}")
            rec = ElicitationRecord(
                id=uuid.uuid4().hex,
                connection_key=f"conn-{n}",
                identity=user,
                provider="github",
                scopes=("repo",),
                scope_kind="session",
                session_id="sess-1",
                tool_call_id="call-1",
                request_id=n,
                agent_name="Bench agent",
                message="Connect GitHub",
                status=ElicitationStatus.PENDING,
                failure_reason=None,
                created_at=now,
                expires_at=now + timedelta(minutes=10),
                updated_at=now,
                replica_id=store.outbox.origin,
            )

            def entry(name: str, detail: dict[str, Any] | None = None) -> AuditEntry:
                return AuditEntry(name, now, rec.id, user, "github", detail)

            await store.grants.find(user, "github")
            async with store.transaction() as tx:
                await store.elicitations.insert(rec, tx, audit=entry("created", {"scopes": ["repo"]}))
            async with store.transaction() as tx:
                await store.elicitations.transition(
                    rec.id, ElicitationStatus.CONSENTED, now=now, conn=tx, audit=entry("consented")
                )
            found = await store.elicitations.get_audited(rec.id, AuditEntry("opened", now, rec.id), now=now)
            if found is not None and not found[1]:  # not written with the read: as the core writes it then
                await store.audit.record("opened", elicitation_id=rec.id, identity=user, provider="github", now=now)
            state, binding = uuid.uuid4().hex, uuid.uuid4().hex
            started = FlowRecord(
                id=uuid.uuid4().hex,
                elicitation_id=rec.id,
                state_hash=state,
                verifier_key_id="k1",
                verifier_ciphertext=b"\x00" * 60,
                nonce=None,
                expected_issuer=None,
                browser_binding_hash=binding,
                redirect_uri="http://127.0.0.1/callback/github",
                created_at=now,
                expires_at=now + timedelta(minutes=10),
                used_at=None,
            )
            async with store.transaction() as tx:
                await store.elicitations.transition(
                    rec.id,
                    ElicitationStatus.AUTHORIZING,
                    from_=START_FROM,
                    flow=started,
                    now=now,
                    conn=tx,
                    audit=entry("verified"),
                )
            claimed = await store.flows.claim_with_elicitation(
                state, now, provider="github", binding_hash=binding, statuses=callback_statuses
            )
            assert claimed is not None
            grant = GrantRecord(
                id=uuid.uuid4().hex,
                identity=user,
                provider="github",
                provider_account_id=str(n),
                scopes=("repo",),
                token_key_id="k1",  # noqa: S106 - a key id, not a secret
                token_ciphertext=b"\x01" * 80,
                token_expires_at=now + timedelta(hours=1),
                created_at=now,
                updated_at=now,
            )
            ending = ElicitationEvent(rec.id, ElicitationStatus.COMPLETED, rec.connection_key)
            started_at = time.perf_counter()
            async with store.transaction() as tx:
                inserted, ended = await store.elicitations.end_with_first_grant(
                    rec.id,
                    ElicitationStatus.COMPLETED,
                    ending,
                    grant,
                    now=now,
                    conn=tx,
                    audit=entry("completed", {"grant_id": grant.id}),
                    take_telling=True,
                )
            assert inserted and ended is not None
            completions.append(time.perf_counter() - started_at)
            async with store.transaction() as tx:
                told = AuditEntry("completion_sent", now, rec.id)
                assert await store.elicitations.settle_completion(rec.id, CompletionDelivery.SENT, tx, audit=told)

        for n in range(20):  # warm up: statement caches, the SQLite page cache
            await flow(-1 - n)
        seen[0] = 0
        completions.clear()
        cpu, wall = time.process_time(), time.perf_counter()
        for n in range(flows):
            await flow(n)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        audited = len(await store.audit.list())
        await store.close()
    assert audited == 6 * (flows + 20), audited  # every step's row, once
    return {
        "cpu_ms": cpu * 1000 / flows,
        "wall_ms": wall * 1000 / flows,
        "completion_ms": statistics.median(completions) * 1000,
        "statements": seen[0] / flows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flows", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--code", action="append", default=[], help="another checkout to run beside this one")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a subprocess: one run, as JSON
    args = parser.parse_args()
    if args.one:
        print(json.dumps(asyncio.run(one_run(args.flows))))
        return
    checkouts = [HERE, *(Path(c).resolve() for c in args.code)]
    results: dict[Path, list[dict[str, float]]] = {c: [] for c in checkouts}
    print(f"load average at start {os.getloadavg()[0]:.1f}; {args.flows} flows a run, {args.rounds} rounds")
    for round_ in range(args.rounds):
        order = checkouts if round_ % 2 == 0 else checkouts[::-1]
        for checkout in order:
            python = checkout / ".venv" / "bin" / "python"
            run = [str(python), str(Path(__file__).resolve()), "--one", "--flows", str(args.flows)]
            env = {**os.environ, "PYTHONPATH": str(checkout)}
            done = subprocess.run(run, cwd=checkout, env=env, capture_output=True, text=True, check=True)  # noqa: S603
            results[checkout].append(json.loads(done.stdout.strip().splitlines()[-1]))
            last = results[checkout][-1]
            print(
                f"  round {round_ + 1} {checkout.name}: {last['cpu_ms']:.2f} ms of CPU, {last['wall_ms']:.2f} ms wall "
                f"(the completion's transaction p50 {last['completion_ms']:.2f} ms), "
                f"{last['statements']:.1f} statements"
                f" (load {os.getloadavg()[0]:.1f})"
            )
    first = statistics.median(r["cpu_ms"] for r in results[HERE])
    first_wall = statistics.median(r["wall_ms"] for r in results[HERE])
    first_completion = statistics.median(r["completion_ms"] for r in results[HERE])
    for checkout, runs in results.items():
        cpu = statistics.median(r["cpu_ms"] for r in runs)
        wall = statistics.median(r["wall_ms"] for r in runs)
        completion = statistics.median(r["completion_ms"] for r in runs)
        print(
            f"{checkout.name}: median {cpu:.2f} ms of CPU per flow ({min(r['cpu_ms'] for r in runs):.2f}-"
            f"{max(r['cpu_ms'] for r in runs):.2f}), {cpu / first:.2f}x this checkout's; wall {wall:.2f} ms, "
            f"{wall / first_wall:.2f}x; the completion's transaction {completion:.2f} ms, "
            f"{completion / first_completion:.2f}x; "
            f"{runs[0]['statements']:.1f} statements"
        )
    print(f"load average at end {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    sys.exit(main())
