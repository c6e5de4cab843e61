"""Timing one-op modules on a device reached through TVM's RPC tracker (a phone, a board, a server).

Start a tracker and, on the device, a server registered under a key::

    python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190
    python -m tvm.exec.rpc_server --tracker TRACKER_HOST:9190 --key KEY

then profile ``rpc:KEY@TRACKER_HOST:9190``. Kernels are compiled here for the runner's target,
uploaded as a shared library and timed on the remote with the VM's ``time_evaluator``.
"""

from __future__ import annotations

import logging
import socket
import struct
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autoplace.profile.measure import (PROBE_POLICY, DeviceUnavailable, OpFailed, Timing,
                                       TimingPolicy, error_summary, kernel_timer, op_failed,
                                       probe_module, time_adaptively)
from autoplace.profile.workload import random_inputs

if TYPE_CHECKING:
    import tvm

log = logging.getLogger(__name__)

_TIMED = "autoplace_timed"  # name of the saved closure that is timed


class RPCRunner:
    """A device served by ``tvm.exec.rpc_server`` under ``key``, found through a tracker.

    Parameters
    ----------
    key : str
        The key the server registered with the tracker (``--key``).
    host, port : str, int
        The tracker's address.
    target : str or dict, optional
        What to compile for (``"llvm"``, a target dict with ``mtriple``, ``"cuda"``, a tag...).
    timeout_s : float, optional
        How long to wait for the tracker to answer and for a free server with ``key``.

    Notes
    -----
    No connection is made until :meth:`info`, :meth:`check` or :meth:`measure`; then one session
    is kept for all measurements (and reopened once if it dropped). A remote that hangs without
    closing its socket blocks the call: TVM's RPC client has no per-call timeout.
    """

    def __init__(self, key: str, host: str, port: int, *, target: Any = "llvm",
                 timeout_s: float = 30.0):
        self.key, self.host, self.port = key, host, int(port)
        self.target, self.timeout_s = target, float(timeout_s)
        self.spec = f"rpc:{key}@{host}:{port}"
        self.name = self.spec  # what reports call the device
        self._sess = None
        self._uploads = 0

    # ------------------------------------------------------------------ device

    def tvm_target(self) -> tvm.target.Target:
        """The target kernels are compiled for (``ValueError`` if TVM rejects it)."""
        import tvm

        try:
            return tvm.target.Target(self.target)
        except Exception as e:  # noqa: BLE001 - TVM raises its own error types for bad targets
            raise ValueError(f"{self.spec}: bad target {self.target!r}: {error_summary(e)}") from None

    @property
    def kind(self) -> str:
        """``"cpu"`` for an llvm target, else the target kind (``"cuda"``, ``"opencl"``...)."""
        name = self.tvm_target().kind.name
        return "cpu" if name in ("llvm", "c") else name

    def _device(self, sess):
        return sess.cpu(0) if self.kind == "cpu" else sess.device(self.kind, 0)

    def info(self) -> dict[str, Any]:
        """What makes this device's numbers comparable; connects to the tracker.

        Raises
        ------
        DeviceUnavailable
            The tracker cannot be reached or no server with the key is free in time.
        """
        import tvm

        kind, target = self.kind, str(self.tvm_target())  # a bad target fails before connecting
        sess = self._session()
        try:
            threads = _remote_call(sess, "runtime.NumThreads")
            if kind == "cpu":
                cpu = _remote_call(sess, "tvm.codegen.llvm.GetHostCPUName")
                triple = _remote_call(sess, "tvm.codegen.llvm.GetProcessTriple")
                hardware = f"{cpu} ({triple})" if cpu else None
            else:
                dev = self._device(sess)
                hardware = dev.device_name if dev.exist else "absent"
        except Exception as e:  # noqa: BLE001 - TVM errors of a dead session
            raise DeviceUnavailable(f"{self.spec}: the RPC session failed while asking what the "
                                    f"device is: {error_summary(e)}") from None
        return {"kind": kind, "target": target,
                "hardware": hardware or f"rpc:{self.key}", "tvm": tvm.__version__,
                "threads": int(threads) if threads is not None else None,
                "host": f"{self.host}:{self.port}", "remote": self.key}

    def check(self) -> None:
        """Raise :class:`DeviceUnavailable` unless the remote runs a trivial op."""
        try:
            self.measure(probe_module(), PROBE_POLICY)
        except OpFailed as e:
            raise DeviceUnavailable(f"{self.spec} cannot run a vector add: {e}") from None

    def close(self) -> None:
        """End the session, freeing the server for other clients."""
        self._sess = None

    # ------------------------------------------------------------------ timing

    def measure(self, mod: tvm.IRModule, policy: TimingPolicy = TimingPolicy(),
                rng: np.random.Generator | None = None) -> Timing:
        """Median time of ``mod["main"]`` on the remote, with random inputs.

        Raises
        ------
        OpFailed
            The op does not build here, or fails (or kills the session twice) on the remote.
        DeviceUnavailable
            The session was lost and no new one could be had.
        """
        from autoplace.backend import build_single

        def build():
            return build_single(mod, self.tvm_target(), gpu=self.kind != "cpu")

        return self._time_remotely(mod, build, _vm_timer, policy, rng)

    def measure_kernel(self, mod: tvm.IRModule, target, policy: TimingPolicy = TimingPolicy(),
                       rng: np.random.Generator | None = None) -> Timing:
        """Median time on the remote of a kernel: ``mod["main"]`` a PrimFunc (scheduled or
        not), compiled here for ``target``; raises as :meth:`measure`."""
        import tvm

        return self._time_remotely(mod, lambda: tvm.compile(mod, target=target), kernel_timer,
                                   policy, rng)

    def _time_remotely(self, mod, build, make_timer, policy, rng) -> Timing:
        """Build with ``build()`` here, upload the library and time it on the remote with the
        timer ``make_timer(loaded module, device, args)`` makes; reconnects once if the session
        died."""
        inputs = random_inputs(mod["main"], rng or np.random.default_rng(0))
        with tempfile.TemporaryDirectory(prefix="autoplace-rpc-") as tmp:
            lib = Path(tmp) / "op.so"
            try:
                build().export_library(str(lib))
            except Exception as e:  # noqa: BLE001 - any build failure means "cannot run here"
                raise op_failed("build failed", e) from None
            for attempt in (1, 2):
                sess = self._session()
                try:
                    return self._run(sess, lib, inputs, policy, make_timer)
                except Exception as e:  # noqa: BLE001 - the op's fault or the session's?
                    if _alive(sess):
                        raise op_failed("run failed", e) from None
                    if attempt == 2:
                        raise OpFailed("run failed: the remote session died twice running this "
                                       f"op: {error_summary(e)}") from None
                    log.warning("%s: RPC session lost while running an op (%s); reconnecting",
                                self.spec, error_summary(e))
        raise AssertionError("unreachable")

    def _run(self, sess, lib: Path, inputs: list[np.ndarray], policy: TimingPolicy,
             make_timer) -> Timing:
        import tvm

        self._uploads += 1
        name = f"autoplace_op{self._uploads}.so"
        sess.upload(str(lib), target=name)
        loaded = sess.load_module(name)
        sess.remove(name)
        dev = self._device(sess)
        args = [tvm.runtime.tensor(a, dev) for a in inputs]
        return time_adaptively(make_timer(loaded, dev, args), policy)

    # ------------------------------------------------------------------ session

    def _session(self):
        """The open session, or a new one if there is none or it dropped."""
        if self._sess is None:
            self._sess = self._connect()
        elif not _alive(self._sess):
            self._sess = None
            try:
                self._sess = self._connect()
            except DeviceUnavailable as e:
                why = str(e).removeprefix(f"{self.spec}: ")
                raise DeviceUnavailable(f"{self.spec}: lost the RPC session (did the server "
                                        f"die?) and could not reconnect: {why}") from None
        return self._sess

    def _connect(self):
        """Ask the tracker for a free server with our key and open a session to it.

        TVM's own ``TrackerSession`` retries a refused connection for 60 s and waits for a free
        server forever, so the (small) tracker protocol is spoken here with a deadline.
        """
        from tvm import rpc
        from tvm.rpc import base

        where = f"RPC tracker {self.host}:{self.port}"
        deadline = time.monotonic() + self.timeout_s
        try:
            sock = socket.create_connection((self.host, self.port), timeout=self.timeout_s)
        except OSError as e:
            raise DeviceUnavailable(
                f"{self.spec}: cannot reach the {where} ({e}). Is `python -m tvm.exec.rpc_tracker "
                f"--port {self.port}` running there, and reachable from this machine?") from None
        try:
            with sock:
                sock.sendall(struct.pack("<i", base.RPC_TRACKER_MAGIC))
                if struct.unpack("<i", base.recvall(sock, 4))[0] != base.RPC_TRACKER_MAGIC:
                    raise DeviceUnavailable(f"{self.spec}: {self.host}:{self.port} is not an "
                                            "RPC tracker")
                base.sendjson(sock, [base.TrackerCode.SUMMARY])
                summary = base.recvjson(sock)[1]
                servers = [s["key"].split(":", 1)[-1] for s in summary.get("server_info", [])]
                if self.key not in servers:
                    raise DeviceUnavailable(
                        f"{self.spec}: no RPC server is registered under key {self.key!r} at the "
                        f"{where} (registered: {sorted(set(servers)) or 'none'}). Start one with "
                        f"`python -m tvm.exec.rpc_server --tracker {self.host}:{self.port} "
                        f"--key {self.key}`.")
                base.sendjson(sock, [base.TrackerCode.REQUEST, self.key, "", 1])
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                code, value = base.recvjson(sock)
        except TimeoutError:
            raise DeviceUnavailable(
                f"{self.spec}: no RPC server with key {self.key!r} became free within "
                f"{self.timeout_s:g} s at the {where}: all are busy (another client holds "
                "them?) or stuck.") from None
        except (OSError, ValueError, IndexError, KeyError) as e:
            raise DeviceUnavailable(f"{self.spec}: the {where} broke off: "
                                    f"{type(e).__name__}: {e}") from None
        if code != base.TrackerCode.SUCCESS:
            raise DeviceUnavailable(f"{self.spec}: the {where} refused the request: {value}")
        url, port, matchkey = value
        try:
            sess = rpc.connect(url, port, matchkey)
        except Exception as e:  # noqa: BLE001 - TVM raises its own error types here
            raise DeviceUnavailable(f"{self.spec}: the tracker sent server {url}:{port}, which "
                                    f"could not be reached: {error_summary(e)}") from None
        log.info("%s: session opened with %s:%s", self.spec, url, port)
        return sess


def _alive(sess) -> bool:
    """Whether ``sess`` still answers a trivial call."""
    try:
        sess.get_function("runtime.NumThreads")()
        return True
    except Exception:  # noqa: BLE001 - a dead session raises TVM errors of several kinds
        return False


def _remote_call(sess, name: str):
    """``name()`` on the remote, or None if the remote does not have it; a dead session raises."""
    try:
        f = sess.get_function(name)
    except AttributeError:
        return None
    return f()


def _vm_timer(rexec, dev, args):
    """A timer of a Relax executable's ``main`` on ``args``, saved as a closure that returns
    nothing: works for tuple outputs and sends no result back."""
    from tvm import relax

    vm = relax.VirtualMachine(rexec, dev)
    vm.save_function("main", _TIMED, *args, include_return=False)

    def timer(number, repeat):
        return vm.time_evaluator(_TIMED, dev, number=number, repeat=repeat)().results

    return timer
