"""The mock provider's sign-in page, on the wire of the mock (HTTP on loopback, as a browser reaches it): the page
and its headers, approve as another user with a narrowed scope, deny, an answer given twice; and that the scripted
browser goes through it like a person pressing Approve."""

from __future__ import annotations

import base64
import hashlib
import re
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx

from service.testing import MockOAuthProvider
from service.testing.browser import is_mock_sign_in

REDIRECT_URI = "http://127.0.0.1:8799/callback/mock"
VERIFIER = "v" * 64


def authorize_query(provider: MockOAuthProvider, scope: str = "read:user repo") -> str:
    challenge = base64.urlsafe_b64encode(hashlib.sha256(VERIFIER.encode()).digest()).rstrip(b"=").decode()
    return urlencode(
        {
            "client_id": provider.client_id,
            "redirect_uri": REDIRECT_URI,
            "response_type": "code",
            "scope": scope,
            "state": "st-1",
            "code_challenge": challenge,
            "code_challenge_method": "S256",
        }
    )


def form_fields(page: str) -> dict[str, str]:
    return dict(re.findall(r'<input type="hidden" name="(\w+)" value="([^"]*)"', page))


async def test_approving_as_another_user_with_a_scope_unticked() -> None:
    provider = MockOAuthProvider(
        sign_in_page=True, users=[{"id": 7, "login": "second-user", "name": "Second"}], display_name="Demo (mock)"
    )
    async with provider.serve_http() as base_url, httpx.AsyncClient() as http:
        page = await http.get(f"{base_url}/authorize?{authorize_query(provider)}")
        assert page.status_code == 200 and is_mock_sign_in(page)
        assert "Sign in to Demo (mock)" in page.text and "second-user" in page.text
        assert re.search(r'type="checkbox" name="scope" value="repo" checked', page.text)
        csp = page.headers["content-security-policy"]
        assert "default-src 'none'" in csp and "form-action 'self' http://127.0.0.1:8799" in csp
        assert "frame-ancestors 'none'" in csp and page.headers["cache-control"] == "no-store"
        assert provider.issued_codes == []  # nothing is granted by showing the page
        request_id = form_fields(page.text)["request"]
        answer = await http.post(
            f"{base_url}/authorize",
            data={"request": request_id, "user": "1", "scope": ["read:user"], "action": "approve"},
        )
        assert answer.status_code == 302
        back = urlsplit(answer.headers["location"])
        assert f"{back.scheme}://{back.netloc}{back.path}" == REDIRECT_URI
        query = parse_qs(back.query)
        assert query["state"] == ["st-1"]
        token = await http.post(
            f"{base_url}/token",
            data={
                "grant_type": "authorization_code",
                "code": query["code"][0],
                "redirect_uri": REDIRECT_URI,
                "code_verifier": VERIFIER,
                "client_id": provider.client_id,
                "client_secret": provider.client_secret,
            },
        )
        assert token.status_code == 200 and token.json()["scope"] == "read:user"  # repo was unticked
        user = await http.get(
            f"{base_url}/api/user", headers={"Authorization": f"Bearer {token.json()['access_token']}"}
        )
        assert user.json()["login"] == "second-user"
        again = await http.post(f"{base_url}/authorize", data={"request": request_id, "action": "approve"})
        assert again.status_code == 400 and "already answered" in again.text  # one answer per sign-in


async def test_denying_sends_access_denied_back() -> None:
    provider = MockOAuthProvider(sign_in_page=True)
    async with provider.serve_http() as base_url, httpx.AsyncClient() as http:
        page = await http.get(f"{base_url}/authorize?{authorize_query(provider)}")
        answer = await http.post(
            f"{base_url}/authorize", data={"request": form_fields(page.text)["request"], "action": "deny"}
        )
    query = parse_qs(urlsplit(answer.headers["location"]).query)
    assert answer.status_code == 302 and query == {"error": ["access_denied"], "state": ["st-1"]}
    assert provider.issued_codes == []


async def test_without_the_page_consent_is_given_at_once() -> None:
    provider = MockOAuthProvider()  # the default: fast tests
    async with provider.serve_http() as base_url, httpx.AsyncClient() as http:
        answer = await http.get(f"{base_url}/authorize?{authorize_query(provider)}")
    assert answer.status_code == 302 and "code=" in answer.headers["location"]
