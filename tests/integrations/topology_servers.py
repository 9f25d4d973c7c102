"""Redis deployments of a test's own, on loopback: a 3-master Cluster, a master watched by a
Sentinel, a TLS-only server. Each is started as real ``redis-server`` processes in a temporary
directory, polled until ready, and killed by PID on the way out."""

from __future__ import annotations

import datetime
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.fleet.support import free_port

READY_WITHIN = 30.0  # seconds; generous: a loaded 2-core machine starts processes slowly


def _binary(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"the topology tests need `{name}` on PATH", pytrace=False)
    return found


def _until(ready: Callable[[], bool], what: str, procs: list[subprocess.Popen[bytes]]) -> None:
    deadline = time.monotonic() + READY_WITHIN
    while not ready():
        dead = [proc.args for proc in procs if proc.poll() is not None]
        if dead or time.monotonic() > deadline:
            pytest.fail(f"{what} did not become ready (exited: {dead})", pytrace=False)
        time.sleep(0.02)


def _asks(client_factory: Callable[[], Any], check: Callable[[Any], bool]) -> Callable[[], bool]:
    """A readiness probe: a fresh sync client, one question, any error means not yet."""

    def probe() -> bool:
        import redis

        try:
            client = client_factory()
        except redis.RedisError:
            return False
        try:
            return check(client)
        except (redis.RedisError, OSError):
            return False
        finally:
            client.close()

    return probe


@contextmanager
def _servers(stack: ExitStack) -> Iterator[tuple[Path, list[subprocess.Popen[bytes]]]]:
    procs: list[subprocess.Popen[bytes]] = []
    workdir = Path(stack.enter_context(tempfile.TemporaryDirectory()))
    try:
        yield workdir, procs
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(10)


def _start(procs: list[subprocess.Popen[bytes]], *args: str) -> None:
    quiet = subprocess.DEVNULL
    procs.append(subprocess.Popen([_binary("redis-server"), *args], stdout=quiet, stderr=quiet))


_QUIET = ("--save", "", "--appendonly", "no", "--bind", "127.0.0.1")


@contextmanager
def redis_cluster() -> Iterator[str]:
    """A Redis Cluster of three masters (no replicas); the URL of one of its nodes."""
    import redis

    ports = [free_port() for _ in range(3)]
    with ExitStack() as stack, _servers(stack) as (workdir, procs):
        for port in ports:
            _start(procs, "--port", str(port), "--cluster-enabled", "yes",
                   "--cluster-port", str(free_port()),
                   "--cluster-config-file", str(workdir / f"nodes-{port}.conf"),
                   "--dir", str(workdir), *_QUIET)  # fmt: skip
        for port in ports:
            _until(_asks(lambda port=port: redis.Redis(port=port), lambda c: c.ping()),
                   f"cluster node {port}", procs)  # fmt: skip
        subprocess.run(
            [_binary("redis-cli"), "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip

        def ok(client: Any) -> bool:
            info = client.execute_command("CLUSTER INFO")  # parsed: a dict of str
            return bool(info["cluster_state"] == "ok" and int(info["cluster_known_nodes"]) == 3)

        for port in ports:  # every node knows the others and serves all slots
            _until(_asks(lambda port=port: redis.Redis(port=port), ok), "the cluster", procs)
        yield f"redis://127.0.0.1:{ports[0]}"


@contextmanager
def redis_sentinel() -> Iterator[tuple[str, int]]:
    """A master and one Sentinel monitoring it: the service name and the Sentinel's port."""
    import redis

    master, sentinel = free_port(), free_port()
    with ExitStack() as stack, _servers(stack) as (workdir, procs):
        _start(procs, "--port", str(master), "--dir", str(workdir), *_QUIET)
        _until(_asks(lambda: redis.Redis(port=master), lambda c: c.ping()), "the master", procs)
        conf = workdir / "sentinel.conf"  # Sentinel rewrites its configuration: a file of its own
        conf.write_text(
            f"port {sentinel}\nbind 127.0.0.1\ndir {workdir}\n"
            f"sentinel monitor mymaster 127.0.0.1 {master} 1\n"
        )
        _start(procs, str(conf), "--sentinel")

        def knows(client: Any) -> bool:
            found = client.execute_command("SENTINEL GET-MASTER-ADDR-BY-NAME", "mymaster")
            return bool(found) and int(found[1]) == master

        _until(_asks(lambda: redis.Redis(port=sentinel), knows), "the Sentinel", procs)
        yield "mymaster", sentinel


@contextmanager
def redis_tls() -> Iterator[str]:
    """A TLS-only redis-server with a certificate from a CA made here; a ``rediss://`` URL that
    trusts that CA."""
    import redis

    port = free_port()
    with ExitStack() as stack, _servers(stack) as (workdir, procs):
        ca, cert, key = _certificates(workdir)
        _start(procs, "--port", "0", "--tls-port", str(port), "--tls-cert-file", str(cert),
               "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
               "--tls-auth-clients", "no", "--dir", str(workdir), *_QUIET)  # fmt: skip
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={ca}"
        _until(_asks(lambda: redis.Redis.from_url(url), lambda c: c.ping()), "TLS Redis", procs)
        yield url


def _certificates(where: Path) -> tuple[Path, Path, Path]:
    """A self-signed CA, and a certificate it signed for 127.0.0.1 / localhost."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def made(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
            # Key identifiers: Python 3.13 verifies strictly (VERIFY_X509_STRICT) and refuses a
            # chain without them.
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), False
            )
        )
        if ca:
            usage = dict.fromkeys(("digital_signature", "content_commitment", "key_encipherment",
                                   "data_encipherment", "key_agreement", "crl_sign",
                                   "encipher_only", "decipher_only"), False)  # fmt: skip
            builder = builder.add_extension(
                x509.KeyUsage(key_cert_sign=True, **usage), critical=True
            )
        if not ca:
            names = [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return builder.sign(signer, hashes.SHA256())

    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_cert = made("crashoverride test CA", ca_key, "crashoverride test CA", ca_key, True)
    cert = made("127.0.0.1", key, "crashoverride test CA", ca_key, False)
    paths = where / "ca.pem", where / "server.pem", where / "server.key"
    paths[0].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths
