"""docs/providers.md from the shipped catalog (`make reference`; tests/test_provider_docs.py keeps them equal)."""

from __future__ import annotations

import sys
from pathlib import Path

from .describe import entry_facts
from .entry import ProviderEntry
from .loading import load_catalog

CATALOG = Path(__file__).resolve().parents[2] / "config" / "providers.toml"

_INTRO = """\
# Providers

<!-- Generated from config/providers.toml by `make reference` (python -m service.providers.docs). Do not edit. -->

The connector ships a catalog of {count} OAuth 2.0 / OpenID Connect providers and {credentials} API-key or HTTP Basic
entries (`config/providers.toml`; the latter under "API keys and other credentials" below). Each entry's facts
come from the provider's published documentation, whose address is in the entry (and below); what could not be
confirmed there is said in the entry's comment. An OAuth provider is usable once its client credentials are in the
environment (`CONNECTOR_PROVIDER_<NAME>_CLIENT_ID` / `_CLIENT_SECRET`) and the redirect URI
`<public_base_url>/callback/<name>` is registered with it (`acp-connector providers list` prints it).

Every entry is tested end to end (`tests/test_provider_matrix.py`): connect, use through `Connector.http()` and
`/v1/proxy`, refresh and revoke as the provider supports them, against a mock built from the entry itself
(`acp-connector mock-provider --like NAME`, `service.testing.EmulatedProvider.like(NAME)`).

## Per-connection values

Some providers' URLs name something of the connection: a directory (`{{tenant}}`), a shop or account
(`{{subdomain}}`), an instance (`{{instance_url}}`), a company (`{{realm_id}}`). The entry says where each comes from:

- **the agent**: `request_authorization(..., connection={{"subdomain": "acme"}})` (embedded and `SidecarClient`), or
  `"connection": {{...}}` in `POST /v1/elicitations`. A missing one is refused before anything is asked
  (`missing_connection_value`, naming it), a malformed one too (`invalid_connection_value`): the value's `pattern`
  decides which hosts receive the client secret and the user's tokens;
- **the callback**: a query parameter of the provider's redirect (QuickBooks' `realmId`);
- **the token response**: a JSON pointer into it (Salesforce's `/instance_url`), checked against the pattern.

The values are stored with the grant, encrypted with its tokens, and shown in grant metadata (`connection` of
`GET /v1/grants`), except those declared `secret`. Refreshes, API calls and revocation use the grant's values.

## Bad answers

A token response that does not match its entry (no token at the configured place, an unreadable expiry, an error
in a 200 answer, a per-connection value missing or not matching its pattern) ends the authorization with
`provider_token_error`, naming the provider and the field (`slack.token_response.access_token`); a callback
without a value it must carry ends it with `provider_callback_error`. Nothing is stored. The errors a provider
documents as arriving with HTTP 200 (`errors_with_200`) and the refresh errors that mean the user must authorize
again (`dead_refresh_token_errors`) are data on the entry (`ProviderEntry.quirks.token_response`).

## Legacy grants

A grant stored with a non-expiring access token and no refresh token, at a provider whose entry has
`legacy_token_exchange` (Shopify, whose non-expiring tokens stop working on 2027-01-01), is migrated with no user:
an RFC 8693 token exchange at the token endpoint, the stored token as the subject token, as the entry says (its
token types, extra parameters and body encoding). It happens at the grant's next use, once, under the same locks as
a refresh (one exchange whichever replicas use it), and for every such grant with `acp-connector grants migrate`
(docs/configuration.md, "Migrating legacy grants"). The answer must carry a refresh token and an expiry; from then
on the grant refreshes as any other. A refusal of the old token (`invalid_grant`, or a 401 naming another error
than `invalid_client`) marks the grant `needs_user`; any other failure backs off, as a refresh does.

## Adding a provider

1. Find the provider's OAuth documentation: the authorization and token endpoints, how the client authenticates
   (HTTP Basic or the form body), PKCE, the scope separator, refresh tokens (none, kept, or single-use),
   revocation, how to learn the account id, the API's base URL.
2. Copy the table in `config/providers.toml` closest to it, rename it, and write those facts, with the
   documentation's address as a comment and in `docs_url`. Say in the comment what the documentation does not
   confirm. Quirks are keys of the table (listed in the file's header); no code changes.
3. `acp-connector providers check NAME --offline` checks the table without any network;
   `acp-connector mock-provider --like NAME` serves a mock of it; `make test` runs it through the matrix.
4. `make reference` regenerates this page.

Not expressible today (and why): a token endpoint reached with `GET` or with the client secret in the URL's
query (secrets never go in a URL here); a value fetched after the grant (Atlassian's cloud id: the agent reads
`accessible-resources` through `http()` and names the site in its paths); a refresh answer shaped unlike the
code exchange's (Slack's user-token rotation); a refresh sent to another endpoint than the code exchange; a
refresh token carried in the URL's query (Miro's refresh example does; the connector sends it in the body).

Each entry's comments say what its documentation confirmed (`# Checked against <url> (date)`) and what could not
be confirmed (`# Not confirmed here:`); read them before relying on an entry, and fix the entry when the provider's
documentation says otherwise.

## The catalog

"""


