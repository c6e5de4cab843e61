"""Devices that ops can be placed on, and the links that copy tensors between them."""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tvm

# Rough peaks of TVM's *default (untuned)* kernels, used only by the roofline estimate until a
# device is profiled: ~2 GFLOP/s measured for an untuned 256x256 CPU matmul (docs/tvm_notes.md).
_CPU_PEAK_FLOPS = 4e9
_CPU_MEM_BW = 10e9
_GPU_PEAK_FLOPS = 20e12
_GPU_MEM_BW = 2e12
# A link between hosts until measured: a round trip of a small message, 10 Gbit/s Ethernet.
_NET_ALPHA = 200e-6
_NET_BETA = 1.25e9

_NAME = r"[A-Za-z0-9_.\-]+"  # a device's or a host's name
_KINDS = {"cpu": ("llvm", 1), "cuda": ("cuda", 2), "torch": ("torch", None), "ort": ("ort", None)}
#: Where a torch device's tensors live: PyTorch device type -> DLPack device type.
_TORCH_PLACES = {"cpu": 1, "cuda": 2}
#: Runtime devices: kinds whose ops run as calls from the VM of a TVM device, not as TVM kernels.
RUNTIME_KINDS = ("torch", "ort")
#: What entering and leaving an ONNX Runtime segment costs per tensor until measured.
_ORT_EDGE_S = 10e-6


