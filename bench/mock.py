"""The mock OAuth provider as its own loopback server, for the benchmarks.

python -m bench.mock PORT CLIENT_ID CLIENT_SECRET   (started by bench/flow.py)
"""

from __future__ import annotations

import asyncio
import sys

from bench.harness import serve_on_loopback
from service.testing import MockOAuthProvider

if __name__ == "__main__":
    port, client_id, client_secret = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    provider = MockOAuthProvider(base_url=f"http://127.0.0.1:{port}", client_id=client_id, client_secret=client_secret)
    asyncio.run(serve_on_loopback(provider.asgi_app(), port))