_CREDENTIALS_INTRO = """
## API keys and other credentials

{count} entries are not OAuth providers: the user brings an API key, a personal access token or an HTTP Basic
pair (`kind = "api_key"` or `"basic"`). The agent asks for one exactly as for OAuth (`request_authorization(...,
provider="openai")`, `POST /v1/elicitations`): a URL-mode elicitation opens the connector's own page, which
verifies the user first, then shows one password field per value (no autocomplete, nothing echoed back). What is
typed is format-checked (prefix, length, characters), then proven by the entry's check request at the provider;
only then is it stored, encrypted like tokens, as a grant (with the account the check revealed, where it names
one), and `elicitation/complete` is sent. A refused value keeps the user on the page with the provider's refusal
in words and stores nothing. `Connector.http()` and `/v1/proxy` carry it as the entry says (a header, HTTP Basic
or a query parameter), only to the entry's API base; a 401 there marks the grant `needs_user` (reason
`key_rejected`), and asking again replaces it. `disconnect` deletes the stored copy only: the key stays valid at
the provider until the user revokes it there (the page and the entry say where).

To add one, copy the closest credential table in `config/providers.toml` (its keys are listed above the first
one); `tests/test_credential_entries.py` checks each entry against a mock API in its injection format.

"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _values(entry: ProviderEntry) -> str:
    return ", ".join(f"`{{{v.name}}}` ({v.source.replace('_', ' ')})" for v in entry.quirks.connection) or "-"


def _row(entry: ProviderEntry) -> str:
    if entry.credential is not None:
        return _credential_row(entry)
    docs = f"[docs]({entry.docs_url})" if entry.docs_url else "-"
    refresh = entry.quirks.token_request.refresh_tokens
    revokes = "yes" if entry.revocation_endpoint else "no"
    cells = [entry.shown_name, f"`{entry.name}`", _values(entry), refresh, revokes, docs]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _credential_row(entry: ProviderEntry) -> str:
    spec = entry.credential
    assert spec is not None
    docs = f"[docs]({entry.docs_url})" if entry.docs_url else "-"
    fields = ", ".join(f"`{name}`" for name in spec.fields)
    carried = "; ".join(injection.describe() for injection in spec.inject)
    check = f"{spec.check.method} {spec.check.path}" if spec.check else "-"
    cells = [entry.shown_name, f"`{entry.name}`", fields, carried, check, docs]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def render(catalog_path: Path = CATALOG) -> str:
    everything = load_catalog(catalog_path, env={}).entries()
    entries = [entry for entry in everything if entry.credential is None]
    credentials = [entry for entry in everything if entry.credential is not None]
    parts = [_INTRO.format(count=len(entries), credentials=len(credentials))]
    parts.append("| provider | name | per-connection values | refresh tokens | revocation | documentation |\n")
    parts.append("|---|---|---|---|---|---|\n")
    parts += [_row(entry) + "\n" for entry in entries]
    parts.append(_CREDENTIALS_INTRO.format(count=len(credentials)))
    parts.append("| provider | name | fields | carried as | check request | documentation |\n")
    parts.append("|---|---|---|---|---|---|\n")
    parts += [_row(entry) + "\n" for entry in credentials]
    entries = everything
    parts.append("\n## Each entry\n")
    for entry in entries:
        facts = entry_facts(entry)
        parts.append(f"\n### {_cell(entry.shown_name)} (`{entry.name}`)\n\n")
        parts += [f"- {line}\n" for line in facts.needs + facts.quirks]
    return "".join(parts)


if __name__ == "__main__":
    sys.stdout.write(render())