@dataclass(frozen=True)
class Device:
    """A device autoplace can put ops on.

    Parameters
    ----------
    name : str
        Unique name used in plans (``"cpu0"``, ``"gpu"``...).
    kind : str
        Runtime device kind: ``"cpu"`` or ``"cuda"`` (TVM's generated kernels), ``"torch"``
        (PyTorch's kernels, called from the Relax VM: :meth:`torch`) or ``"ort"`` (segments of
        the model run by ONNX Runtime, called from the VM: :meth:`onnxruntime`).
    index : int
        Runtime device index (``tvm.cpu(index)``, ``tvm.cuda(index)``).
    target : str
        A torch or ORT device: the device type its tensors live on, ``"cpu"`` or ``"cuda"``.
        Otherwise:
        TVM target string or tag (``"llvm"``, ``"cuda"``, ``"nvidia/nvidia-h100"``), or
        ``"native"`` (a CPU device's default): LLVM for the CPU of the host that builds (``-mcpu``
        of ``tvm.target.codegen.llvm_get_system_cpu()``, so AVX2/AVX-512 where the CPU has
        them). ``"llvm"`` compiles for generic x86-64 (SSE2), for a build that must run on any
        x86 host (``cpu:N:generic``).
    memory_bytes : float
        Memory capacity available to the model (positive); ``inf`` for unlimited.
    peak_flops, mem_bandwidth : float
        Used by the roofline estimate when nothing was measured (positive).
    unsupported_ops : frozenset of str
        Relax op types this device cannot run, ``"nn.conv2d"`` or ``"relax.nn.conv2d"`` (stored
        without the ``"relax."``); a name Relax does not have is an error.
    host : str or None
        The machine the device is on: a host of a Ray cluster, by the name
        :func:`autoplace.cluster.cluster_devices` lists; ``None`` (the default) is the host of
        this process. Devices of different hosts share no memory: a tensor between them crosses
        the network.
    """

    name: str
    kind: str = "cpu"
    index: int = 0
    target: str = "native"
    memory_bytes: float = math.inf
    peak_flops: float = _CPU_PEAK_FLOPS
    mem_bandwidth: float = _CPU_MEM_BW
    unsupported_ops: frozenset[str] = field(default_factory=frozenset)
    host: str | None = None

    def __post_init__(self):
        if self.host is not None and not (isinstance(self.host, str)
                                          and re.fullmatch(_NAME, self.host)):
            raise ValueError(f"device {self.name!r}: host {self.host!r}: use letters, digits, "
                             "'_', '.', '-'")
        if self.kind in RUNTIME_KINDS and self.target not in _TORCH_PLACES:
            raise ValueError(f"device {self.name!r}: a {self.kind} device runs on 'cpu' or "
                             f"'cuda', got {self.target!r}")
        if self.kind not in _KINDS:
            raise ValueError(f"device {self.name!r}: unknown kind {self.kind!r}; "
                             f"use one of {sorted(_KINDS)}")
        if self.target == "native" and self.kind not in ("cpu", "torch"):
            raise ValueError(f"device {self.name!r}: target 'native' names a CPU; give a "
                             f"{self.kind} device its target (e.g. Device.cuda(0))")
        if not re.fullmatch(_NAME, self.name):
            raise ValueError(f"device name {self.name!r}: use letters, digits, '_', '.', '-'")
        for attr in ("memory_bytes", "peak_flops", "mem_bandwidth"):
            value = getattr(self, attr)
            if isinstance(value, bool) or not isinstance(value, numbers.Real) or not value > 0:
                raise ValueError(f"device {self.name!r}: {attr} must be a positive number, "
                                 f"got {value!r}")
        if isinstance(self.unsupported_ops, str):
            raise ValueError(f"device {self.name!r}: unsupported_ops is a set of op names, got "
                             f"the string {self.unsupported_ops!r}; write {{{self.unsupported_ops!r}}}")
        ops = frozenset(op.removeprefix("relax.") for op in self.unsupported_ops)
        if ops:
            _check_op_types(self.name, ops)
        object.__setattr__(self, "unsupported_ops", ops)

    @classmethod
    def cpu(cls, index: int = 0, *, name: str | None = None, target: str = "native",
            **kwargs) -> Device:
        """A CPU (LLVM target) device; ``index`` is the ``tvm.cpu`` index. It compiles for this
        host's CPU (``target="native"``); ``target="llvm"`` for generic x86-64."""
        name = name or _on_host(f"cpu{index}", kwargs.get("host"))
        return cls(name=name, kind="cpu", index=index, target=target, **kwargs)

    @classmethod
    def cuda(cls, index: int = 0, *, name: str | None = None, target: str = "nvidia/nvidia-h100",
             **kwargs) -> Device:
        """A CUDA GPU; ``target`` should name its architecture (bare ``"cuda"`` means sm_50)."""
        kwargs.setdefault("peak_flops", _GPU_PEAK_FLOPS)
        kwargs.setdefault("mem_bandwidth", _GPU_MEM_BW)
        name = name or _on_host(f"cuda{index}", kwargs.get("host"))
        return cls(name=name, kind="cuda", index=index, target=target, **kwargs)

    @classmethod
    def torch(cls, place: str = "cpu", index: int = 0, *, name: str | None = None,
              fallback_only: bool = False, **kwargs) -> Device:
        """PyTorch's kernels, called from the Relax VM (``runtime == "torch"``): it runs the ops
        the Relax importer lacks (:func:`autoplace.frontends.from_torch` turns them into
        PyTorch calls), and the Relax ops of
        :data:`autoplace.backend.torch_equivalents.EQUIVALENTS` (conv2d, matmul, attention,
        elementwise, softmax, layer_norm, pools...) as their PyTorch equivalents, where its
        costs win;
        ``fallback_only`` runs only the former. ``place`` is where its tensors live: ``"cpu"``
        (named ``"torch"``; the host's memory, which TVM's CPU devices share: no copy between
        them) or ``"cuda"`` (``"torch-cuda0"``: GPU ``index``'s memory, which TVM's CUDA device
        of the same index shares; its calls are PyTorch's CUDA kernels, cuDNN and cuBLAS).

        >>> Device.torch().name, Device.torch("cuda", 0).name
        ('torch', 'torch-cuda0')
        """
        if place not in _TORCH_PLACES:
            raise ValueError(f"Device.torch: place is 'cpu' or 'cuda', got {place!r}")
        if fallback_only:
            from autoplace.backend.torch_equivalents import EQUIVALENTS

            kwargs["unsupported_ops"] = EQUIVALENTS | frozenset(kwargs.get("unsupported_ops", ()))
        default = "torch" if place == "cpu" and index == 0 else f"torch-{place}{index}"
        name = name or _on_host(default, kwargs.get("host"))
        return cls(name=name, kind="torch", index=index, target=place, **kwargs)

    @classmethod
    def onnxruntime(cls, place: str = "cpu", index: int = 0, *, name: str | None = None,
                    **kwargs) -> Device:
        """ONNX Runtime, called from the Relax VM (``runtime == "ort"``): each run of ops placed
        on it runs as one ORT session (exported from the ops' PyTorch equivalents, so it takes
        the ops of :data:`autoplace.backend.torch_equivalents.EQUIVALENTS`), which ORT rewrites
        as a whole (layouts kept from conv to conv, batch norms folded, activations fused). Named
        ``"ort"``; its tensors are the host's memory, shared with TVM's CPU devices. Needs
        ``pip install 'autoplace[ort]'``. Only ``place="cpu"`` (ORT's CPU execution provider)
        is built.

        >>> Device.onnxruntime().name, Device.onnxruntime().spec
        ('ort', 'ort:cpu')
        """
        if place != "cpu":
            raise ValueError(f"Device.onnxruntime: place {place!r} is not built yet; "
                             "ONNX Runtime runs on 'cpu' (its CPU execution provider)")
        name = name or _on_host("ort" if index == 0 else f"ort{index}", kwargs.get("host"))
        return cls(name=name, kind="ort", index=index, target=place, **kwargs)

    @classmethod
    def from_spec(cls, spec: str) -> Device:
        """Parse ``"cpu:0"`` (LLVM for this host's CPU; ``"cpu:0:native"`` says the same),
        ``"cpu:0:generic"`` (generic x86-64, target ``"llvm"``), ``"cuda:0"``, or ``"torch:cpu"``
        / ``"torch:cuda:0"`` (PyTorch's kernels, :meth:`torch`) (the CLI's device syntax);
        ``"HOST/cpu:0"`` is that device on host ``HOST`` of a cluster (named ``"HOST-cpu0"``).

        >>> Device.from_spec("node1/cpu:0").name, Device.from_spec("node1/cpu:0").host
        ('node1-cpu0', 'node1')
        """
        host, sep, rest = spec.strip().rpartition("/")
        if sep:
            if not re.fullmatch(_NAME, host):
                raise ValueError(f"device spec {spec!r}: a host is named with letters, digits, "
                                 "'_', '.', '-' before the '/' ('node1/cpu:0')")
            d = cls.from_spec(rest)
            return dataclasses.replace(d, host=host, name=_on_host(d.name, host))
        o = re.fullmatch(r"(?:ort|onnxruntime)(?::(\w+)(?::(\d+))?)?", spec.strip())
        if o:
            return cls.onnxruntime(o.group(1) or "cpu", int(o.group(2) or 0))
        t = re.fullmatch(r"torch(?::(cpu|cuda)(?::(\d+))?)?", spec.strip())
        if t:
            if t.group(1) == "cpu" and t.group(2) not in (None, "0"):
                raise ValueError(f"device spec {spec!r}: PyTorch's CPU is 'torch:cpu'")
            return cls.torch(t.group(1) or "cpu", int(t.group(2) or 0))
        m = re.fullmatch(r"(cpu|cuda)(?::(\d+))?(:native|:generic)?", spec.strip())
        if not m or (m.group(3) and m.group(1) != "cpu"):
            raise ValueError(f"device spec {spec!r}: expected 'cpu:N' or 'cuda:N' "
                             "('cpu:N:generic' compiles for generic x86-64), 'torch:cpu' / "
                             "'torch:cuda:N' for PyTorch's kernels, or 'ort:cpu' for ONNX "
                             "Runtime")
        kind, index = m.group(1), int(m.group(2) or 0)
        if m.group(3) == ":generic":
            return cls.cpu(index, target="llvm")
        return getattr(cls, kind)(index)

    @property
    def spec(self) -> str | None:
        """The device in the CLI's syntax (:meth:`from_spec`), or None where its target has no
        spec (a CPU target other than ``"native"`` and ``"llvm"``)."""
        if self.host is not None:
            local = dataclasses.replace(self, host=None).spec
            return None if local is None else f"{self.host}/{local}"
        if self.kind == "torch":
            return "torch:cpu" if self.target == "cpu" else f"torch:cuda:{self.index}"
        if self.kind == "ort":
            return "ort:cpu" if self.index == 0 else None
        if self.kind != "cpu":
            return f"{self.kind}:{self.index}"
        return {"native": f"cpu:{self.index}",
                "llvm": f"cpu:{self.index}:generic"}.get(self.target)

    def can_run(self, op_type: str) -> bool:
        """Whether the device runs ops of ``op_type``: a torch device runs PyTorch calls
        (``"torch.*"``) and the Relax ops that have a PyTorch equivalent, a TVM device Relax
        ops only, an ORT device the Relax ops that have a PyTorch equivalent, and ``concat`` (it
        exports them) (less its ``unsupported_ops`` either way)."""
        if op_type.startswith("torch."):
            return self.runtime == "torch"
        op = op_type.removeprefix("relax.")
        if self.kind in RUNTIME_KINDS:
            from autoplace.backend.torch_equivalents import EQUIVALENTS, SEGMENT_EQUIVALENTS

            takes = EQUIVALENTS | SEGMENT_EQUIVALENTS if self.kind == "ort" else EQUIVALENTS
            return op in takes and op not in self.unsupported_ops
        return op not in self.unsupported_ops

    @property
    def runtime(self) -> str:
        """Whose kernels run the device's ops: ``"tvm"`` (generated), ``"torch"`` (PyTorch's) or
        ``"ort"`` (ONNX Runtime's)."""
        return self.kind if self.kind in RUNTIME_KINDS else "tvm"

    @property
    def is_gpu(self) -> bool:
        """A TVM GPU device (a torch device is not one: it builds no kernels)."""
        return self.kind == "cuda"

    def tvm_target(self) -> tvm.target.Target:
        import tvm

        if self.kind in RUNTIME_KINDS:
            raise ValueError(f"device {self.name!r} runs {self.kind}'s kernels: it has no TVM "
                             "target (its calls run on the host, from the VM of the TVM devices)")
        if self.target == "native":
            return tvm.target.Target({"kind": "llvm",
                                      "mcpu": tvm.target.codegen.llvm_get_system_cpu()})
        return tvm.target.Target(self.target)

    def tvm_device(self) -> tvm.runtime.Device:
        import tvm

        if self.kind in RUNTIME_KINDS:  # where its tensors live: the host's memory, or the GPU
            return tvm.runtime.device(self.target, 0 if self.target == "cpu" else self.index)
        return tvm.runtime.device(_KINDS[self.kind][0] if self.kind == "cuda" else "cpu", self.index)

    @property
    def torch_place(self) -> str:
        """A torch device's tensors' PyTorch device: ``"cpu"`` or ``"cuda:N"``."""
        if self.kind != "torch":
            raise ValueError(f"device {self.name!r} is no torch device (Device.torch())")
        return "cpu" if self.target == "cpu" else f"cuda:{self.index}"

    @property
    def memory(self) -> tuple[int, int]:
        """Where the device's tensors live, as (DLPack device type, index): devices of the same
        memory hand tensors over without a copy (a torch device and the TVM device it shares
        memory with). Every CPU device is the host's memory, ``(1, 0)``."""
        t = self.dl_device_type
        return (t, 0) if t == 1 else (t, self.index)

    @property
    def dl_device_type(self) -> int:
        """DLPack device type code (1 = CPU, 2 = CUDA)."""
        if self.kind in RUNTIME_KINDS:
            return _TORCH_PLACES[self.target]
        return _KINDS[self.kind][1]

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in ("name", "kind", "index", "target", "memory_bytes",
                                            "peak_flops", "mem_bandwidth")}
        d["unsupported_ops"] = sorted(self.unsupported_ops)
        if self.host is not None:  # a device of this process's host is written as before
            d["host"] = self.host
        if math.isinf(self.memory_bytes):
            d["memory_bytes"] = None  # strict JSON has no Infinity
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Device:
        memory = d.get("memory_bytes")
        return cls(**{**d, "memory_bytes": math.inf if memory is None else float(memory),
                      "unsupported_ops": frozenset(d.get("unsupported_ops", ()))})


