"""An independent, OpenID-Certified OpenID Provider (panva's `oidc-provider`, npm) in its own process, for tests.

    async with OidcOp.start(config) as op:       # config: see tests/oidc_op/README.md
        op.discovery_url                         # http://127.0.0.1:<port>/.well-known/openid-configuration
        result = await op.authorize(op.client("web"), scope="openid api.read")
        ...
        await op.stats()                         # token endpoint requests by grant_type, revocations, ...

The OP is `tests/oidc_op/server.mjs`: oidc-provider as shipped, configured through its documented options, with
automatic (redirect-only) login and consent and a few test-only controls under `/__admin/`. Its dependencies are
pinned by `tests/oidc_op/package-lock.json`; `npm ci` runs here when `node_modules` is missing or older than the
lock file. Without `node`/`npm` on PATH the test is skipped (and CI, with CONNECTOR_REQUIRE_ALL_TESTS=1, fails).

The `OidcOp` object holds no event-loop-bound state (a plain subprocess; a fresh httpx client per call), so a
module-scoped fixture can share it between tests running on different loops.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import fcntl
import hashlib
import json
import secrets
import shutil
import subprocess
import tempfile
import threading
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote_plus, urlencode, urljoin, urlsplit

import httpx
import pytest

OP_DIR = Path(__file__).resolve().parent / "oidc_op"
SERVER = OP_DIR / "server.mjs"
LOCK_FILE = OP_DIR / "package-lock.json"
NODE_MODULES = OP_DIR / "node_modules"
# Written after a successful `npm ci`; the Makefile uses the same stamp.
INSTALL_STAMP = NODE_MODULES / ".installed"
INTROSPECTOR_ID = "oidc-op-harness-introspector"

READY_TIMEOUT = 20.0
NPM_TIMEOUT = 300.0
HTTP_TIMEOUT = 10.0

_install_lock = threading.Lock()
_installed = False


# ------------------------------------------------------------------------------------------- RFC 6749 helpers


def basic_auth_header(client_id: str, client_secret: str) -> str:
    """`Authorization` value for client_secret_basic per RFC 6749 §2.3.1: form-urlencode id and secret
    (application/x-www-form-urlencoded, Appendix B), join with ':', then base64."""
    raw = f"{quote_plus(client_id, safe='')}:{quote_plus(client_secret, safe='')}"
    return "Basic " + base64.b64encode(raw.encode()).decode()


def naive_basic_auth_header(client_id: str, client_secret: str) -> str:
    """Plain RFC 7617 Basic auth WITHOUT the form-encoding RFC 6749 requires (what many HTTP libraries send)."""
    return "Basic " + base64.b64encode(f"{client_id}:{client_secret}".encode()).decode()


def pkce_pair() -> tuple[str, str]:
    """(code_verifier, S256 code_challenge)."""
    verifier = secrets.token_urlsafe(48)
    challenge = base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).rstrip(b"=").decode()
    return verifier, challenge


# -------------------------------------------------------------------------------------------------- clients


@dataclass(frozen=True)
class OidcClient:
    """One client of the configuration, as the OP knows it."""

    client_id: str
    client_secret: str | None
    token_endpoint_auth_method: str
    redirect_uris: tuple[str, ...]
    metadata: Mapping[str, Any]

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> OidcClient:
        return cls(
            client_id=metadata["client_id"],
            client_secret=metadata.get("client_secret"),
            # oidc-provider's default for token_endpoint_auth_method is client_secret_basic
            token_endpoint_auth_method=metadata.get("token_endpoint_auth_method", "client_secret_basic"),
            redirect_uris=tuple(metadata.get("redirect_uris", ())),
            metadata=dict(metadata),
        )

    @property
    def redirect_uri(self) -> str:
        return self.redirect_uris[0]

    def authenticate(self, form: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """(headers, form) for a token/revocation/introspection request, authenticated the RFC 6749 way."""
        data = dict(form)
        headers: dict[str, str] = {}
        method = self.token_endpoint_auth_method
        if method == "client_secret_basic":
            assert self.client_secret is not None
            headers["Authorization"] = basic_auth_header(self.client_id, self.client_secret)
        elif method == "client_secret_post":
            assert self.client_secret is not None
            data.update(client_id=self.client_id, client_secret=self.client_secret)
        elif method == "none":
            data["client_id"] = self.client_id
        else:
            raise ValueError(f"the harness does not speak {method}")
        return headers, data


@dataclass(frozen=True)
class AuthorizationResult:
    """Where the OP finally redirected the browser: the client's redirect_uri with the response parameters.

    The redirect_uri itself is never fetched.
    """

    location: str
    params: dict[str, str]
    code_verifier: str | None = None
    redirect_uri: str | None = None
    hops: tuple[str, ...] = field(default=())

    @property
    def code(self) -> str | None:
        return self.params.get("code")

    @property
    def state(self) -> str | None:
        return self.params.get("state")

    @property
    def iss(self) -> str | None:
        return self.params.get("iss")

    @property
    def error(self) -> str | None:
        return self.params.get("error")


# ------------------------------------------------------------------------------------------------- bootstrap


def _node_tools() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        missing = " and ".join(name for name, path in (("node", node), ("npm", npm)) if path is None)
        pytest.skip(f"the oidc-provider test OP needs Node.js: {missing} not found on PATH")
    return node, npm


def needs_install() -> bool:
    """True when node_modules is missing or older than package-lock.json."""
    if not INSTALL_STAMP.exists():
        return True
    return INSTALL_STAMP.stat().st_mtime < LOCK_FILE.stat().st_mtime


def _npm_ci(npm: str) -> None:
    global _installed
    with _install_lock:
        if _installed:
            return
        # Other processes (another pytest, `make`) may install at the same time: one at a time, then re-check.
        with open(OP_DIR / ".npm-ci.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                if needs_install():
                    proc = subprocess.run(
                        [npm, "ci", "--no-audit", "--no-fund"],
                        cwd=OP_DIR,
                        capture_output=True,
                        text=True,
                        timeout=NPM_TIMEOUT,
                        check=False,
                    )
                    if proc.returncode != 0:
                        raise RuntimeError(
                            f"`npm ci` in {OP_DIR} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
                        )
                    INSTALL_STAMP.touch()
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)
        _installed = True


async def ensure_installed() -> str:
    """Check for node/npm (else pytest.skip), run `npm ci` if needed; return the path of `node`."""
    node, npm = _node_tools()
    await asyncio.to_thread(_npm_ci, npm)
    return node


# ---------------------------------------------------------------------------------------------- the OP


class OidcOp:
    """A running oidc-provider. Create with `async with OidcOp.start(config) as op:`."""

    def __init__(
        self,
        *,
        issuer: str,
        port: int,
        config: dict[str, Any],
        process: subprocess.Popen[bytes],
        log_path: Path,
        introspector: OidcClient,
    ) -> None:
        self.issuer = issuer
        self.port = port
        self.config = config
        self.discovery_url = f"{issuer}/.well-known/openid-configuration"
        self.clients = {
            c["client_id"]: OidcClient.from_metadata(c) for c in config["clients"] if c["client_id"] != INTROSPECTOR_ID
        }
        self._process = process
        self._log_path = log_path
        self._introspector = introspector
        self._discovery: dict[str, Any] | None = None

    # --------------------------------------------------------------------------------------- lifecycle

    @classmethod
    @contextlib.asynccontextmanager
    async def start(cls, config: Mapping[str, Any], *, ready_timeout: float = READY_TIMEOUT) -> AsyncIterator[OidcOp]:
        """Start the OP with `config` (tests/oidc_op/README.md) on a free loopback port; stop it on exit.

        The harness adds one confidential client of its own (`INTROSPECTOR_ID`, random secret, no grants) that
        `introspect()` authenticates as; it is not in `clients`.
        """
        node = await ensure_installed()
        introspector_secret = secrets.token_urlsafe(24)
        full = dict(config)
        full["clients"] = [
            *config.get("clients", ()),
            {
                "client_id": INTROSPECTOR_ID,
                "client_secret": introspector_secret,
                "token_endpoint_auth_method": "client_secret_basic",
                "grant_types": [],
                "response_types": [],
                "redirect_uris": [],
            },
        ]
        with tempfile.TemporaryDirectory(prefix="oidc-op-") as tmp:
            config_path = Path(tmp) / "config.json"
            config_path.write_text(json.dumps(full))
            log_path = Path(tmp) / "op.log"
            process = await asyncio.to_thread(_spawn, node, config_path, log_path)
            try:
                ready = await _wait_ready(process, log_path, ready_timeout)
                introspector = OidcClient.from_metadata(full["clients"][-1])
                yield cls(
                    issuer=ready["issuer"],
                    port=ready["port"],
                    config=full,
                    process=process,
                    log_path=log_path,
                    introspector=introspector,
                )
            finally:
                await asyncio.to_thread(_stop, process)

    def log(self) -> str:
        """What the OP wrote to stderr so far (oidc-provider notices, one line per request, admin actions)."""
        return self._log_path.read_text(errors="replace")

    @property
    def running(self) -> bool:
        return self._process.poll() is None

    # ------------------------------------------------------------------------------------------ clients

    def client(self, client_id: str | None = None) -> OidcClient:
        """The client `client_id`, or the only/first configured one."""
        if client_id is None:
            return next(iter(self.clients.values()))
        return self.clients[client_id]

    # ------------------------------------------------------------------------------------------- OP data

    async def discovery(self) -> dict[str, Any]:
        if self._discovery is None:
            async with self._http() as http:
                response = await http.get(self.discovery_url)
                response.raise_for_status()
                self._discovery = response.json()
        return self._discovery

    async def endpoint(self, name: str) -> str:
        """An endpoint URL from discovery, e.g. endpoint("token") -> discovery["token_endpoint"]."""
        return str((await self.discovery())[f"{name}_endpoint"])

    async def introspect(self, token: str, *, token_type_hint: str | None = None) -> dict[str, Any]:
        """RFC 7662 introspection of any token, authenticated as the harness's own confidential client."""
        form = {"token": token}
        if token_type_hint is not None:
            form["token_type_hint"] = token_type_hint
        headers, data = self._introspector.authenticate(form)
        async with self._http() as http:
            response = await http.post(await self.endpoint("introspection"), data=data, headers=headers)
            response.raise_for_status()
            result: dict[str, Any] = response.json()
            return result

    # -------------------------------------------------------------------------------------- admin calls

    async def stats(self) -> dict[str, Any]:
        """Counters since start (or the last reset_stats()):

        `token_requests` {grant_type: n} (every token endpoint request, whatever its outcome),
        `token_errors` {grant_type: {error: n}}, `revocation_requests`, `revocations` (answered 200),
        `introspection_requests`, `authorization_requests`, `userinfo_requests`, `sub_overrides_applied`.
        """
        return await self._admin("GET", "stats")

    async def reset_stats(self) -> None:
        await self._admin("POST", "stats/reset")

    async def override_sub(self, sub: str | None, *, client_id: str | None = None) -> None:
        """The next refresh_token grant (of `client_id`, or of any client) is issued for account id `sub`: its
        ID token (and access token) carry that `sub`. Applies once; `None` clears a pending override."""
        body: dict[str, Any] = {"sub": sub}
        if client_id is not None:
            body["client_id"] = client_id
        await self._admin("POST", "sub-override", body)

    async def set_login_account(self, account: str) -> None:
        """Whom the automatic login signs in from now on (a `login_hint` naming an account still wins)."""
        await self._admin("POST", "login-account", {"account": account})

    async def set_narrow_scopes(self, scopes: list[str]) -> None:
        """The scopes the automatic consent refuses from now on (replaces the configured `narrow_scopes`)."""
        await self._admin("POST", "narrow-scopes", {"scopes": scopes})

    async def deny_next(self, error: str = "access_denied", description: str | None = None) -> None:
        """The next interaction (login or consent) ends with this error at the client's redirect_uri."""
        body: dict[str, Any] = {"error": error}
        if description is not None:
            body["error_description"] = description
        await self._admin("POST", "deny-next", body)

    # ----------------------------------------------------------------------------------- browser side

    async def follow(
        self, url: str, redirect_uri: str, *, http: httpx.AsyncClient | None = None, max_hops: int = 10
    ) -> AuthorizationResult:
        """Play the browser from `url` (an authorization request, e.g. one built by the code under test): follow
        the OP's redirects (with cookies) until one points at `redirect_uri`, and return it without fetching it.

        A fresh cookie jar (no `http`) is a fresh OP session: login and consent happen again.
        """
        own = http is None
        client = http if http is not None else httpx.AsyncClient(timeout=HTTP_TIMEOUT)
        hops: list[str] = []
        try:
            current = url
            for _ in range(max_hops):
                hops.append(current)
                response = await client.get(current, follow_redirects=False)
                location = response.headers.get("location")
                if not response.is_redirect or location is None:
                    raise AssertionError(
                        f"the OP answered {response.status_code} at {current} instead of redirecting:\n"
                        f"{response.text[:2000]}\n--- OP log ---\n{self.log()[-4000:]}"
                    )
                location = urljoin(current, location)
                if _same_endpoint(location, redirect_uri):
                    query = {k: v[-1] for k, v in parse_qs(urlsplit(location).query, keep_blank_values=True).items()}
                    return AuthorizationResult(location, query, redirect_uri=redirect_uri, hops=tuple(hops))
                current = location
            raise AssertionError(f"no redirect to {redirect_uri} after {max_hops} hops: {hops}")
        finally:
            if own:
                await client.aclose()

    async def authorize(
        self,
        client: OidcClient,
        *,
        scope: str,
        prompt: str | None = None,
        state: str | None = None,
        redirect_uri: str | None = None,
        extra: Mapping[str, str] | None = None,
        http: httpx.AsyncClient | None = None,
    ) -> AuthorizationResult:
        """An authorization-code request with PKCE S256 (and a nonce when `openid` is asked), followed to the
        redirect_uri. The result carries the code_verifier for the token request."""
        verifier, challenge = pkce_pair()
        redirect_uri = redirect_uri or client.redirect_uri
        params = {
            "response_type": "code",
            "client_id": client.client_id,
            "redirect_uri": redirect_uri,
            "scope": scope,
            "state": state or secrets.token_urlsafe(16),
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
        if "openid" in scope.split():
            params["nonce"] = secrets.token_urlsafe(16)
        if prompt is not None:
            params["prompt"] = prompt
        params.update(extra or {})
        url = f"{await self.endpoint('authorization')}?{urlencode(params)}"
        result = await self.follow(url, redirect_uri, http=http)
        return AuthorizationResult(
            result.location, result.params, code_verifier=verifier, redirect_uri=redirect_uri, hops=result.hops
        )

    # ---------------------------------------------------------------------------------------- internals

    def _http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(timeout=HTTP_TIMEOUT)

    async def _admin(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        async with self._http() as http:
            response = await http.request(method, f"{self.issuer}/__admin/{path}", json=body)
        if response.status_code != 200:
            raise AssertionError(f"admin {method} /__admin/{path}: {response.status_code} {response.text}")
        result: dict[str, Any] = response.json()
        return result


def _same_endpoint(location: str, redirect_uri: str) -> bool:
    a, b = urlsplit(location), urlsplit(redirect_uri)
    return (a.scheme, a.netloc, a.path) == (b.scheme, b.netloc, b.path)


def _spawn(node: str, config_path: Path, log_path: Path) -> subprocess.Popen[bytes]:
    with open(log_path, "wb") as log_file:  # the child keeps its own descriptor
        return subprocess.Popen(
            [node, str(SERVER), "--config", str(config_path), "--port", "0", "--exit-on-stdin-close"],
            cwd=OP_DIR,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log_file,
        )


async def _wait_ready(process: subprocess.Popen[bytes], log_path: Path, seconds: float) -> dict[str, Any]:
    assert process.stdout is not None
    stdout = process.stdout

    def read_ready() -> bytes:
        return stdout.readline()

    try:
        line = await asyncio.wait_for(asyncio.to_thread(read_ready), seconds)
    except TimeoutError:
        process.kill()  # unblocks the reading thread
        await asyncio.to_thread(process.wait)
        raise RuntimeError(
            f"the oidc-provider OP was not ready within {seconds:g} s; its stderr:\n{_read(log_path)}"
        ) from None
    try:
        ready: dict[str, Any] = json.loads(line)
        assert ready.get("ready") is True
    except (ValueError, AssertionError):
        await asyncio.to_thread(_stop, process)
        raise RuntimeError(
            f"the oidc-provider OP did not start (exit code {process.returncode}); stdout: {line!r}; "
            f"its stderr:\n{_read(log_path)}"
        ) from None
    # Nothing else is expected on stdout, but never let a full pipe block the OP.
    threading.Thread(target=_drain, args=(stdout,), daemon=True).start()
    return ready


def _drain(stream: Any) -> None:
    with contextlib.suppress(ValueError, OSError):
        for _ in stream:
            pass


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError as exc:
        return f"(cannot read {path}: {exc})"


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=5)
    if process.stdout is not None:
        with contextlib.suppress(OSError):
            process.stdout.close()


__all__ = [
    "INTROSPECTOR_ID",
    "AuthorizationResult",
    "OidcClient",
    "OidcOp",
    "basic_auth_header",
    "ensure_installed",
    "naive_basic_auth_header",
    "needs_install",
    "pkce_pair",
]
