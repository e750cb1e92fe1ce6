"""Real ``redis-server`` processes for the remote-tier tests, on free loopback ports.

Each server runs in the foreground as a child of the test (no daemonizing, so a test
that dies leaves nothing behind once ``stop`` runs in its fixture; where util-linux's
``setpriv`` is found the server also gets SIGKILL when the test process dies without
stopping it, e.g. pytest killed by a CI timeout), with no
persistence (``--save '' --appendonly no``) and its working directory in a temporary
directory. CI installs Debian's ``redis-server``; without it these tests fail and say
how to install it, unless ``KVTIER_SKIP_REDIS=1`` asks to skip them.

A server may require a password (``--requirepass``), take its users from an ACL file
(``username`` is who the helper itself logs in as), or listen on TLS only (``tls``:
``--port 0 --tls-port <port>``, its certificates from ``tests/certificates.py``,
client certificates required unless ``tls_auth_clients`` says otherwise).
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.certificates import Certificates

START_TIMEOUT_S = 10.0
PORT_TRIES = 5


def _dies_with_parent() -> list[str]:
    """A prefix that makes the server die with the test process, where the OS can.

    ``setpriv --pdeathsig`` sets the signal, then execs the server (same pid). The
    signal follows the *thread* that started the server, so servers are started from
    the test's main thread (every fixture does).
    """
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "KILL", "--"] if setpriv else []


class PortTaken(RuntimeError):
    """``redis-server`` could not bind its port: something else took it first."""


def require_redis() -> None:
    """Skip when ``KVTIER_SKIP_REDIS=1``; fail clearly when redis-server is missing."""
    if os.environ.get("KVTIER_SKIP_REDIS") == "1":
        pytest.skip("KVTIER_SKIP_REDIS=1: tests against a real redis-server are skipped")
    missing = [b for b in ("redis-server", "redis-cli") if shutil.which(b) is None]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not on PATH: install Debian's redis-server "
            "(apt-get install -y redis-server), or set KVTIER_SKIP_REDIS=1 to skip",
            pytrace=False,
        )


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_port(cluster: bool = False) -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now.

    A cluster node also listens on ``port + 10000`` (its cluster bus), so its port is
    at most 55535 and both must be free.
    """
    if not cluster:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    rng = random.Random()
    while True:
        port = rng.randrange(20000, 55536)
        if _bindable(port) and _bindable(port + 10000):
            return port


