"""Helpers of the internal-auth tests: self-signed TLS certificates (openssl CLI) and raw gRPC calls
that bypass every generated stub, so nothing client-side adds or checks anything."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc


def self_signed(directory: Path, name: str) -> tuple[Path, Path]:
    """``(cert, key)``: a fresh self-signed P-256 certificate for 127.0.0.1 and localhost (its own CA)."""
    openssl = shutil.which("openssl")
    assert openssl, "these tests make their TLS certificates with the openssl CLI, which is not installed"
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    subprocess.run([openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
                    "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"], check=True, capture_output=True)
    return cert, key


def methods_of(file_descriptor, service: str):
    """``[(path, server_streaming)]`` of every method of ``service``."""
    return [(f"/{file_descriptor.package}.{service}/{m.name}", m.server_streaming)
            for m in file_descriptor.services_by_name[service].methods]


def raw_call(channel: grpc.Channel, path: str, server_streaming: bool, payload: bytes = b"",
             metadata=(), timeout: float = 5.0):
    """Calls ``path`` with raw request bytes; returns the raw reply (list of replies if streaming)."""
    if server_streaming:
        call = channel.unary_stream(path)
        return list(call(payload, metadata=metadata, timeout=timeout))
    return channel.unary_unary(path)(payload, metadata=metadata, timeout=timeout)


def status_of(fn) -> tuple[grpc.StatusCode, str]:
    """The status an RPC ended with (``OK`` and "" when it succeeded)."""
    try:
        fn()
    except grpc.RpcError as exc:
        return exc.code(), exc.details() or ""
    return grpc.StatusCode.OK, ""


# ---- mutual TLS: a CA and the certificates it signs (openssl CLI) --------------------------------
def _openssl(*args: str) -> None:
    openssl = shutil.which("openssl")
    assert openssl, "these tests make their TLS certificates with the openssl CLI, which is not installed"
    subprocess.run([openssl, *args], check=True, capture_output=True)


def make_ca(directory: Path, name: str) -> tuple[Path, Path]:
    """``(cert, key)`` of a fresh P-256 certificate authority named ``name`` (signs with ``issue``)."""
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
             "-out", str(cert), "-days", "1", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    return cert, key


def issue(directory: Path, ca: tuple[Path, Path], name: str, dns: tuple[str, ...] = (),
          server: bool = False) -> tuple[Path, Path]:
    """``(cert, key)``: a P-256 leaf certificate with CN ``name`` signed by ``ca`` (from ``make_ca``).
    A client certificate (extendedKeyUsage clientAuth) by default, with DNS subject alternative
    names ``dns``; ``server=True``: a server certificate for 127.0.0.1 and localhost."""
    cert, key, csr, ext = (directory / f"{name}.pem", directory / f"{name}.key", directory / f"{name}.csr",
                           directory / f"{name}.ext")
    names = ["IP:127.0.0.1", "DNS:localhost"] if server else []
    names += [f"DNS:{d}" for d in dns]
    ext.write_text("basicConstraints=CA:FALSE\n"
                   f"extendedKeyUsage={'serverAuth' if server else 'clientAuth'}\n"
                   + (f"subjectAltName={','.join(names)}\n" if names else ""))
    _openssl("req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", str(key),
             "-out", str(csr), "-subj", f"/CN={name}")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1]), "-set_serial",
             str(int.from_bytes(__import__("os").urandom(8), "big")), "-days", "1", "-out", str(cert),
             "-extfile", str(ext))
    return cert, key
