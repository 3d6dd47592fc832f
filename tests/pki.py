"""Certificates made in the test, with trustme: a CA, the publisher's certificate for
127.0.0.1, and client certificates for mTLS. Real TLS, no files from the repository."""

from __future__ import annotations

import hashlib
import secrets
import ssl
from dataclasses import dataclass, field
from pathlib import Path

import trustme


@dataclass
class Pki:
    directory: Path
    ca: trustme.CA = field(default_factory=trustme.CA)
    issued: int = 0

    @property
    def ca_file(self) -> Path:
        path = self.directory / "ca.pem"
        if not path.exists():
            self.ca.cert_pem.write_to_path(str(path))
        return path

    def server_files(self, name: str = "server") -> tuple[Path, Path]:
        """(certFile, keyFile) of a new certificate for 127.0.0.1 and localhost."""
        self.issued += 1
        cert = self.ca.issue_cert("127.0.0.1", "localhost", common_name=f"{name}-{self.issued}")
        cert_file, key_file = self.directory / f"{name}.crt", self.directory / f"{name}.key"
        cert_file.write_bytes(b"".join(pem.bytes() for pem in cert.cert_chain_pems))
        cert.private_key_pem.write_to_path(str(key_file))
        return cert_file, key_file

    def client_context(self, common_name: str | None = None) -> ssl.SSLContext:
        """A client context trusting the CA; with `common_name`, presenting a certificate."""
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        if common_name is not None:
            self.ca.issue_cert(f"{common_name}.example", common_name=common_name).configure_cert(
                context
            )
        return context


def new_token() -> str:
    return secrets.token_urlsafe(32)


def sha256_hex(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()