def local_devices(runtimes: bool = True) -> list[Device]:
    """This machine's devices, as a caller who names none gets them: its CPU, its first GPU
    where TVM sees one, and (``runtimes``) a device per runtime installed here: PyTorch's
    kernels (``torch:cpu``) where PyTorch is, ONNX Runtime's (``ort:cpu``) where onnxruntime
    and PyTorch (which exports its segments) are."""
    import tvm

    devices = [Device.cpu(0)]
    if tvm.cuda(0).exist:
        devices.append(Device.cuda(0))
    if runtimes and _installed("torch"):
        devices.append(Device.torch())
        if _installed("onnxruntime"):
            devices.append(Device.onnxruntime())
    return devices


def _installed(package: str) -> bool:
    """Whether ``package`` can be imported here (found, not blocked), without importing it."""
    import importlib.util
    import sys

    if package in sys.modules:
        return sys.modules[package] is not None
    try:
        return importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        return False


def runtime_threads(devices) -> int:
    """The threads a runtime device's calls (PyTorch's, ONNX Runtime's intra-op) run at in a
    plan over ``devices``: where one TVM CPU device is the only one, PyTorch's thread count (the
    threads a PyTorch user gives a model, ``torch.set_num_threads``; TVM's pool count where
    PyTorch is not installed), since the VM runs one call at a time and each runtime has the
    cores in turn; with several, each CPU device is a share of the cores, and a runtime call
    runs on one thread."""
    cpus = {d.index for d in devices if d.runtime == "tvm" and not d.is_gpu}
    if len(cpus) != 1:
        return 1
    if _installed("torch"):
        import torch

        return max(1, torch.get_num_threads())
    from autoplace.backend.threads import tvm_threads

    return max(1, tvm_threads())


