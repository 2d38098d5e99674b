"""Bad input from a browser or an API caller gets a 4xx with a stable code, never a 500, and changes nothing."""

from __future__ import annotations

import httpx
import pytest

from .conftest import Deployment

ODD_IDS = ["x", "%00", "a" * 5000, "..%2f..%2fetc%2fpasswd", "%F0%9F%98%80", "<script>", "' OR 1=1 --"]


@pytest.mark.parametrize("odd", ODD_IDS)
async def test_odd_input_never_causes_a_server_error(deployment: Deployment, odd: str) -> None:
    base = deployment.base_url
    requests = [
        ("GET", f"/connect/{odd}", None),
        ("GET", f"/connect?elicitationId={odd}", None),
        ("POST", f"/connect/{odd}", {"csrf": odd, "action": "continue"}),
        ("POST", f"/connect/{odd}", {"action": odd}),
        ("GET", f"/callback/github?state={odd}&code={odd}", None),
        ("GET", f"/callback/{odd}?state={odd}", None),
        ("GET", f"/callback/github?error={odd}&state={odd}", None),
        ("GET", "/callback/github", None),
        ("PUT", "/connect/abc", None),
        ("GET", f"/static/{odd}", None),
    ]
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        for method, path, form in requests:
            response = await client.request(method, path, data=form)
            assert 400 <= response.status_code < 500, (method, path, response.status_code)
            assert "Traceback" not in response.text
            if "text/html" in response.headers.get("content-type", ""):
                assert response.headers.get("x-connector-error"), (method, path)
    assert await deployment.connector.runtime.store.grants.find(deployment.local_user, "github") == []


async def test_malformed_form_bodies_are_refused_cleanly(deployment: Deployment) -> None:
    async with httpx.AsyncClient(base_url=deployment.base_url, timeout=10) as client:
        for body, content_type in [
            (b"\xff\xfe\x00garbage", "application/x-www-form-urlencoded"),
            (b"--x\r\nbroken", "multipart/form-data; boundary=x"),
            (b"{}", "application/json"),
        ]:
            response = await client.post("/connect/abc", content=body, headers={"content-type": content_type})
            assert 400 <= response.status_code < 500, (content_type, response.status_code)
