"""Tests for service/vault.py: encryption with key ids and associated data, rotation, signing, key files."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
import os
import pickle
import re
import stat
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from pydantic import SecretStr

from service.core.errors import VaultError
from service.core.handles import flow_aad, grant_aad
from service.vault import (
    KeyRing,
    Vault,
    ensure_dev_key_file,
    generate_key,
    load_key_ring,
)

AAD = grant_aad("https://issuer.example", "alice", "github", "12345")


def raw_key(entry: str) -> bytes:
    encoded = entry.partition(":")[2]
    return base64.urlsafe_b64decode(encoded + "=" * (-len(encoded) % 4))


def secret_forms(entry: str) -> list[str]:
    """Every way key material of `entry` could leak into text."""
    raw = raw_key(entry)
    encoded = entry.partition(":")[2]
    return [encoded, encoded[:16], raw.hex(), base64.b64encode(raw).decode(), repr(raw), str(raw)]


def assert_no_secret(text: str, *entries: str) -> None:
    for entry in entries:
        for form in secret_forms(entry):
            assert form not in text


@pytest.fixture
def old_key() -> str:
    return generate_key("k-old")


@pytest.fixture
def new_key() -> str:
    return generate_key("k-new")


@pytest.fixture(autouse=True)
def _permissive_umask() -> Iterator[None]:
    # Under a permissive umask, created files are group/world readable unless the code sets the mode.
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


def write_key_file(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text, encoding="utf-8")
    path.chmod(mode)
    return path


# --- generate_key ------------------------------------------------------------------------------------------


def test_generate_key_default_id_and_32_random_bytes() -> None:
    first, second = generate_key(), generate_key()
    assert re.fullmatch(r"k-\d{8}-[0-9a-f]{4}:[A-Za-z0-9_-]{43}", first)
    assert len(raw_key(first)) == 32
    assert raw_key(first) != raw_key(second)


def test_generate_key_with_explicit_id_round_trips_through_a_ring() -> None:
    entry = generate_key("prod-2026")
    assert entry.startswith("prod-2026:")
    ring = KeyRing.from_strings([entry])
    assert ring.key_ids == ("prod-2026",)


@pytest.mark.parametrize("bad", ["", "has space", "a.b", "a:b", "-leading", "x" * 65])
def test_generate_key_rejects_invalid_key_ids(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid key id"):
        generate_key(bad)


# --- KeyRing.from_strings ----------------------------------------------------------------------------------


def test_first_key_is_primary_unless_named(old_key: str, new_key: str) -> None:
    ring = KeyRing.from_strings([new_key, old_key])
    assert ring.primary_key_id == "k-new"
    assert ring.key_ids == ("k-new", "k-old")
    assert KeyRing.from_strings([new_key, old_key], primary_key_id="k-old").primary_key_id == "k-old"


def test_primary_must_be_in_the_ring(old_key: str) -> None:
    with pytest.raises(VaultError, match="primary key id 'k-missing' is not in the key ring"):
        KeyRing.from_strings([old_key], primary_key_id="k-missing")


def test_empty_ring_is_refused() -> None:
    with pytest.raises(VaultError, match="key ring is empty"):
        KeyRing.from_strings([])


def test_same_key_id_with_different_keys_is_refused() -> None:
    with pytest.raises(VaultError, match="key id 'dup' is configured twice"):
        KeyRing.from_strings([generate_key("dup"), generate_key("dup")])


def test_same_entry_twice_is_harmless(old_key: str) -> None:
    assert KeyRing.from_strings([old_key, old_key]).key_ids == ("k-old",)


def test_padded_and_unpadded_base64url_are_both_accepted() -> None:
    entry = generate_key("k1")
    padded = entry + "="
    assert (
        Vault(KeyRing.from_strings([padded])).decrypt(
            *Vault(KeyRing.from_strings([entry])).encrypt(b"x", aad=b"a"), aad=b"a"
        )
        == b"x"
    )


def test_malformed_entries_are_refused_without_echoing_them() -> None:
    bare_key = generate_key("k").partition(":")[2]
    short = "k1:" + base64.urlsafe_b64encode(b"\x01" * 16).decode()
    not_b64 = "k1:" + "!" * 43
    bad_id = "bad id:" + bare_key
    cases = {
        bare_key: "key entry 1 is not in the form KID:BASE64URL",
        "k1:": "key entry 1 is not in the form",
        short: "key entry 1 \\(key id 'k1'\\) is 16 bytes long, expected 32",
        not_b64: "key entry 1 \\(key id 'k1'\\) is not valid base64url",
        bad_id: "key entry 1 has an invalid key id",
    }
    for entry, message in cases.items():
        with pytest.raises(VaultError, match=message) as info:
            KeyRing.from_strings([entry])
        # Neither the message nor a chained decoding error repeats the key.
        assert bare_key not in "".join(traceback.format_exception(info.value))
        assert info.value.__cause__ is None
        assert info.value.__context__ is None or info.value.__suppress_context__


# --- encrypt / decrypt -------------------------------------------------------------------------------------


def test_round_trip_and_blob_layout(old_key: str) -> None:
    vault = Vault(KeyRing.from_strings([old_key]))
    key_id, blob = vault.encrypt(b"refresh-token-value", aad=AAD)
    assert key_id == "k-old"
    assert len(blob) == 12 + len(b"refresh-token-value") + 16
    assert b"refresh-token-value" not in blob
    assert vault.decrypt(key_id, blob, aad=AAD) == b"refresh-token-value"
    # The layout is nonce || ciphertext+tag under plain AES-256-GCM: an independent implementation reads it.
    assert AESGCM(raw_key(old_key)).decrypt(blob[:12], blob[12:], AAD) == b"refresh-token-value"


def test_each_encryption_uses_a_fresh_nonce(old_key: str) -> None:
    vault = Vault(KeyRing.from_strings([old_key]))
    blobs = {vault.encrypt(b"same", aad=AAD)[1] for _ in range(50)}
    assert len(blobs) == 50
    assert len({blob[:12] for blob in blobs}) == 50


def test_ciphertext_moved_to_another_grant_row_does_not_decrypt(old_key: str) -> None:
    vault = Vault(KeyRing.from_strings([old_key]))
    key_id, blob = vault.encrypt(b"token", aad=grant_aad("iss", "alice", "github", "1"))
    for other in [
        grant_aad("iss", "bob", "github", "1"),
        grant_aad("iss", "alice", "gitlab", "1"),
        grant_aad("iss", "alice", "github", "2"),
        grant_aad("other-iss", "alice", "github", "1"),
        flow_aad("1"),
        b"",
    ]:
        with pytest.raises(VaultError, match=r"^ciphertext does not decrypt under key k-old$"):
            vault.decrypt(key_id, blob, aad=other)
    assert vault.decrypt(key_id, blob, aad=grant_aad("iss", "alice", "github", "1")) == b"token"


def test_tampered_ciphertext_fails(old_key: str) -> None:
    vault = Vault(KeyRing.from_strings([old_key]))
    key_id, blob = vault.encrypt(b"some token bytes", aad=AAD)
    for position in [0, 11, 12, len(blob) // 2, len(blob) - 17, len(blob) - 1]:  # nonce, body, tag
        tampered = bytearray(blob)
        tampered[position] ^= 0x01
        with pytest.raises(VaultError, match="does not decrypt under key k-old"):
            vault.decrypt(key_id, bytes(tampered), aad=AAD)
    for truncated in [blob[:-1], blob[:27], b""]:
        with pytest.raises(VaultError, match="does not decrypt under key k-old"):
            vault.decrypt(key_id, truncated, aad=AAD)
    with pytest.raises(VaultError):
        vault.decrypt(key_id, blob + b"\x00", aad=AAD)


def test_unknown_key_id_fails_with_a_clear_error(old_key: str, new_key: str) -> None:
    key_id, blob = Vault(KeyRing.from_strings([old_key])).encrypt(b"token", aad=AAD)
    only_new = Vault(KeyRing.from_strings([new_key]))
    with pytest.raises(VaultError) as info:
        only_new.decrypt(key_id, blob, aad=AAD)
    assert str(info.value).startswith("unknown key id 'k-old': it is not in the key ring (key ids: k-new)")
    assert info.value.code == "vault_error"


def test_a_different_key_under_the_same_id_does_not_decrypt() -> None:
    key_id, blob = Vault(KeyRing.from_strings([generate_key("k1")])).encrypt(b"token", aad=AAD)
    with pytest.raises(VaultError, match=r"^ciphertext does not decrypt under key k1$"):
        Vault(KeyRing.from_strings([generate_key("k1")])).decrypt(key_id, blob, aad=AAD)


def test_rotation_old_data_still_decrypts_new_data_uses_new_primary(old_key: str, new_key: str) -> None:
    before = Vault(KeyRing.from_strings([old_key]))
    old_id, old_blob = before.encrypt(b"old token", aad=AAD)
    assert old_id == "k-old"

    after = Vault(KeyRing.from_strings([new_key, old_key]))
    assert after.decrypt(old_id, old_blob, aad=AAD) == b"old token"
    assert after.needs_rotation(old_id) is True

    new_id, new_blob = after.encrypt(b"new token", aad=AAD)
    assert new_id == "k-new"
    assert after.needs_rotation(new_id) is False
    # The new blob really is under the new key: a ring without it cannot read it.
    with pytest.raises(VaultError, match="unknown key id 'k-new'"):
        before.decrypt(new_id, new_blob, aad=AAD)

    rotated_id, rotated_blob = after.reencrypt(old_id, old_blob, aad=AAD)
    assert rotated_id == "k-new"
    assert Vault(KeyRing.from_strings([new_key])).decrypt(rotated_id, rotated_blob, aad=AAD) == b"old token"


def test_json_round_trip_and_binding(old_key: str) -> None:
    vault = Vault(KeyRing.from_strings([old_key]))
    payload = {"access_token": "gho_x", "refresh_token": None, "expires_in": 3600, "scope": ["a", "ü"]}
    key_id, blob = vault.encrypt_json(payload, aad=AAD)
    assert vault.decrypt_json(key_id, blob, aad=AAD) == payload
    with pytest.raises(VaultError):
        vault.decrypt_json(key_id, blob, aad=grant_aad("x", "y", "z", "w"))


def test_decrypt_json_of_non_json_is_a_vault_error(old_key: str) -> None:
    vault = Vault(KeyRing.from_strings([old_key]))
    key_id, blob = vault.encrypt(b"\xff not json", aad=AAD)
    with pytest.raises(VaultError, match="not JSON"):
        vault.decrypt_json(key_id, blob, aad=AAD)


# --- associated data ---------------------------------------------------------------------------------------


def test_grant_aad_is_unambiguous() -> None:
    variants = [
        grant_aad("a", "b|c", "d", "e"),
        grant_aad("a|b", "c", "d", "e"),
        grant_aad("a", "b", "c|d", "e"),
        grant_aad("a", "b\x00c", "d", "e"),
        grant_aad("a\x00b", "c", "d", "e"),
        grant_aad('a","b', "c", "d", "e"),
        grant_aad("a", '","b', "c", "d"),
    ]
    assert len(set(variants)) == len(variants)
    assert grant_aad("a", "b", "c", "d") == grant_aad("a", "b", "c", "d")


def test_flow_and_grant_aad_are_separate_domains() -> None:
    assert flow_aad("f1") != flow_aad("f2")
    assert flow_aad("f1") == flow_aad("f1")
    assert flow_aad("x") not in {grant_aad("x", "", "", ""), grant_aad("", "", "", "x")}


# --- sign / verify -----------------------------------------------------------------------------------------


def test_sign_format_and_verify(old_key: str) -> None:
    vault = Vault(KeyRing.from_strings([old_key]))
    signature = vault.sign("state", b"payload")
    assert re.fullmatch(r"k-old\.[A-Za-z0-9_-]{43}", signature)
    assert vault.verify("state", b"payload", signature)
    assert not vault.verify("state", b"payload!", signature)


def test_sign_uses_an_hkdf_subkey_not_the_raw_key(old_key: str) -> None:
    vault = Vault(KeyRing.from_strings([old_key]))
    subkey = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"connector/cookie").derive(raw_key(old_key))
    mac = hmac.new(subkey, b"data", hashlib.sha256).digest()
    expected = "k-old." + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
    assert vault.sign("cookie", b"data") == expected
    raw_mac = hmac.new(raw_key(old_key), b"data", hashlib.sha256).digest()
    assert base64.urlsafe_b64encode(raw_mac).rstrip(b"=").decode() not in expected


def test_purposes_are_separated(old_key: str) -> None:
    vault = Vault(KeyRing.from_strings([old_key]))
    signature = vault.sign("browser-binding", b"data")
    assert vault.sign("state", b"data") != signature
    assert not vault.verify("state", b"data", signature)
    assert not vault.verify("browser-bindin", b"data", signature)
    assert vault.verify("browser-binding", b"data", signature)
    with pytest.raises(ValueError):
        vault.sign("", b"data")
    assert not vault.verify("", b"data", signature)


def test_signatures_survive_rotation(old_key: str, new_key: str) -> None:
    before = Vault(KeyRing.from_strings([old_key]))
    old_signature = before.sign("state", b"data")

    after = Vault(KeyRing.from_strings([new_key, old_key]))
    assert after.verify("state", b"data", old_signature)
    new_signature = after.sign("state", b"data")
    assert new_signature.startswith("k-new.")
    assert after.verify("state", b"data", new_signature)
    # Without the signing key, verification fails instead of raising.
    assert not before.verify("state", b"data", new_signature)
    assert not Vault(KeyRing.from_strings([new_key])).verify("state", b"data", old_signature)


def test_verify_rejects_malformed_and_forged_signatures(old_key: str) -> None:
    vault = Vault(KeyRing.from_strings([old_key]))
    good = vault.sign("state", b"data")
    mac = good.partition(".")[2]
    flipped = mac[:-1] + ("A" if mac[-1] != "A" else "B")
    forged = [
        "",
        ".",
        "k-old",
        "k-old.",
        mac,
        f"k-other.{mac}",
        f"k-old.{flipped}",
        f"k-old.{mac}=",
        f"k-old.{mac}x",
        f"k-old.{mac[:-1]}é",
        f"k-old.{mac[:-1]}\udc80",
        good.upper(),
    ]
    for signature in forged:
        assert vault.verify("state", b"data", signature) is False, signature


# --- key files ---------------------------------------------------------------------------------------------


def test_from_file_reads_entries_in_order_and_skips_comments(tmp_path: Path, old_key: str, new_key: str) -> None:
    path = write_key_file(tmp_path / "keys", f"# newest first\n\n  {new_key}  \n{old_key}  # retired 2026-01\n# end\n")
    ring = KeyRing.from_file(path)
    assert ring.key_ids == ("k-new", "k-old")
    assert ring.primary_key_id == "k-new"
    assert KeyRing.from_file(path, primary_key_id="k-old").primary_key_id == "k-old"


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o660, 0o601])
def test_from_file_refuses_group_or_world_access(tmp_path: Path, old_key: str, mode: int) -> None:
    path = write_key_file(tmp_path / "keys", f"{old_key}\n", mode)
    with pytest.raises(VaultError) as info:
        KeyRing.from_file(path)
    message = str(info.value)
    assert str(path) in message
    assert f"{mode:04o}" in message and "chmod 600" in message
    assert_no_secret(message, old_key)


@pytest.mark.parametrize("mode", [0o600, 0o400])
def test_from_file_accepts_owner_only_modes(tmp_path: Path, old_key: str, mode: int) -> None:
    path = write_key_file(tmp_path / "keys", f"{old_key}\n", mode)
    assert KeyRing.from_file(path).key_ids == ("k-old",)


def test_from_file_missing_empty_or_malformed(tmp_path: Path, old_key: str) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(VaultError, match=f"key file {re.escape(str(missing))} does not exist"):
        KeyRing.from_file(missing)
    empty = write_key_file(tmp_path / "empty", "# nothing\n\n")
    with pytest.raises(VaultError, match="holds no keys"):
        KeyRing.from_file(empty)
    bare = old_key.partition(":")[2]
    broken = write_key_file(tmp_path / "broken", f"# header\n{old_key}\n{bare}\n")
    with pytest.raises(VaultError, match=f"key file {re.escape(str(broken))} line 3 is not in the form") as info:
        KeyRing.from_file(broken)
    assert_no_secret(str(info.value), old_key)
    with pytest.raises(VaultError, match="is not a regular file"):
        KeyRing.from_file(tmp_path)


def test_from_file_checks_the_target_of_a_symlink(tmp_path: Path, old_key: str) -> None:
    target = write_key_file(tmp_path / "real", f"{old_key}\n")
    link = tmp_path / "link"
    link.symlink_to(target)
    assert KeyRing.from_file(link).key_ids == ("k-old",)
    target.chmod(0o644)
    with pytest.raises(VaultError, match=f"key file {re.escape(str(link))} is accessible by group or others"):
        KeyRing.from_file(link)


def test_ensure_dev_key_file_creates_0600_file_with_one_key(tmp_path: Path) -> None:
    path = tmp_path / "var" / "nested" / "dev-keys"
    assert ensure_dev_key_file(path) is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    ring = KeyRing.from_file(path)
    assert len(ring.key_ids) == 1
    assert re.fullmatch(r"k-\d{8}-[0-9a-f]{4}", ring.primary_key_id)

    content = path.read_text()
    assert ensure_dev_key_file(path) is False
    assert path.read_text() == content  # an existing file is never overwritten


def test_ensure_dev_key_file_logs_no_key_material(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "dev-keys"
    with caplog.at_level(logging.DEBUG):
        ensure_dev_key_file(path)
    entry = next(line for line in path.read_text().splitlines() if line and not line.startswith("#"))
    assert str(path) in caplog.text
    assert entry.partition(":")[0] in caplog.text
    assert_no_secret(caplog.text, entry)


# --- load_key_ring -----------------------------------------------------------------------------------------


def test_load_key_ring_nothing_configured_is_none() -> None:
    assert load_key_ring([], None, None) is None


def test_load_key_ring_primary_without_keys_is_an_error() -> None:
    with pytest.raises(VaultError, match="primary_key_id is 'k1' but no vault keys are configured"):
        load_key_ring([], None, "k1")


def test_load_key_ring_merges_inline_keys_then_file(tmp_path: Path, old_key: str, new_key: str) -> None:
    path = write_key_file(tmp_path / "keys", f"{old_key}\n")
    ring = load_key_ring([SecretStr(new_key)], path, None)
    assert ring is not None
    assert ring.key_ids == ("k-new", "k-old")
    assert ring.primary_key_id == "k-new"

    ring = load_key_ring([new_key], path, "k-old")
    assert ring is not None and ring.primary_key_id == "k-old"

    only_file = load_key_ring([], path, None)
    assert only_file is not None and only_file.key_ids == ("k-old",)


def test_load_key_ring_names_the_bad_inline_entry() -> None:
    with pytest.raises(VaultError, match=r"vault\.keys entry 2 is not in the form"):
        load_key_ring([generate_key(), SecretStr("garbage")], None, None)


def test_load_key_ring_refuses_a_readable_file(tmp_path: Path, old_key: str) -> None:
    path = write_key_file(tmp_path / "keys", f"{old_key}\n", 0o644)
    with pytest.raises(VaultError, match=re.escape(str(path))):
        load_key_ring([], path, None)


# --- no key material in reprs, messages or logs ------------------------------------------------------------


def test_reprs_show_key_ids_only(old_key: str, new_key: str) -> None:
    ring = KeyRing.from_strings([new_key, old_key])
    vault = Vault(ring)
    vault.encrypt(b"x", aad=AAD)  # populate internal caches
    vault.sign("state", b"x")
    assert repr(ring) == "KeyRing(primary_key_id='k-new', key_ids=('k-new', 'k-old'))"
    assert repr(vault) == "Vault(primary_key_id='k-new', key_ids=('k-new', 'k-old'))"
    for text in [repr(ring), str(ring), repr(vault), str(vault), f"{ring!r} {vault}"]:
        assert_no_secret(text, old_key, new_key)


def test_internal_key_holder_hides_its_bytes(old_key: str) -> None:
    # Defence in depth for tracebacks with locals and debuggers: the object holding key bytes shows none.
    material = KeyRing.from_strings([old_key])._material("k-old")
    assert repr(material) == str(material) == "<key material>"


def test_key_material_cannot_be_pickled(old_key: str) -> None:
    ring = KeyRing.from_strings([old_key])
    with pytest.raises(TypeError):
        pickle.dumps(ring)
    with pytest.raises(TypeError):
        pickle.dumps(Vault(ring))


def test_errors_and_logs_carry_no_key_material(old_key: str, caplog: pytest.LogCaptureFixture) -> None:
    vault = Vault(KeyRing.from_strings([old_key]))
    messages: list[str] = []
    attempts: list[Callable[[], object]]
    with caplog.at_level(logging.DEBUG):
        key_id, blob = vault.encrypt(b"token", aad=AAD)
        attempts = [
            lambda: vault.decrypt(key_id, blob, aad=b"other"),
            lambda: vault.decrypt("k-x", blob, aad=AAD),
            lambda: vault.decrypt(key_id, blob[:5], aad=AAD),
            lambda: KeyRing.from_strings([old_key], primary_key_id="nope"),
            lambda: KeyRing.from_strings([old_key, "k-old:" + generate_key().partition(":")[2]]),
        ]
        for attempt in attempts:
            with pytest.raises(VaultError) as info:
                attempt()
            messages.append(str(info.value))
            messages.append(repr(info.value))
    for text in [*messages, caplog.text]:
        assert_no_secret(text, old_key)
        assert "token" not in text
