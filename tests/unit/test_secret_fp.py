"""Secret fingerprints (key rotation detection) and release ids that never reuse an existing one."""

from __future__ import annotations

from datetime import UTC, datetime

from opsctl.deploy import release, secret_fp


def test_fingerprint_matches_only_the_same_secrets():
    fp = secret_fp.fingerprint({"api_key": "s3cret-value"})
    assert "s3cret-value" not in fp and fp.startswith("v1:")
    assert secret_fp.matches(fp, {"api_key": "s3cret-value"}) is True
    assert secret_fp.matches(fp, {"api_key": "s3cret-valuf"}) is False
    assert secret_fp.matches(fp, {"api_key": "s3cret-value", "token": "x"}) is False


def test_fingerprint_is_salted():
    a, b = secret_fp.fingerprint({"api_key": "k"}), secret_fp.fingerprint({"api_key": "k"})
    assert a != b  # equal keys on two services or releases are not recognisable as equal
    assert secret_fp.fingerprint({"api_key": "k"}, salt=b"\0" * 16) == secret_fp.fingerprint(
        {"api_key": "k"}, salt=b"\0" * 16
    )


def test_unreadable_fingerprint_is_unknown():
    for stored in ("", "garbage", "v0:00:ab", "v1:zz:ab", "v1:00"):
        assert secret_fp.matches(stored, {"api_key": "k"}) is None


def test_unused_release_id_skips_existing_ids():
    now = datetime(2026, 11, 30, 1, 0, 0, tzinfo=UTC)
    first = release.new_release_id(now, "a" * 12)
    assert release.unused_release_id(now, "a" * 12, set()) == first
    second = release.unused_release_id(now, "a" * 12, {first})
    assert second == "20261130T010001Z-" + "a" * 12
    assert release.unused_release_id(now, "a" * 12, {first, second}) == "20261130T010002Z-" + "a" * 12
