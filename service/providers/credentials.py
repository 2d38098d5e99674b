"""Credential entries of the catalog (`kind = "api_key"` or `"basic"`): what the user types on the connector's own
page, how it is checked, how API calls carry it.

An OAuth entry says how to obtain a token; a credential entry says which fields the user enters (each with a label,
a help sentence, where the provider hands it out and an optional format check), how they are injected into API
calls (a header from a template such as `Bearer {api_key}`, HTTP Basic, or a query parameter), and an optional
check request that proves them before anything is stored. Values are only ever formatted into requests to the
entry's own API base; nothing here talks to a provider.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, field_validator, model_validator

from .quirks import PLACEHOLDER, placeholders, resolve_pointer

CredentialKind = Literal["api_key", "basic"]
InjectionStyle = Literal["header", "basic", "query"]
CheckMethod = Literal["GET", "POST"]

FIELD_NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,31}$")
# The longest value a field accepts (a JWT-shaped token is the longest kind in the catalog), and what no field
# accepts anywhere: whitespace and control characters (a pasted key with a newline is trimmed, not refused).
MAX_VALUE_LENGTH = 4096
_TOKEN_CHARS = re.compile(r"^[\x21-\x7e]+$")
# Header names (RFC 9110 tokens) and query parameter names a template may be injected under.
_HEADER_NAME = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$")
_PARAM_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class _Table(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class CredentialField(_Table):
    """`[name.fields.<field>]`: one value the user types (a key, an account SID, a token)."""

    label: StrictStr = Field(min_length=1, max_length=80)
    help: StrictStr = Field(min_length=1, max_length=400)  # one sentence: what it is, where it is found
    docs_url: StrictStr = Field(pattern=r"^https://[^\s]+$")  # where the user gets it
    prefix: StrictStr = ""  # it starts with this (OpenAI's "sk-", Stripe's "sk_" or "rk_": prefixes separated by |)
    min_length: StrictInt = Field(default=1, ge=1, le=MAX_VALUE_LENGTH)
    max_length: StrictInt = Field(default=512, ge=1, le=MAX_VALUE_LENGTH)
    characters: StrictStr | None = None  # a regular-expression character class body, e.g. "A-Za-z0-9_-"
    secret: bool = True  # False: an identifier (Twilio's account SID), still stored encrypted, shown as a hint too

    @field_validator("characters")
    @classmethod
    def _characters(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                re.compile(f"[{value}]")
            except re.error as exc:
                raise ValueError(f"not a character class: {exc}") from None
        return value

    @model_validator(mode="after")
    def _lengths(self) -> CredentialField:
        if self.min_length > self.max_length:
            raise ValueError("min_length is larger than max_length")
        return self

    def problem(self, value: str) -> str | None:
        """Why `value` (trimmed) cannot be this field, in a sentence that never repeats the value, or None."""
        label = self.label
        if not value:
            return f"{label} is empty."
        if not _TOKEN_CHARS.fullmatch(value):
            return f"{label} contains spaces or characters a key never has."
        if len(value) < self.min_length or len(value) > self.max_length:
            if self.min_length == self.max_length:
                return f"{label} must be exactly {self.min_length} characters long."
            return f"{label} must be {self.min_length} to {self.max_length} characters long."
        prefixes = [p for p in self.prefix.split("|") if p]
        if prefixes and not any(value.startswith(p) for p in prefixes):
            return f"{label} must start with {' or '.join(prefixes)}."
        if self.characters is not None and not re.fullmatch(f"[{self.characters}]+", value):
            return f"{label} contains characters this provider's keys do not have."
        return None


class Injection(_Table):
    """`[[name.inject]]`: how API calls carry the fields. `header`: `header: template`; `basic`: HTTP Basic of
    `username` and `password` (templates); `query`: the query parameter `parameter` = template."""

    style: InjectionStyle = "header"
    header: StrictStr = "Authorization"
    template: StrictStr = "Bearer {api_key}"
    parameter: StrictStr | None = None
    username: StrictStr | None = None
    password: StrictStr | None = None

    @model_validator(mode="after")
    def _shape(self) -> Injection:
        if self.style == "header" and not _HEADER_NAME.fullmatch(self.header):
            raise ValueError(f"{self.header!r} is not a header name")
        if self.style == "query" and (self.parameter is None or not _PARAM_NAME.fullmatch(self.parameter)):
            raise ValueError("style = 'query' needs parameter, a query parameter name")
        if self.style == "basic" and (self.username is None or self.password is None):
            raise ValueError("style = 'basic' needs username and password templates")
        return self

    def templates(self) -> tuple[str, ...]:
        if self.style == "basic":
            assert self.username is not None and self.password is not None
            return (self.username, self.password)
        return (self.template,)

    @property
    def target(self) -> str:
        """What the injection writes: a header name (lower case) or `?parameter`."""
        if self.style == "query":
            return f"?{self.parameter}"
        return "authorization" if self.style == "basic" else self.header.lower()

    def describe(self) -> str:
        if self.style == "basic":
            return f"HTTP Basic: {self.username} : {self.password}"
        if self.style == "query":
            return f"query parameter {self.parameter}={self.template}"
        return f"header {self.header}: {self.template}"


class CheckRequest(_Table):
    """`[name.check]`: one request that proves the fields work before anything is stored."""

    method: CheckMethod = "GET"
    path: StrictStr = Field(pattern=r"^/[^\s?#]*$")  # under the API base; may name fields ({account_sid})
    body: StrictStr | None = None  # a JSON body (a GraphQL query), sent as application/json
    expect: list[StrictInt] = Field(default_factory=lambda: [200])  # statuses that mean "works"
    # Statuses that mean "this credential is wrong" (any other is the provider failing: nothing stored either).
    refused: list[StrictInt] = Field(default_factory=lambda: [401, 403])
    account: StrictStr | None = None  # JSON pointer to the provider account in the answer (e.g. /id)
    error: StrictStr | None = None  # JSON pointer to the provider's refusal code in a refused answer
    timeout_seconds: float = Field(default=10.0, gt=0, le=60)

    @field_validator("body")
    @classmethod
    def _json(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                json.loads(value)
            except ValueError:
                raise ValueError("body must be JSON") from None
        return value

    @field_validator("account", "error")
    @classmethod
    def _pointer(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith("/"):
            raise ValueError(f"{value!r} is not a JSON pointer (it starts with '/')")
        return value


class CredentialSpec(_Table):
    """A credential entry's fields, injection and check, as one value (`ProviderEntry.credential`)."""

    kind: CredentialKind
    fields: dict[StrictStr, CredentialField]
    inject: tuple[Injection, ...]
    check: CheckRequest | None = None
    revoke_url: StrictStr | None = Field(default=None, pattern=r"^https://[^\s]+$")  # where the user revokes it

    @model_validator(mode="after")
    def _consistent(self) -> CredentialSpec:
        if not self.fields:
            raise ValueError("a credential entry needs at least one field ([name.fields.<field>])")
        for name in self.fields:
            if not FIELD_NAME_RE.fullmatch(name):
                raise ValueError(f"field name {name!r}: lower-case letters, digits and '_'")
        if not self.inject:
            raise ValueError("a credential entry needs [[name.inject]]: how API calls carry it")
        used: set[str] = set()
        for injection in self.inject:
            for template in injection.templates():
                unknown = placeholders(template) - set(self.fields)
                if unknown:
                    raise ValueError(f"inject names {{{', '.join(sorted(unknown))}}}, which is no field")
                used |= placeholders(template)
        if self.kind == "basic" and not any(i.style == "basic" for i in self.inject):
            raise ValueError("kind = 'basic' injects with style = 'basic'")
        unused = set(self.fields) - used
        if unused:
            raise ValueError(f"field {', '.join(sorted(unused))} is never injected")
        if self.check is not None:
            unknown = placeholders(self.check.path) - set(self.fields)
            if unknown:
                raise ValueError(f"check.path names {{{', '.join(sorted(unknown))}}}, which is no field")
        return self

    def problems(self, values: Mapping[str, str]) -> dict[str, str]:
        """Each field's format problem (field name -> sentence); a field missing from `values` is empty."""
        found = {}
        for name, spec in self.fields.items():
            problem = spec.problem(values.get(name, ""))
            if problem is not None:
                found[name] = problem
        return found

    def hint(self, values: Mapping[str, str]) -> str:
        """What may be shown of stored values: the last four characters of each (a value under 12 characters shows
        none), labelled."""
        parts = []
        for name, spec in self.fields.items():
            value = values.get(name, "")
            shown = f"…{value[-4:]}" if len(value) >= 12 else "set"
            parts.append(shown if len(self.fields) == 1 else f"{spec.label} {shown}")
        return ", ".join(parts)


def fill_values(template: str, values: Mapping[str, str]) -> str:
    """`template` with each `{field}` replaced by its value (every placeholder is a field: the catalog checks it)."""
    return PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def injected(injection: Injection, values: Mapping[str, str]) -> tuple[str, str]:
    """(header name or `?parameter`, value) that `injection` writes for `values`."""
    if injection.style == "basic":
        assert injection.username is not None and injection.password is not None
        pair = f"{fill_values(injection.username, values)}:{fill_values(injection.password, values)}"
        return "Authorization", "Basic " + base64.b64encode(pair.encode()).decode("ascii")
    if injection.style == "query":
        return f"?{injection.parameter}", fill_values(injection.template, values)
    return injection.header, fill_values(injection.template, values)


def account_from(document: object, pointer: str | None) -> str | None:
    """The provider account a check answer names at `pointer` (a short string), or None."""
    if pointer is None:
        return None
    value = resolve_pointer(document, pointer)
    if isinstance(value, bool) or not isinstance(value, str | int):
        return None
    text = str(value)
    return text if 0 < len(text) <= 200 and text.isprintable() else None
