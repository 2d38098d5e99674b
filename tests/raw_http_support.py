"""Proving a refusal changed nothing: row counts of every table, and raw HTTP exchanges below any client library."""

from __future__ import annotations

import asyncio
import contextlib

from sqlalchemy import func, select

from service.store import Store
from service.store.tables import metadata


async def row_counts(store: Store) -> dict[str, int]:
    """How many rows each table holds."""
    async with store.engine.connect() as conn:
        return {
            table.name: (await conn.execute(select(func.count()).select_from(table))).scalar_one()
            for table in metadata.sorted_tables
        }


async def raw_exchange(base_url: str, head: bytes, *, chunk: bytes = b"", max_chunks: int = 0) -> tuple[bytes, int]:
    """Send `head` on a fresh connection, then `chunk` up to `max_chunks` times until the server answers.

    Returns what the server answered (until the answer is complete by its Content-Length, or the server closes
    or goes quiet) and how many body bytes were sent.
    """
    host, port = base_url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    sent = 0
    answer = b""
    try:
        writer.write(head)
        await writer.drain()
        for _ in range(max_chunks):
            with contextlib.suppress(TimeoutError):
                answer = await asyncio.wait_for(reader.read(65536), 0.001)
            if answer or reader.at_eof():
                break
            try:
                writer.write(chunk)
                await writer.drain()
            except ConnectionError:
                break
            sent += len(chunk)
        while not _complete(answer):
            try:
                more = await asyncio.wait_for(reader.read(65536), 2.0)
            except (TimeoutError, ConnectionError):
                break
            if not more:
                break
            answer += more
        return answer, sent
    finally:
        writer.close()


def _complete(answer: bytes) -> bool:
    """Whether `answer` holds a whole HTTP/1.1 response: its head, and as much body as its Content-Length says."""
    head, separator, body = answer.partition(b"\r\n\r\n")
    if not separator:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def status_of_raw(answer: bytes) -> int:
    """The status code of a raw HTTP/1.1 answer."""
    return int(answer.split(b" ", 2)[1])
