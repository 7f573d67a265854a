"""Certificates for the TLS tests, from the `openssl` command line (conftest's `pki` fixture makes them
fresh for a module): a CA, a server certificate for 127.0.0.1 and localhost, a client certificate from that
CA, and a CA and client certificate that no server has heard of."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

import grpc


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _new_key(cwd: Path, name: str, *request: str) -> None:
    """`name`.key, a new P-256 key, and with it the certificate request `request` says (`openssl req`)."""
    keyed = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key"]
    _openssl("req", *keyed, "-subj", f"/CN={name}", *request, cwd=cwd)


def _new_ca(cwd: Path, name: str) -> None:
    """A self-signed CA certificate and its key."""
    ca = ["-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign"]
    _new_key(cwd, name, "-x509", "-out", f"{name}.crt", "-days", "2", *ca)


def _new_cert(cwd: Path, name: str, ca: str, extensions: str) -> None:
    """A key and a certificate signed by `ca`, with `extensions` (an openssl extension-file body)."""
    _new_key(cwd, name, "-out", f"{name}.csr")
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl(
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        f"{ca}.crt",
        "-CAkey",
        f"{ca}.key",
        "-CAcreateserial",
        "-out",
        f"{name}.crt",
        "-days",
        "2",
        "-extfile",
        f"{name}.ext",
        cwd=cwd,
    )


@dataclass(frozen=True)
class Pki:
    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    def read(self, name: str) -> bytes:
        return (self.dir / name).read_bytes()

    def credentials(self, trust: str = "ca", client: str | None = None) -> grpc.ChannelCredentials:
        """Channel credentials trusting CA `trust`, presenting certificate `client` when given."""
        key, cert = (self.read(f"{client}.key"), self.read(f"{client}.crt")) if client else (None, None)
        return grpc.ssl_channel_credentials(self.read(f"{trust}.crt"), key, cert)


def make_pki(d: Path) -> Pki:
    """The certificates, made in `d`."""
    _new_ca(d, "ca")
    _new_ca(d, "other-ca")
    _new_cert(d, "server", "ca", "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n")
    _new_cert(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
    _new_cert(d, "stranger", "other-ca", "extendedKeyUsage=clientAuth\n")
    return Pki(d)
