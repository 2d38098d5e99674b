"""The proxy streams: a 100 MiB response passes through a sidecar process without growing its memory."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from service import Identity
from service.store import Store

from .api_support import make_key, user_headers
from .sidecar_support import bulk_api, peak_rss_kib, seed_grant, serve_app, sidecar_env, sidecar_process

USER = Identity("https://login.example.com", "streamer")
MIB = 1 << 20


@pytest.mark.duration(3)
async def test_a_100_mib_response_streams_with_flat_memory(tmp_path: Path) -> None:
    async with serve_app(bulk_api()) as upstream:
        env = sidecar_env_for(tmp_path, upstream)
        async with sidecar_process(env, tmp_path / "sidecar.log") as pid:
            store = Store.from_url(env["CONNECTOR_DATABASE__URL"])
            try:
                key = await make_key(store)
                await seed_grant(store, env["CONNECTOR_VAULT__KEYS"], USER, "bulk", "bulk-access-token")
            finally:
                await store.close()
            headers = {"Authorization": f"Bearer {key}", **user_headers(USER)}
            base = env["CONNECTOR_PUBLIC_BASE_URL"]
            async with httpx.AsyncClient(timeout=120) as client:
                # Warm up (imports, first connections), then measure the peak over a 100 MiB transfer.
                warm = await client.get(f"{base}/v1/proxy/bulk/big", params={"mb": "2"}, headers=headers)
                assert warm.status_code == 200 and len(warm.content) == 2 * MIB
                before = peak_rss_kib(pid)
                received = 0
                async with client.stream(
                    "GET", f"{base}/v1/proxy/bulk/big", params={"mb": "100"}, headers=headers
                ) as r:
                    assert r.status_code == 200 and r.headers["content-length"] == str(100 * MIB)
                    async for chunk in r.aiter_raw():
                        received += len(chunk)
                after = peak_rss_kib(pid)
    assert received == 100 * MIB
    grown_mib = (after - before) / 1024
    assert grown_mib < 20, f"the sidecar's peak memory grew by {grown_mib:.0f} MiB while streaming 100 MiB"
    assert "bulk-access-token" not in (tmp_path / "sidecar.log").read_text()


def sidecar_env_for(tmp_path: Path, upstream: str) -> dict[str, str]:
    entry = {
        "display_name": "Bulk API",
        "authorization_endpoint": f"{upstream}/authorize",
        "token_endpoint": f"{upstream}/token",
        "api_base_url": f"{upstream}/api",
    }
    return sidecar_env(tmp_path, {"bulk": entry}, {"bulk": ("bulk-client", "bulk-secret")})
