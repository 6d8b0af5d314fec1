"""Security of the internal gRPC ports (kvtier, decoder): a shared token and, where configured, TLS.

One object, ``InternalSecurity``, built from a service config's ``internal_*`` fields
(``InternalSecurity.of(config)``), makes both ends:

- servers: ``make_server(executor)`` installs a token check on every method when a token is set:
  a call without ``authorization: Bearer <token>`` metadata, or with another token, ends with
  UNAUTHENTICATED before its request is even deserialized. Tokens are compared with
  ``hmac.compare_digest`` on bytes, and never logged. ``add_port`` listens with TLS when a
  certificate and key are set, else in plaintext (loopback by default).
- clients: ``channel(address)`` / ``aio_channel(address)`` attach the token to every call and
  use TLS when a CA file is set (the server's certificate must name the dialed host).

Mutual TLS: a server with ``internal_tls_client_ca`` (and its own cert and key) requires every
client to present a certificate signed by that CA; the TLS handshake fails otherwise (the caller
sees UNAVAILABLE) and no method runs. Clients present ``internal_tls_client_cert`` /
``internal_tls_client_key``. With ``internal_tls_bind_decoder_id`` as well (kvtier), a call whose
request carries a ``decoder_id`` must carry one its client certificate names (subject CN or a DNS
subject alternative name): PERMISSION_DENIED otherwise, before the method runs.

Without a token and without TLS files everything is as before: plaintext, no check. Every file is
read once at construction (a service fails at start on a missing, unreadable or non-PEM file);
errors name the setting and the path, never a file's contents.
"""

from __future__ import annotations

import collections
import hmac
import logging
import os
import string
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from pydantic import SecretStr

log = logging.getLogger(__name__)

METADATA_KEY = "authorization"
SCHEME = "Bearer "
_TOKEN_CHARS = frozenset(string.ascii_letters + string.digits + "-._~+/=")
_LOOPBACK = ("127.", "localhost", "::1", "[::1]")


def check_token(token: SecretStr) -> SecretStr:
    """A token must be 16-512 characters of ``[A-Za-z0-9-._~+/=]`` (it travels as gRPC metadata).
    Checked here, when a service builds its ``InternalSecurity`` at start, not as a pydantic field
    validator: pydantic's errors repeat the input, and this error never repeats the token."""
    value = token.get_secret_value()
    if not 16 <= len(value) <= 512 or not set(value) <= _TOKEN_CHARS:
        raise ValueError(f"internal_token must be 16-512 characters of [A-Za-z0-9-._~+/=] (got {len(value)} "
                         "characters); e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'")
    return token


