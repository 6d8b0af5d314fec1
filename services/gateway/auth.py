"""Bearer API-key check of the /v1 routes.

Keys are compared in constant time (``hmac.compare_digest`` on UTF-8 bytes, against every
configured key, without stopping at the first match), so response timing does not reveal how
much of a guessed key is right or which key matched. Keys are held as ``SecretStr`` (masked in
any repr of the config) and never appear in a log line or an error body.
"""

from __future__ import annotations

import hmac

from fastapi import Request
from pydantic import SecretStr

from services.gateway.errors import invalid_api_key


def key_matches(token: str, keys: list[SecretStr]) -> bool:
    """Whether ``token`` equals one of ``keys``; time independent of where they differ."""
    candidate = token.encode("utf-8", "surrogateescape")
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(candidate, key.get_secret_value().encode("utf-8", "surrogateescape"))
    return matched


def require_api_key(request: Request) -> None:
    """FastAPI dependency: 401 unless the Authorization header carries an accepted Bearer key
    (no check when no key is configured)."""
    keys = request.app.state.config.api_keys
    if not keys:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if not (scheme.lower() == "bearer" and key_matches(token.strip(), keys)):
        raise invalid_api_key()
