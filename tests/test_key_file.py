"""The encryption key file: raw or hex keys, the first seals; a bad file is one
``ConfigError`` naming ``encryption_key_file`` when the configuration is validated,
before any tier opens; a key never shows in a repr, an error or a log line."""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import pytest

from kvtier.config import OffloadingConfig
from kvtier.errors import ConfigError
from kvtier.key_file import EncryptionKey, read_key_file

A, B = bytes(range(32)), bytes(range(100, 132))


def key_file(tmp_path: Path, data: bytes | str, mode: int = 0o600, name: str = "kv.key") -> Path:
    path = tmp_path / name
    if isinstance(data, str):
        path.write_text(data)
    else:
        path.write_bytes(data)
    path.chmod(mode)
    return path


def test_a_raw_key_of_32_bytes(tmp_path: Path) -> None:
    (key,) = read_key_file(key_file(tmp_path, A))
    assert key.secret == A
    assert key.key_id == hashlib.sha256(b"kvtier/key-id/v1" + A).digest()[:8]


def test_hex_keys_one_per_line_the_first_seals(tmp_path: Path) -> None:
    text = f"# new key first\n{B.hex().upper()}\n\n  {A.hex()}  \n# retired\n"
    keys = read_key_file(key_file(tmp_path, text))
    assert [k.secret for k in keys] == [B, A]
    assert [k.key_id for k in keys] == [EncryptionKey.of(B).key_id, EncryptionKey.of(A).key_id]


def test_a_key_never_shows_in_its_repr() -> None:
    key = EncryptionKey.of(A)
    assert A.hex() not in repr(key) and repr(A) not in repr(key)
    assert repr(key) == f"EncryptionKey(key_id={key.key_id!r})"


@pytest.mark.parametrize(
    ("data", "words"),
    [
        (b"", "holds no key"),
        ("# only a comment\n\n", "holds no key"),
        (A.hex()[:40] + "\n", r"line 1 is not 64 hex digits \(40 characters\)"),
        (A.hex()[:32] + "\n", "a raw key is exactly 32, .* or 64 hex digits"),
        (A.hex() + "\n" + A.hex()[:-1] + "g\n", "line 2 is not 64 hex digits"),
        (A.hex() + "\n" + B.hex() + "\n" + A.hex() + "\n", "key 3 repeats key 1"),
        (bytes(range(200, 231)), "31 bytes of binary"),
        (A + b"\n", "33 bytes: a raw key is exactly 32, with no newline"),
        (bytes(range(200, 240)), "40 bytes of binary"),
    ],
)
def test_a_file_without_valid_keys_is_one_error_naming_the_key(
    tmp_path: Path, data: bytes | str, words: str
) -> None:
    path = key_file(tmp_path, data)
    with pytest.raises(ConfigError, match=words) as error:
        read_key_file(path)
    assert error.value.key == "encryption_key_file"
    for secret in (A, B):  # a typo'd key is described, never shown
        assert secret.hex()[:20] not in str(error.value).lower()


def test_a_missing_file_or_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"cannot read .*missing") as error:
        read_key_file(tmp_path / "missing")
    assert error.value.key == "encryption_key_file"
    with pytest.raises(ConfigError, match=r"cannot read|not a regular file"):
        read_key_file(tmp_path)


def test_a_file_others_can_read_is_used_with_one_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = key_file(tmp_path, A, mode=0o644, name="shared.key")
    with caplog.at_level(logging.WARNING, logger="kvtier.key_file"):
        assert read_key_file(path)[0].secret == A
        read_key_file(path)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "can be read by other users (mode 644); chmod 600" in line
    assert A.hex() not in caplog.text


