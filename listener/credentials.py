"""The listener's clients read their credentials here: the token (argument, token file or
`CHANGEFEED_TOKEN`) and the TLS context (a given `ssl.SSLContext`, or one trusting `cafile`).

The decisions are `changefeed.credentials`'; this module only reads the file, the environment
and the CA.
"""

from __future__ import annotations

import os
import ssl as ssl_module
from pathlib import Path

from changefeed.credentials import Credentials, pick_token
from changefeed.errors import InvalidOption


def load_credentials(
    token: str | None = None,
    token_file: str | Path | None = None,
    ssl: ssl_module.SSLContext | None = None,
    cafile: str | Path | None = None,
) -> Credentials:
    """The credentials of one client. InvalidOption (never showing a token) on a conflict or
    an unreadable file."""
    if token is not None and token_file is not None:
        raise InvalidOption("token_file", str(token_file), "not to be given with token")
    if ssl is not None and cafile is not None:
        raise InvalidOption("cafile", str(cafile), "not to be given with ssl")
    text = None
    if token_file is not None:
        try:
            text = Path(token_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            why = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
            raise InvalidOption("token_file", str(token_file), f"a readable file ({why})") from None
    try:
        chosen = pick_token(token, text, os.environ)
    except ValueError as exc:
        raise InvalidOption("token", "<not shown>", str(exc)) from None
    if cafile is not None:
        try:
            ssl = ssl_module.create_default_context(cafile=str(cafile))
        except (OSError, ssl_module.SSLError) as exc:
            raise InvalidOption("cafile", str(cafile), f"a PEM CA bundle ({exc})") from None
    return Credentials(chosen, ssl)


__all__ = ["load_credentials"]
