"""config.js and the publisher's settings: pure code, no I/O but reading the file.

    settings.py  the frozen dataclasses of config.js and the one function that parses it
    checks.py    the checks of the publisher's own keys: validators and each section's key table
    security.py  the security keys: `auth`, `tls`, `allowedOrigins`, `clientLimits`
    scopes.py    what an identity may do (`listen:vm`, `read:vm`, ...)
    reload.py    what a new config.js may change in a running publisher (SIGHUP)
    logs.py      structlog set-up for the command line

`publisher.config` re-exports what was importable from it before it became a package.
"""

from publisher.config.settings import Config, load_config, parse_config

__all__ = ["Config", "load_config", "parse_config"]
