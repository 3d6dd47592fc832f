"""The publisher's TLS: one server `ssl.SSLContext` for the life of the process.

`server_context(tls)` builds it; `load(context, tls)` loads the certificate chain (and the
client CA) into it, at start and again on reload: new connections get the new certificate,
established ones keep theirs. A client CA added on reload is trusted from then on; one removed
stays trusted until a restart (OpenSSL cannot forget a CA).
"""

from __future__ import annotations

import ssl

from changefeed.errors import ConfigError
from publisher.config.security import Tls


def server_context(tls: Tls) -> ssl.SSLContext:
    """A TLS 1.2+ server context with `tls`'s certificate (ConfigError naming the key)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if tls.client_ca_file is not None:
        context.verify_mode = (
            ssl.CERT_REQUIRED if tls.require_client_cert else ssl.CERT_OPTIONAL
        )
    load(context, tls)
    return context


def load(context: ssl.SSLContext, tls: Tls) -> None:
    """(Re)load the certificate chain and the client CA of `tls` into `context`."""
    for key, path in (("tls.certFile", tls.cert_file), ("tls.keyFile", tls.key_file)):
        if not path.is_file():
            raise ConfigError(key, str(path), "a readable PEM file")
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(
            "tls.certFile", str(tls.cert_file),
            f"a PEM certificate chain matching tls.keyFile, an unencrypted PEM key ({_why(exc)})",
        ) from None
    if tls.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=tls.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                "tls.clientCaFile", str(tls.client_ca_file), f"a PEM CA bundle ({_why(exc)})"
            ) from None


def _why(exc: OSError | ssl.SSLError) -> str:
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return exc.strerror or str(exc)


__all__ = ["load", "server_context"]
