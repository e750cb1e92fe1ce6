"""Certificates for the TLS tests, made by ``openssl`` in a temporary directory.

Two authorities: ``ca`` signs the server's certificate (for ``127.0.0.1`` and
``localhost``) and the client's; ``other_ca`` signs a ``stranger`` client certificate
the server must refuse, and is the wrong CA for verifying the server. EC P-256 keys:
made in milliseconds. Without ``openssl`` on PATH the TLS tests fail and say how to
install it (Debian's ``openssl`` package), as the Redis tests do for ``redis-server``.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

_CA_EXTENSIONS = ["basicConstraints=critical,CA:TRUE", "keyUsage=critical,keyCertSign,cRLSign"]
_LEAF_EXTENSIONS = (
    "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
    "basicConstraints=CA:FALSE\n"
    "keyUsage=critical,digitalSignature\n"
    "extendedKeyUsage=serverAuth,clientAuth\n"
)


@dataclass(frozen=True)
class Certificates:
    """PEM files: the authorities and the server's, client's and stranger's pairs."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    stranger_cert: Path
    stranger_key: Path


def _run(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def _authority(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.crt", directory / f"{name}.key"
    ext = [arg for e in _CA_EXTENSIONS for arg in ("-addext", e)]
    _run(
        "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(cert), "-days", "2", "-subj", f"/CN=kvtier test {name}",
        *ext,
    )  # fmt: skip
    return cert, key


def _leaf(directory: Path, name: str, authority: tuple[Path, Path]) -> tuple[Path, Path]:
    cert, key, csr = (directory / f"{name}.{ext}" for ext in ("crt", "key", "csr"))
    extensions = directory / f"{name}.ext"
    extensions.write_text(_LEAF_EXTENSIONS)
    _run(
        "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
        "-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}",
    )  # fmt: skip
    _run(
        "x509", "-req", "-in", str(csr), "-CA", str(authority[0]), "-CAkey", str(authority[1]),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(extensions),
    )  # fmt: skip
    return cert, key


def make_certificates(directory: Path) -> Certificates:
    """Make every file in ``directory`` (created if needed)."""
    if shutil.which("openssl") is None:
        pytest.fail(
            "openssl not on PATH: install Debian's openssl (apt-get install -y openssl)",
            pytrace=False,
        )
    directory.mkdir(parents=True, exist_ok=True)
    ca = _authority(directory, "ca")
    other = _authority(directory, "other-ca")
    server = _leaf(directory, "server", ca)
    client = _leaf(directory, "client", ca)
    stranger = _leaf(directory, "stranger", other)
    return Certificates(ca[0], *server, *client, other[0], *stranger)