@dataclass(frozen=True)
class InternalSecurity:
    token: SecretStr | None = None
    tls_cert: Path | None = None  # server: PEM certificate chain
    tls_key: Path | None = None   # server: PEM private key
    tls_ca: Path | None = None    # client: PEM root(s) that sign the servers' certificates
    # mutual TLS
    tls_client_ca: Path | None = None    # server: PEM root(s) that sign the clients' certificates
    tls_client_cert: Path | None = None  # client: PEM certificate chain it presents
    tls_client_key: Path | None = None   # client: PEM private key of tls_client_cert
    bind_decoder_id: bool = False        # server: a request's decoder_id must be named by the client cert
    _expected: bytes = field(default=b"", init=False, repr=False, compare=False)
    _pem: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.token is not None:
            check_token(self.token)
            object.__setattr__(self, "_expected", (SCHEME + self.token.get_secret_value()).encode())
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("internal TLS needs both internal_tls_cert and internal_tls_key (or neither)")
        if (self.tls_client_cert is None) != (self.tls_client_key is None):
            raise ValueError("internal mutual TLS needs both internal_tls_client_cert and internal_tls_client_key "
                             "(or neither)")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("internal_tls_client_ca needs internal_tls_cert and internal_tls_key: client "
                             "certificates are only checked on a TLS port")
        if self.tls_client_cert is not None and self.tls_ca is None:
            raise ValueError("internal_tls_client_cert needs internal_tls_ca: a client certificate is only sent "
                             "over TLS, and TLS to the server needs the CA that signed its certificate")
        if self.bind_decoder_id and self.tls_client_ca is None:
            raise ValueError("internal_tls_bind_decoder_id needs internal_tls_client_ca (the decoder id is "
                             "checked against the client certificate)")
        for setting, path, marker in (("internal_tls_cert", self.tls_cert, b"CERTIFICATE-----"),
                                      ("internal_tls_key", self.tls_key, b"PRIVATE KEY-----"),
                                      ("internal_tls_ca", self.tls_ca, b"CERTIFICATE-----"),
                                      ("internal_tls_client_ca", self.tls_client_ca, b"CERTIFICATE-----"),
                                      ("internal_tls_client_cert", self.tls_client_cert, b"CERTIFICATE-----"),
                                      ("internal_tls_client_key", self.tls_client_key, b"PRIVATE KEY-----")):
            if path is not None:
                self._pem[setting] = _read_pem(setting, Path(path), marker)

    @classmethod
    def of(cls, config) -> InternalSecurity:
        """From a service config's ``internal_token`` / ``internal_tls_{cert,key,ca}`` /
        ``internal_tls_client_{ca,cert,key}`` / ``internal_tls_bind_decoder_id`` fields (a config
        without one of them leaves it unset)."""
        return cls(getattr(config, "internal_token", None), getattr(config, "internal_tls_cert", None),
                   getattr(config, "internal_tls_key", None), getattr(config, "internal_tls_ca", None),
                   getattr(config, "internal_tls_client_ca", None), getattr(config, "internal_tls_client_cert", None),
                   getattr(config, "internal_tls_client_key", None),
                   bool(getattr(config, "internal_tls_bind_decoder_id", False)))

    # ---- server side ---------------------------------------------------------------------------
    def make_server(self, executor, options=None) -> grpc.Server:
        interceptors = [TokenCheck(self._expected)] if self.token is not None else []
        if self.bind_decoder_id:
            interceptors.append(DecoderIdCheck())
        return grpc.server(executor, interceptors=interceptors, options=options)

    def add_port(self, server: grpc.Server, address: str) -> int:
        """Listens on ``address`` (TLS when a certificate is set, requiring a client certificate
        signed by the client CA when one is set); returns the port, 0 on failure."""
        if self.tls_cert is not None:
            pair = (self._pem["internal_tls_key"], self._pem["internal_tls_cert"])
            client_ca = self._pem.get("internal_tls_client_ca")
            credentials = grpc.ssl_server_credentials([pair], root_certificates=client_ca,
                                                      require_client_auth=client_ca is not None)
            return server.add_secure_port(address, credentials)
        if self.token is not None and not address.startswith(_LOOPBACK):
            log.warning("internal token set without TLS on %s: it travels in clear text "
                        "(set internal_tls_cert and internal_tls_key)", address)
        return server.add_insecure_port(address)

    # ---- client side ---------------------------------------------------------------------------
    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return ((METADATA_KEY, self._expected.decode()),) if self.token is not None else ()

    def _credentials(self):
        if self.tls_ca is None:
            return None
        return grpc.ssl_channel_credentials(root_certificates=self._pem["internal_tls_ca"],
                                            private_key=self._pem.get("internal_tls_client_key"),
                                            certificate_chain=self._pem.get("internal_tls_client_cert"))

    def channel(self, address: str, options=None) -> grpc.Channel:
        credentials = self._credentials()
        channel = (grpc.secure_channel(address, credentials, options) if credentials is not None
                   else grpc.insecure_channel(address, options))
        if self.token is None:
            return channel
        return grpc.intercept_channel(channel, _AddToken(self.metadata))

    def aio_channel(self, address: str, options=None) -> grpc.aio.Channel:
        credentials = self._credentials()
        interceptors = _aio_interceptors(self.metadata) if self.token is not None else None
        if credentials is not None:
            return grpc.aio.secure_channel(address, credentials, options, interceptors=interceptors)
        return grpc.aio.insecure_channel(address, options, interceptors=interceptors)


def _read_pem(setting: str, path: Path, marker: bytes) -> bytes:
    """The bytes of ``path``; a ValueError naming ``setting`` and the path (never the contents)
    when it is missing, unreadable or has no PEM block ending in ``marker``."""
    if not path.exists():
        raise ValueError(f"internal TLS file {path} does not exist ({setting})")
    if not path.is_file():
        raise ValueError(f"internal TLS file {path} is not a regular file ({setting})")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ValueError(f"internal TLS file {path} cannot be read ({setting}): "
                         f"{os.strerror(exc.errno) if exc.errno else type(exc).__name__}") from None
    if b"-----BEGIN " not in data or marker not in data:
        kind = "private key" if marker.startswith(b"PRIVATE") else "certificate"
        raise ValueError(f"internal TLS file {path} is not a PEM {kind} ({setting})")
    return data


