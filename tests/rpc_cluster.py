"""A TVM RPC tracker and servers on loopback, in subprocesses: what the tests of remote devices
(``tests/profile/test_rpc.py``, ``tests/test_tuning_rpc.py``) run against. The ``cluster``
fixture (``tests/conftest.py``) starts one per test module."""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def summary(port: int) -> dict | None:
    """The tracker's summary, or None if nothing answers on ``port`` yet."""
    try:
        with socket.create_connection((HOST, port), timeout=2) as sock:
            sock.sendall(struct.pack("<i", 0x2F271))  # RPC_TRACKER_MAGIC
            sock.recv(4)
            msg = json.dumps([6]).encode()  # TrackerCode.SUMMARY
            sock.sendall(struct.pack("<i", len(msg)) + msg)
            size = struct.unpack("<i", sock.recv(4))[0]
            data = b""
            while len(data) < size:
                data += sock.recv(size - len(data))
            return json.loads(data)[1]
    except (OSError, struct.error, ValueError):
        return None


class Cluster:
    """A tracker and named servers, each in its own process group so that a kill takes all.

    The subprocesses see a ``torch`` that fails to import, as on a board without torch: TVM then
    starts in about half the time (each of them imports TVM twice, in it and in a popen worker).
    """

    def __init__(self, logdir):
        self.logdir, self.procs = logdir, {}
        stub = logdir / "no_torch" / "torch"
        stub.mkdir(parents=True)
        (stub / "__init__.py").write_text("raise ImportError('hidden from RPC test servers')\n")
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [str(stub.parent), *filter(None, [os.environ.get("PYTHONPATH")])])}
        self.port = free_port()
        self._spawn("tracker", "rpc_tracker", "--port", self.port, "--port-end", self.port + 1)
        self._wait(lambda s: s is not None, "the tracker to listen")

    def _spawn(self, name, module, *args):
        log = open(self.logdir / f"{name}.log", "ab")
        cmd = [sys.executable, "-m", f"tvm.exec.{module}", "--host", HOST, *map(str, args)]
        self.procs[name] = subprocess.Popen(cmd, stdout=log, stderr=log, env=self.env,
                                             start_new_session=True)
        log.close()

    def _wait(self, ready, what, timeout_s=60.0):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout_s:
            if ready(summary(self.port)):
                return
            time.sleep(0.1)
        logs = {p.name: p.read_text()[-2000:] for p in self.logdir.glob("*.log")}
        raise RuntimeError(f"timed out waiting for {what}; logs: {logs}")

    def start_servers(self, *keys):
        for key in keys:
            port = free_port()
            self._spawn(key, "rpc_server", "--port", port, "--port-end", port + 1,
                        "--tracker", f"{HOST}:{self.port}", "--key", key)
        self._wait(lambda s: s and set(keys) <= {i["key"].split(":", 1)[-1]
                                                 for i in s["server_info"]},
                   f"servers {keys} to register")

    def ensure(self, key):
        """Start server ``key`` unless it runs; returns its ``rpc:`` spec."""
        if key not in self.procs or self.procs[key].poll() is not None:
            self.procs.pop(key, None)
            self.start_servers(key)
        return self.spec(key)

    def kill(self, name):
        proc = self.procs.pop(name)
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)

    def spec(self, key):
        return f"rpc:{key}@{HOST}:{self.port}"
