"""Real parts on loopback for the suite: a throwaway Redis, tinyproxy upstreams each leaving
from its own 127.0.0.x address, and a target site that tells those addresses apart."""

import os
import random
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

START_TIMEOUT = 10.0


def _wait_port(port, process, what):
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{what} did not listen on {port} within {START_TIMEOUT} s")


def _start(argv_for_port, what, cwd, ports=(20000, 32000)):
    """Starts a server on a random port below the ephemeral range; another on a port taken."""
    for _ in range(20):
        port = random.randint(*ports)
        process = subprocess.Popen(
            argv_for_port(port), cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        if _wait_port(port, process, what):
            return port, process
    raise RuntimeError(f"no free port for {what}")


def _stop(process):
    process.terminate()
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture(scope="session")
def workdir():
    path = tempfile.mkdtemp(prefix="proxypool-py-")
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_url(workdir):
    port, process = _start(
        lambda p: ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--save", "",
                   "--appendonly", "no"],
        "redis-server",
        workdir,
    )
    yield f"redis://127.0.0.1:{port}"
    _stop(process)


@pytest.fixture(scope="session")
def redis_cluster_url(workdir):
    """A three-master Redis Cluster (no replicas), as `redis+cluster://` of two of its nodes
    (the client finds the third)."""
    nodes = []
    try:
        for _ in range(3):
            # A node's cluster bus listens on its port + 10000: both stay below 32768.
            nodes.append(_start(
                lambda p: ["redis-server", "--port", str(p), "--bind", "127.0.0.1", "--save", "",
                           "--appendonly", "no", "--cluster-enabled", "yes",
                           "--cluster-config-file", f"nodes-{p}.conf"],
                "redis-server (cluster)",
                workdir,
                ports=(20000, 22000),
            ))
        subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p, _ in nodes),
             "--cluster-replicas", "0", "--cluster-yes"],
            check=True, stdout=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + START_TIMEOUT
        for port, _ in nodes:
            while "cluster_state:ok" not in subprocess.run(
                ["redis-cli", "-p", str(port), "cluster", "info"], capture_output=True, text=True
            ).stdout:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the cluster node on {port} never reported cluster_state:ok")
                time.sleep(0.05)
        yield "redis+cluster://" + ",".join(f"127.0.0.1:{p}" for p, _ in nodes[:2]), [
            p for p, _ in nodes
        ]
    finally:
        for _, process in nodes:
            _stop(process)


@pytest.fixture
def pool_name():
    """A pool name of its own for each test: tests sharing the server never share a pool."""
    return f"t-{uuid.uuid4().hex[:12]}"


class Upstream:
    """One tinyproxy, leaving from `bind`; `stop()` takes it away (connections refused)."""

    def __init__(self, workdir, bind):
        self.bind = bind
        self._workdir = workdir
        self.port = None
        self._process = None
        self.start()

    def start(self):
        def argv(port):
            conf = os.path.join(self._workdir, f"tinyproxy-{port}.conf")
            with open(conf, "w") as f:
                f.write(
                    f"Port {port}\nListen 127.0.0.1\nBind {self.bind}\nAllow 127.0.0.1\n"
                    "Timeout 30\nLogLevel Error\nMaxClients 512\n"
                )
            return ["tinyproxy", "-d", "-c", conf]

        self.port, self._process = _start(argv, f"tinyproxy {self.bind}", self._workdir)

    @property
    def url(self):
        return f"http://127.0.0.1:{self.port}"

    def stop(self):
        _stop(self._process)


@pytest.fixture(scope="session")
def upstreams(workdir):
    ups = [Upstream(workdir, f"127.0.0.{i}") for i in (2, 3, 4)]
    yield ups
    for u in ups:
        u.stop()


class Site:
    """The target: answers each source address as told (`ok` echoes the address, `403`,
    `429`, `captcha`, `slow`)."""

    def __init__(self):
        self.behaviour = {}
        site = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                source = self.client_address[0]
                mode = site.behaviour.get(source, "ok")
                if mode == "slow":
                    time.sleep(1.0)
                status, body, headers = {
                    "403": (403, "forbidden", {}),
                    "429": (429, "slow down", {"Retry-After": "7"}),
                    "captcha": (200, '<div class="g-recaptcha"></div>', {}),
                }.get(mode, (200, source, {}))
                data = body.encode()
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/"
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def close(self):
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def site():
    s = Site()
    yield s
    s.close()