# ---- the server's token check ------------------------------------------------------------------
class TokenCheck(grpc.ServerInterceptor):
    """Refuses every call whose ``authorization`` metadata is not exactly ``Bearer <token>``."""

    def __init__(self, expected: bytes):
        self._expected = expected

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:  # unknown method: gRPC answers UNIMPLEMENTED
            return None
        supplied = [value for key, value in handler_call_details.invocation_metadata or () if key == METADATA_KEY]
        if len(supplied) == 1:
            value = supplied[0]
            given = value if isinstance(value, bytes) else value.encode("utf-8", "replace")
            if hmac.compare_digest(given, self._expected):
                return handler
            detail = "the internal token does not match: every internal service needs the same internal_token"
        elif not supplied:
            detail = "no internal token: send 'authorization: Bearer <internal_token>' metadata"
        else:
            detail = "more than one authorization entry"
        log.warning("refused %s: %s", handler_call_details.method, detail)
        return _refusal(handler, detail)


def _refusal(handler: grpc.RpcMethodHandler, detail: str) -> grpc.RpcMethodHandler:
    """A handler of the same kind as ``handler`` that ends the call with UNAUTHENTICATED; the
    request is left as bytes (nothing from an unauthenticated caller is deserialized)."""

    def refuse(request_or_iterator, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, detail)

    make = {(False, False): grpc.unary_unary_rpc_method_handler, (False, True): grpc.unary_stream_rpc_method_handler,
            (True, False): grpc.stream_unary_rpc_method_handler, (True, True): grpc.stream_stream_rpc_method_handler}
    return make[(handler.request_streaming, handler.response_streaming)](
        refuse, response_serializer=handler.response_serializer)


# ---- kvtier: the decoder id a client certificate names ------------------------------------------
def peer_names(context: grpc.ServicerContext) -> set[str]:
    """The names the verified client certificate of this call gives: its subject CN and its DNS
    subject alternative names (empty without a client certificate)."""
    auth = context.auth_context() or {}
    return {value.decode("utf-8", "replace") for key in ("x509_common_name", "peer_dns")
            for value in auth.get(key, ())}


class DecoderIdCheck(grpc.ServerInterceptor):
    """Binds decoder ids to client certificates: a call whose request has a ``decoder_id`` field
    runs only if the caller's certificate names that id (CN or DNS SAN); otherwise it ends with
    PERMISSION_DENIED before the method runs. Requests without the field (Stats) pass. Installed
    after ``TokenCheck``, so an unauthenticated request is never deserialized."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming:  # kvtier has no client-streaming method
            return handler
        behavior = handler.unary_stream if handler.response_streaming else handler.unary_unary
        method = handler_call_details.method

        def checked(request, context):
            claimed = getattr(request, "decoder_id", None)
            if claimed is not None:
                names = peer_names(context)
                if claimed not in names:
                    detail = (f"decoder id {claimed!r} is not named by the client certificate "
                              f"(it names {sorted(names) or 'nothing'})")
                    log.warning("refused %s: %s", method, detail)
                    context.abort(grpc.StatusCode.PERMISSION_DENIED, detail)
            return behavior(request, context)

        make = grpc.unary_stream_rpc_method_handler if handler.response_streaming else grpc.unary_unary_rpc_method_handler
        return make(checked, request_deserializer=handler.request_deserializer,
                    response_serializer=handler.response_serializer)


# ---- the clients' token ------------------------------------------------------------------------
class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")), grpc.ClientCallDetails):
    pass


def _with_token(details, metadata):
    return _Details(details.method, details.timeout, (*(details.metadata or ()), *metadata), details.credentials,
                    details.wait_for_ready, getattr(details, "compression", None))


class _AddToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    def __init__(self, metadata):
        self._metadata = metadata

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(_with_token(details, self._metadata), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(_with_token(details, self._metadata), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(_with_token(details, self._metadata), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(_with_token(details, self._metadata), request_iterator)


def _aio_details(details, metadata):
    return grpc.aio.ClientCallDetails(details.method, details.timeout,
                                      grpc.aio.Metadata(*(details.metadata or ()), *metadata),
                                      details.credentials, details.wait_for_ready)


def _aio_interceptors(metadata) -> list:
    class UnaryUnary(grpc.aio.UnaryUnaryClientInterceptor):
        async def intercept_unary_unary(self, continuation, details, request):
            return await continuation(_aio_details(details, metadata), request)

    class UnaryStream(grpc.aio.UnaryStreamClientInterceptor):
        async def intercept_unary_stream(self, continuation, details, request):
            return await continuation(_aio_details(details, metadata), request)

    return [UnaryUnary(), UnaryStream()]