def test_the_configuration_validates_the_file_before_anything_starts(tmp_path: Path) -> None:
    good = key_file(tmp_path, A.hex())
    disk = str(tmp_path / "d")
    base = {"cpu_bytes_to_use": 1 << 20, "disk_path": disk, "disk_bytes_to_use": 1 << 20}
    cfg = OffloadingConfig.from_dict({**base, "encryption_key_file": good})
    assert cfg.encryption_key_file == str(good)
    assert A.hex() not in repr(cfg)  # the configuration holds the path, not the key
    for bad, words in (
        (tmp_path / "missing", "cannot read"),
        (key_file(tmp_path, "zz\n", name="bad.key"), "not 64 hex digits"),
        (12, "must be a file path"),
        ("", "must be a file path"),
    ):
        with pytest.raises(ConfigError, match=words) as error:
            OffloadingConfig.from_dict({**base, "encryption_key_file": bad})
        assert error.value.key == "encryption_key_file"
    assert not (tmp_path / "d").exists()  # refused before any tier was made


def test_a_key_without_a_disk_or_remote_tier_is_refused(tmp_path: Path) -> None:
    """The CPU tier is never sealed: a key there would promise what is not done."""
    good = key_file(tmp_path, A)
    with pytest.raises(ConfigError, match="neither disk_path nor remote_url") as error:
        OffloadingConfig.from_dict({"cpu_bytes_to_use": 1 << 20, "encryption_key_file": good})
    assert error.value.key == "encryption_key_file"
    remote = {"cpu_bytes_to_use": 1, "remote_url": "redis://127.0.0.1:1/0"}
    cfg = OffloadingConfig.from_dict({**remote, "encryption_key_file": str(good)})
    assert cfg.encryption_key_file == str(good)


@pytest.mark.parametrize(
    ("tier", "prefix", "raw"),
    [
        ("KvtierDiskTier", "disk_", {"disk_path": "/tmp/x", "disk_bytes_to_use": "1MiB"}),
        ("KvtierRedisTier", "remote_", {"remote_url": "redis://127.0.0.1:1/0"}),
    ],
)
def test_each_secondary_tier_takes_the_key_file_besides_its_own_keys(
    tmp_path: Path, tier: str, prefix: str, raw: dict[str, object]
) -> None:
    good = key_file(tmp_path, A)
    cfg = OffloadingConfig.for_tier(tier, prefix, {**raw, "encryption_key_file": str(good)})
    assert cfg.encryption_key_file == str(good)
    with pytest.raises(ConfigError, match=f"unknown key of {tier}") as error:
        OffloadingConfig.for_tier(tier, prefix, {**raw, "eviction_policy": "lru"})
    assert error.value.key == "eviction_policy"
    with pytest.raises(ConfigError, match="not 64 hex digits"):
        bad = key_file(tmp_path, "x" * 64, name="bad.key")
        OffloadingConfig.for_tier(tier, prefix, {**raw, "encryption_key_file": str(bad)})


def test_os_pathlike_paths_are_accepted(tmp_path: Path) -> None:
    good = key_file(tmp_path, A)
    cfg = OffloadingConfig.from_dict(
        {"cpu_bytes_to_use": 1, "remote_url": "redis://h:1/0", "encryption_key_file": good}
    )
    assert cfg.encryption_key_file == os.fspath(good)


def test_the_vllm_spec_takes_the_key_file_in_its_extra_config(tmp_path: Path) -> None:
    from kvtier.integrations.vllm.settings import VllmSettings

    good, disk = key_file(tmp_path, A), str(tmp_path / "d")
    extra = {"cpu_bytes_to_use": 1 << 20, "disk_path": disk, "disk_bytes_to_use": 1 << 20}
    settings = VllmSettings.from_extra_config({**extra, "encryption_key_file": str(good)}, 16)
    assert settings.offloading.encryption_key_file == str(good)
    with pytest.raises(ConfigError, match="cannot read") as error:
        VllmSettings.from_extra_config({**extra, "encryption_key_file": str(tmp_path / "no")}, 16)
    assert error.value.key == "encryption_key_file"
