"""The token proxy's target URL: built and checked once per (base, path, query), and never served across bases."""

from __future__ import annotations

import pytest

from service.core.errors import FlowRefused
from service.web.api import proxy
from service.web.api.proxy import target_url


def test_a_kept_target_belongs_to_its_own_base() -> None:
    first = target_url("https://api.one.test/v3", "user/repos", b"page=2")
    second = target_url("https://api.two.test/base", "user/repos", b"page=2")
    assert str(first) == "https://api.one.test/v3/user/repos?page=2"
    assert str(second) == "https://api.two.test/base/user/repos?page=2"
    assert target_url("https://api.one.test/v3", "user/repos", b"page=2") == first
    assert str(target_url("https://api.one.test/v3", "user/repos", b"page=3")).endswith("?page=3")


@pytest.mark.parametrize("path", ["../admin", "a/../../admin", "%2e%2e/admin", "a//b", "%2Fetc", "a%3Fb"])
def test_a_path_that_leaves_the_base_is_refused_every_time(path: str) -> None:
    target_url("https://api.one.test/v3", "a/b", b"")  # a neighbour kept before
    for _ in range(2):
        with pytest.raises(FlowRefused) as refused:
            target_url("https://api.one.test/v3", path, b"")
        assert refused.value.code == "proxy_path_refused"


def test_a_long_target_is_built_but_not_kept() -> None:
    kept = proxy._target_url.cache_info().currsize
    query = b"q=" + b"x" * proxy.TARGET_KEPT_MAX_CHARS
    url = target_url("https://api.one.test/v3", "search", query)
    assert url.raw_path.endswith(query) and proxy._target_url.cache_info().currsize == kept


@pytest.mark.parametrize("base", ["https://api.one.test", "https://api.one.test/v3"])
@pytest.mark.parametrize(
    "path",
    ["@evil.test/x", "%40evil.test", ":8443/x", "%3a8443/x", "[::1]/x", "https:evil.test", "%252e%252e/x", "..;/x"],
)
def test_a_path_never_changes_the_host_or_port(base: str, path: str) -> None:
    """What looks like a userinfo, a port, an IPv6 literal or a scheme is a path segment under the base, sent as is."""
    url = target_url(base, path, b"")
    assert (url.scheme, url.host, url.port) == ("https", "api.one.test", None)
    assert url.raw_path == (base.removeprefix("https://api.one.test") + "/" + path).encode()