class RedisServer:
    """One ``redis-server`` child process; ``restart`` keeps its port.

    Args:
        workdir: a fresh directory for the server's files.
        args: extra ``redis-server`` arguments (``--maxmemory 1mb``, ...).
        password: the password the helper logs in with; without ``username`` the
            server is started with ``--requirepass`` it.
        username: the ACL user the helper logs in as (the server's ACL file, given in
            ``args``, defines it).
        tls: listen on TLS only, with these certificates.
        tls_auth_clients: ``--tls-auth-clients`` (``yes``: a client certificate is
            required; ``optional``; ``no``).
    """

    def __init__(
        self,
        workdir: Path,
        args: Sequence[str] = (),
        password: str | None = None,
        username: str | None = None,
        tls: Certificates | None = None,
        tls_auth_clients: str = "yes",
    ) -> None:
        self.workdir = workdir
        self.password = password
        self.username = username
        self.tls = tls
        self.args = list(args)
        if password and username is None:
            self.args += ["--requirepass", password]
        if tls is not None:
            self.args += ["--tls-cert-file", str(tls.server_cert)]
            self.args += ["--tls-key-file", str(tls.server_key)]
            self.args += ["--tls-ca-cert-file", str(tls.ca)]
            self.args += ["--tls-auth-clients", tls_auth_clients]
        self.port = free_port(cluster="--cluster-enabled" in self.args)
        self.proc: subprocess.Popen[bytes] | None = None
        self._started = False  # once started, the port is the server's: restarts keep it
        workdir.mkdir(parents=True, exist_ok=True)

    @property
    def url(self) -> str:
        """The server's URL, without credentials (``rediss://`` over TLS)."""
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def _login(self) -> dict[str, Any]:
        """redis-py arguments that log the helper in (user, password, TLS files)."""
        login: dict[str, Any] = {"username": self.username, "password": self.password}
        if self.tls is not None:
            login |= {
                "ssl": True,
                "ssl_ca_certs": str(self.tls.ca),
                "ssl_certfile": str(self.tls.client_cert),
                "ssl_keyfile": str(self.tls.client_key),
            }
        return login

    def start(self) -> RedisServer:
        """Start the server and wait until it answers (itself, not another on its port).

        The port was free when it was picked, not reserved: another process may have
        bound it since. A first start that finds it taken picks another port and starts
        again; a later start (after ``kill``, ``stop``) keeps its port, which clients know.
        """
        require_redis()
        for _ in range(PORT_TRIES - 1):
            try:
                return self._start()
            except PortTaken:
                if self._started:
                    raise
                self.port = free_port(cluster="--cluster-enabled" in self.args)
        return self._start()

    def _start(self) -> RedisServer:
        ports = (
            ["--port", "0", "--tls-port", str(self.port)]
            if self.tls
            else ["--port", str(self.port)]
        )
        cmd = [*_dies_with_parent(), "redis-server", *ports, "--bind", "127.0.0.1"]
        cmd += ["--save", "", "--appendonly", "no", "--dir", str(self.workdir), *self.args]
        log_path = self.workdir / "redis.log"
        seen = log_path.stat().st_size if log_path.exists() else 0
        with open(log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + START_TIMEOUT_S
        # No retries inside a call (redis-py's default backs off for seconds): this loop
        # polls, and a port held by a process that never answers costs one timeout.
        once = Retry(NoBackoff(), 0)
        with redis.Redis(port=self.port, socket_timeout=1.0, retry=once, **self._login()) as client:
            while True:
                try:
                    # Our process answers, not another server that holds the port.
                    if client.info("server")["process_id"] == self.proc.pid:
                        self._started = True
                        return self
                    raise redis.ConnectionError("another server answers on this port")
                except redis.RedisError as e:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        with open(log_path, "rb") as f:
                            f.seek(seen)
                            log = f.read().decode(errors="replace")
                        self.stop()
                        if "Address already in use" in log:
                            raise PortTaken(f"port {self.port} taken:\n{log[-2000:]}") from e
                        raise RuntimeError(f"redis-server did not start:\n{log[-2000:]}") from e
                    time.sleep(0.02)

    def kill(self) -> None:
        """SIGKILL the server (a crash: everything it held is lost)."""
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None

    def pause(self) -> None:
        """SIGSTOP: the server keeps its socket but answers nothing (a hung server)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        """Stop the server if it runs (resumed first if paused)."""
        if self.proc is not None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None

    def restart(self) -> None:
        """Start again on the same port, empty."""
        self.stop()
        self.start()

    def cli(self, *args: str) -> str:
        """Run ``redis-cli`` against this server; its stdout."""
        env = dict(os.environ)
        env.pop("REDISCLI_AUTH", None)
        if self.password:
            env["REDISCLI_AUTH"] = self.password
        cmd = ["redis-cli", "-p", str(self.port)]
        if self.username:
            cmd += ["--user", self.username]
        if self.tls is not None:
            cmd += ["--tls", "--cacert", str(self.tls.ca)]
            cmd += ["--cert", str(self.tls.client_cert), "--key", str(self.tls.client_key)]
        cmd += args
        out = subprocess.run(cmd, capture_output=True, check=True, env=env)
        return out.stdout.decode(errors="replace").strip()

    def client(self) -> redis.Redis:
        """A plain redis-py client (for test set-up and inspection)."""
        return redis.Redis(port=self.port, socket_timeout=5.0, **self._login())


class RedisCluster:
    """Three ``--cluster-enabled`` nodes joined with ``redis-cli --cluster create``."""

    def __init__(self, workdir: Path, nodes: int = 3) -> None:
        self.nodes = [
            RedisServer(
                workdir / f"node{i}",
                ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"],
            )
            for i in range(nodes)
        ]

    @property
    def url(self) -> str:
        return self.nodes[0].url

    def start(self) -> RedisCluster:
        """Start the nodes, assign all slots, and wait until ``cluster info`` says ok."""
        for node in self.nodes:
            node.start()
        addresses = [f"127.0.0.1:{n.port}" for n in self.nodes]
        create = ["redis-cli", "--cluster", "create", *addresses, "--cluster-replicas", "0"]
        subprocess.run([*create, "--cluster-yes"], capture_output=True, check=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not all("cluster_state:ok" in n.cli("cluster", "info") for n in self.nodes):
            if time.monotonic() > deadline:
                raise RuntimeError("the cluster did not reach cluster_state:ok")
            time.sleep(0.05)
        return self

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()