def torch_threads(devices) -> int:
    """The PyTorch threads a torch device's calls run at in a plan over ``devices``:
    :func:`runtime_threads`, but one where the plan has an ONNX Runtime device too. After a
    call on several threads PyTorch's OpenMP workers spin for milliseconds, on the cores an ORT
    session's threads need next (docs/runtimes.md says by how much)."""
    if any(d.runtime == "ort" for d in devices):
        return 1
    return runtime_threads(devices)


def _on_host(name: str, host: str | None) -> str:
    """A device's default name: ``name``, prefixed by its host's (``"node1-cpu0"``)."""
    return name if host is None else f"{host}-{name}"


def _check_op_types(device: str, ops: frozenset[str]) -> None:
    """Raise ``ValueError`` for the first of ``ops`` that is not a Relax op type, with the
    nearest names."""
    import tvm

    known = {n.removeprefix("relax.") for n in tvm.ir.Op.list_op_names() if n.startswith("relax.")}
    for op in sorted(ops - known):
        near = difflib.get_close_matches(op, known, n=3)
        hint = f"did you mean {' or '.join(map(repr, near))}?" if near else (
            "op types are Relax's, e.g. 'matmul', 'nn.conv2d'")
        raise ValueError(f"device {device!r}: unsupported_ops names {op!r}, which is no Relax "
                         f"op; {hint}")


