"""``dhisparse up``: the whole local stack as separate processes on one machine.

Starts an embedded Redis (unix socket), kvtier (when ``services.kvtier`` is runnable), one
decoder and the gateway; waits until each answers its health check; prints the URL and a curl
example; on Ctrl-C / SIGTERM stops them in reverse order (the decoder drains first), stops
Redis and removes kvtier's shared-memory segment if it is left behind. ``LocalStack`` is the same
thing as a class (the serving tests start it once per session). The internal gRPC ports (kvtier,
decoder) require a random token made per start and handed to every service in its environment.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from services.decoder.spec.drafter import SPEC_METHODS
from services.metadata.redis_server import RedisServer


_EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LISTEN_PORTS_BELOW_EPHEMERAL = 8192  # how many ports under the kernel's ephemeral range free_port draws from


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now, for a service started a moment later.

    Drawn at random from just below the kernel's ephemeral range, not from it: a port the kernel
    hands out (``bind(0)``) may be handed out again as the local end of an outgoing connection
    (a gRPC channel, a Redis client) before our service binds it, which made a gateway fail to
    start with ``address already in use`` in CI. Where the range cannot be read, ``bind(0)``.
    """
    try:
        ephemeral_low = int(_EPHEMERAL_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 0
    low = max(1024, ephemeral_low - _LISTEN_PORTS_BELOW_EPHEMERAL)
    if ephemeral_low - low >= 256:
        rng = random.SystemRandom()
        for _ in range(64):
            port = rng.randrange(low, ephemeral_low)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kvtier_available() -> bool:
    return importlib.util.find_spec("services.kvtier.__main__") is not None


@dataclass
class StackOptions:
    host: str = "127.0.0.1"
    gateway_port: int = 8000
    decoder_port: int = 50051
    kvtier_port: int = 50061
    kvtier: bool | None = None  # None = run it when services.kvtier is runnable
    kvtier_pool_gib: float = 1.0
    instance: str = field(default_factory=lambda: f"up-{os.getpid()}")
    workdir: Path | None = None  # None = a fresh temporary directory, removed at stop
    api_keys: list[str] = field(default_factory=list)
    decoder_args: list[str] = field(default_factory=list)  # extra flags for the decoder
    gateway_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # extra environment for every process
    # the internal gRPC token every service checks and sends; None = a fresh random one per start
    internal_token: str | None = None
    # TLS on the internal gRPC ports: kvtier and the decoder serve with this PEM cert and key; the
    # decoder and the gateway verify against the CA (the cert must name the host, e.g. IP:127.0.0.1)
    internal_tls_cert: Path | None = None
    internal_tls_key: Path | None = None
    internal_tls_ca: Path | None = None
    # mutual TLS: kvtier and the decoder require client certificates signed by this CA; the decoder
    # (towards kvtier), the gateway (towards the decoder) and this launcher's probes present this one
    internal_tls_client_ca: Path | None = None
    internal_tls_client_cert: Path | None = None
    internal_tls_client_key: Path | None = None
    startup_timeout_s: float = 120.0


class StackError(RuntimeError):
    pass


class LocalStack:
    def __init__(self, options: StackOptions | None = None):
        self.options = options or StackOptions()
        self._own_workdir = self.options.workdir is None
        self.workdir = Path(self.options.workdir or tempfile.mkdtemp(prefix="dhisparse-up-"))
        self.redis: RedisServer | None = None
        self.processes: dict[str, subprocess.Popen] = {}
        self._args: dict[str, list[str]] = {}  # service -> its command line (for respawn)
        self.run_kvtier = kvtier_available() if self.options.kvtier is None else self.options.kvtier
        self.internal_token = self.options.internal_token or secrets.token_urlsafe(32)

    @property
    def security(self):
        """The internal token of this stack's gRPC ports: ``stack.security.channel(address)``."""
        from pydantic import SecretStr

        from services.rpc.auth import InternalSecurity

        o = self.options
        return InternalSecurity(SecretStr(self.internal_token), tls_ca=o.internal_tls_ca,
                                tls_client_cert=o.internal_tls_client_cert, tls_client_key=o.internal_tls_client_key)

    def _internal_env(self) -> dict[str, str]:
        """Each service's DHISPARSE_<SERVICE>_INTERNAL_* variables: the token, and the TLS files."""
        o = self.options
        env = {f"DHISPARSE_{s}_INTERNAL_TOKEN": self.internal_token for s in ("KVTIER", "DECODER", "GATEWAY")}
        for services, name, path in ((("KVTIER", "DECODER"), "CERT", o.internal_tls_cert),
                                     (("KVTIER", "DECODER"), "KEY", o.internal_tls_key),
                                     (("DECODER", "GATEWAY"), "CA", o.internal_tls_ca),
                                     (("KVTIER", "DECODER"), "CLIENT_CA", o.internal_tls_client_ca),
                                     (("DECODER", "GATEWAY"), "CLIENT_CERT", o.internal_tls_client_cert),
                                     (("DECODER", "GATEWAY"), "CLIENT_KEY", o.internal_tls_client_key)):
            if path is not None:
                env.update({f"DHISPARSE_{s}_INTERNAL_TLS_{name}": str(Path(path).resolve()) for s in services})
        return env

    # ---- addresses ------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"http://{self.options.host}:{self.options.gateway_port}"

    @property
    def decoder_address(self) -> str:
        return f"{self.options.host}:{self.options.decoder_port}"

    @property
    def segment_name(self) -> str:
        return f"dhisparse-kvtier-{self.options.instance}"

    # ---- lifecycle ------------------------------------------------------------------------------
    def start(self, log=print) -> LocalStack:
        o = self.options
        try:
            try:  # a bad TLS file or setting (of the launcher's own probes) fails here, at once
                security = self.security
            except ValueError as exc:
                raise StackError(str(exc)) from None
            # persistent: kvtier's page table survives a restart of Redis itself
            self.redis = RedisServer(directory=self.workdir / "redis", persist=True).start()
            log(f"redis    {self.redis.url}")
            if self.run_kvtier:
                self._spawn("kvtier", ["-m", "services.kvtier", "--host", o.host, "--port", str(o.kvtier_port),
                                       "--redis-url", self.redis.url, "--instance", o.instance,
                                       "--host-pool-gib", str(o.kvtier_pool_gib)])
                self._wait("kvtier", lambda: _tcp_open(o.host, o.kvtier_port))
                log(f"kvtier   {o.host}:{o.kvtier_port} (shm {self.segment_name})")
            else:
                log("kvtier   not started: services.kvtier is not runnable in this checkout "
                    "(the decoder serves from its own hot pool)")
            # with kvtier, sealed pages are written back to its host pool and SPARSE residency
            # (attention sparse) keeps only working sets hot
            tier = ["--kvtier-address", f"{o.host}:{o.kvtier_port}"] if self.run_kvtier else []
            self._spawn("decoder", ["-m", "services.decoder.service", "--host", o.host,
                                    "--port", str(o.decoder_port), "--advertise-address", self.decoder_address,
                                    "--decoder-id", f"decoder-{o.instance}", "--redis-url", self.redis.url,
                                    *tier, *o.decoder_args])
            from services.decoder.service.server import probe

            self._wait("decoder", lambda: probe(self.decoder_address, timeout_s=1.0, security=security))
            log(f"decoder  {self.decoder_address}")
            keys = [a for k in o.api_keys for a in ("--api-key", k)]
            self._spawn("gateway", ["-m", "services.gateway", "--host", o.host, "--port", str(o.gateway_port),
                                    "--redis-url", self.redis.url, "--log-level", "warning", *keys, *o.gateway_args])
            self._wait("gateway", self._gateway_ready)
            log(f"gateway  {self.url}")
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, name: str, args: list[str], log_mode: str = "wb") -> None:
        self._args[name] = args
        log_file = open(self.workdir / f"{name}.log", log_mode)
        env = {**os.environ, **self._internal_env(), **self.options.env}
        # Own session: Ctrl-C reaches only this launcher, which stops the services in order.
        self.processes[name] = subprocess.Popen([sys.executable, *args], stdout=log_file, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
        log_file.close()

    def respawn(self, name: str) -> subprocess.Popen:
        """Starts service ``name`` again with its first command line, after it died (fault tests);
        its log goes on in the same file. Does not wait for it to be ready."""
        if self.processes[name].poll() is None:
            raise StackError(f"{name} is still running")
        self._spawn(name, self._args[name], log_mode="ab")
        return self.processes[name]

    def _wait(self, name: str, ready) -> None:
        deadline = time.monotonic() + self.options.startup_timeout_s
        process = self.processes[name]
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise StackError(f"{name} exited with {process.returncode}:\n{self.log_tail(name)}")
            try:
                if ready():
                    return
            except Exception:  # noqa: BLE001 - not up yet
                pass
            time.sleep(0.1)
        raise StackError(f"{name} was not healthy within {self.options.startup_timeout_s} s:\n{self.log_tail(name)}")

    def _gateway_ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=1.0) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def log_tail(self, name: str, num_lines: int = 30) -> str:
        path = self.workdir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-num_lines:])

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stops gateway, decoder (drains), kvtier, Redis; removes leftovers. Safe to call twice."""
        for name in ("gateway", "decoder", "kvtier"):
            process = self.processes.pop(name, None)
            if process is None or process.poll() is not None:
                continue
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self.redis is not None:
            self.redis.stop()
            self.redis = None
        if self.run_kvtier:
            leftover = Path("/dev/shm") / self.segment_name
            if leftover.exists():
                leftover.unlink()
        if self._own_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> LocalStack:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _tcp_open(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def parse_options(argv: list[str] | None = None, prog: str = "dhisparse up") -> StackOptions:
    """``dhisparse up``'s command line -> the stack's options."""
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address every service binds to")
    parser.add_argument("--port", type=int, default=8000, help="gateway HTTP port")
    parser.add_argument("--decoder-port", type=int, default=50051)
    parser.add_argument("--kvtier-port", type=int, default=50061)
    parser.add_argument("--no-kvtier", action="store_true", help="do not start kvtier")
    parser.add_argument("--kvtier-pool-gib", type=float, default=1.0, help="kvtier host pool size")
    parser.add_argument("--api-key", action="append", default=[], help="require this Bearer key (repeatable)")
    parser.add_argument("--model", help="model for the decoder (.gguf or HF-style dir; default: the default model)")
    parser.add_argument("--workdir", type=Path, help="logs and Redis socket (default: a temporary directory)")
    parser.add_argument("--attention", choices=["dense", "sparse"], help="decoder attention (default: dense)")
    parser.add_argument("--residency", choices=["adaptive", "always-sparse", "always-full"],
                        help="decoder hot-tier policy (default: adaptive with kvtier and sparse attention)")
    parser.add_argument("--page-score", choices=["center", "quest"],
                        help="sparse page ranking (default: center, the estimated attention mass)")
    parser.add_argument("--gemm-dtype", choices=["float32", "bfloat16"],
                        help="decoder projection matmuls (default float32; bfloat16: oneDNN bf16 kernels, faster on CPU)")
    parser.add_argument("--spec", choices=SPEC_METHODS,
                        help="decoder speculative decoding drafter (default none)")
    parser.add_argument("--spec-tokens", type=int, help="draft tokens verified per step")
    parser.add_argument("--verify-budget", choices=["fixed", "adaptive"], help="draft length per request")
    parser.add_argument("--resumable-requests", action="store_true",
                        help="the decoder marks requests resumable in kvtier: a restarted or another decoder "
                             "continues a killed decoder's streams without prefilling them again")
    parser.add_argument("--internal-tls-cert", type=Path, help="PEM cert: kvtier and decoder serve gRPC over TLS")
    parser.add_argument("--internal-tls-key", type=Path, help="PEM private key of --internal-tls-cert")
    parser.add_argument("--internal-tls-ca", type=Path, help="PEM CA the decoder and gateway verify servers with")
    parser.add_argument("--internal-tls-client-ca", type=Path,
                        help="mutual TLS: PEM CA kvtier and the decoder verify client certificates with")
    parser.add_argument("--internal-tls-client-cert", type=Path,
                        help="mutual TLS: PEM client certificate the decoder and gateway present")
    parser.add_argument("--internal-tls-client-key", type=Path, help="PEM private key of --internal-tls-client-cert")
    args = parser.parse_args(argv)
    if args.resumable_requests and args.no_kvtier:
        parser.error("--resumable-requests keeps requests in kvtier: it cannot go with --no-kvtier")
    decoder_args = ["--model", args.model] if args.model else []
    if args.resumable_requests:
        decoder_args.append("--resumable-requests")
    for flag in ("attention", "residency", "page_score", "gemm_dtype", "spec", "spec_tokens", "verify_budget"):
        if getattr(args, flag):
            decoder_args += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    options = StackOptions(host=args.host, gateway_port=args.port, decoder_port=args.decoder_port,
                           kvtier_port=args.kvtier_port, kvtier=False if args.no_kvtier else None,
                           kvtier_pool_gib=args.kvtier_pool_gib, workdir=args.workdir, api_keys=args.api_key,
                           decoder_args=decoder_args, internal_tls_cert=args.internal_tls_cert,
                           internal_tls_key=args.internal_tls_key, internal_tls_ca=args.internal_tls_ca,
                           internal_tls_client_ca=args.internal_tls_client_ca,
                           internal_tls_client_cert=args.internal_tls_client_cert,
                           internal_tls_client_key=args.internal_tls_client_key)
    return options


def main(argv: list[str] | None = None, prog: str = "dhisparse up") -> int:
    options = parse_options(argv, prog)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stack = LocalStack(options)
    try:
        stack.start()
    except StackError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    auth = f" -H 'Authorization: Bearer {options.api_keys[0]}'" if options.api_keys else ""
    print(f"\ndhisparse is up: {stack.url}  (OpenAI-compatible; logs in {stack.workdir})\n"
          f"  curl {stack.url}/v1/chat/completions{auth} -H 'Content-Type: application/json' \\\n"
          f"    -d '{{\"model\": \"SmolLM2-135M-Instruct\", \"messages\": [{{\"role\": \"user\", "
          f"\"content\": \"Hello!\"}}]}}'\n"
          "Ctrl-C stops everything.", flush=True)
    try:
        while not stop.wait(1.0):
            for name, process in stack.processes.items():
                if process.poll() is not None:
                    print(f"error: {name} exited with {process.returncode}:\n{stack.log_tail(name)}", file=sys.stderr)
                    stop.set()
    finally:
        print("stopping ...", flush=True)
        stack.stop()
        print("stopped", flush=True)
    return 0