@dataclass(frozen=True)
class Link:
    """A copy path from ``src`` to ``dst``: moving ``x`` bytes takes ``alpha + x / beta`` seconds."""

    src: str
    dst: str
    alpha: float = 5e-6
    beta: float = 5e9

    def time(self, nbytes: float) -> float:
        return self.alpha + nbytes / self.beta

    @classmethod
    def default(cls, src: Device, dst: Device) -> Link:
        """Rough defaults until measured: a memory copy between CPUs, PCIe to or from a GPU;
        none between a torch device and a TVM device of the same memory (:attr:`Device.memory`:
        PyTorch and TVM share the tensor, a hand-off); between devices of different hosts, a
        network's (``autoplace.cluster.measure_host_links`` measures it)."""
        if src.host != dst.host:
            return cls(src.name, dst.name, alpha=_NET_ALPHA, beta=_NET_BETA)
        if "ort" in (src.kind, dst.kind) and src.memory == dst.memory:
            return cls(src.name, dst.name, alpha=_ORT_EDGE_S, beta=math.inf)
        if "torch" in (src.kind, dst.kind) and src.memory == dst.memory:
            return cls(src.name, dst.name, alpha=0.0, beta=math.inf)
        if src.memory[0] != 1 or dst.memory[0] != 1:
            return cls(src.name, dst.name, alpha=10e-6, beta=12e9)
        return cls(src.name, dst.name)
