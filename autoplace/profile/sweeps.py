"""Shape sweeps of one op type, sampled around the configurations real models use (nn-Meter style).

A sweep adds profiling points between the workloads of real models. It starts from *seed*
configurations and perturbs them:

- seeds: one of four built-in tables of real models' layers, plus the nodes the caller passes as
  ``seen``. ``family="full"``: full-size models (ResNet-50, MobileNetV2, GoogLeNet /
  Inception-v3, EfficientNet-B0 at 224 px; BERT, GPT-2, ViT, T5-small; classifier heads).
  ``family="small"``: the small models of CIFAR, keyword spotting and microcontrollers
  (ResNet-20, MobileNetV2 and GoogLeNet for 32 px, VGG for CIFAR, DenseNet-BC, MobileNetV1-0.25
  at 96 px; DeiT-Tiny, TinyBERT, MobileBERT, the keyword transformer KWT-1), whose few channels
  and small planes make TVM's untuned kernels behave otherwise than full-size layers do.
  ``family="batch"``: dense layers over batches of 2-32 rows (MLPs and classifier heads serving
  a few requests at once), for ``matmul`` and the ops that follow one (``add``, ``nn.relu``,
  ``nn.gelu``, ``nn.layer_norm``). ``family="narrow"``: dense layers of 8-36 inputs (tabular
  and recommender MLPs), which LLVM vectorises where it does not vectorise wider ones, for the
  same ops. The tables are the primary source, so a sweep loads no model.
- perturbation: channels scaled by 0.5, 0.75, 1, 1.5 or 2 (rounded to multiples of 8; fewer
  than 8, like RGB, kept); spatial sizes, sequence lengths and attention heads moved to a value
  seen in any seed within a factor of 2; kernel, stride, depthwise-ness and layout kept from the
  seed. So the joint distribution of real layers is kept: depthwise stays depthwise, a 7x7
  stride-2 stem stays at a large spatial size, 2048 channels stay at 7-14 px.
- cost cap: a sample above ``max_flops`` or 64 MB of tensors is shrunk (spatial size or sequence
  halved, then channels), so that each one times in well under a second with TVM's untuned CPU
  kernels.

Every module has one op call in one dataflow block, all its tensors function parameters,
batch 1, NCHW, static float32 shapes. Convolutions and pools always pad ``kernel // 2``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

import numpy as np

from autoplace.graph import OpGraph, OpNode

if TYPE_CHECKING:
    import tvm

_OPS = ("nn.conv2d", "matmul", "add", "nn.relu", "nn.gelu", "nn.batch_norm", "nn.layer_norm",
        "nn.softmax", "nn.max_pool2d", "mean", "concat")
_CHANNEL_FACTORS = (0.5, 0.75, 1.0, 1.5, 2.0)
_MAX_BYTES = 64e6  # bytes read + written by one workload

# Convolutions: (c_in, size, c_out, kernel, stride, depthwise).
_CONV = (
    # ResNet-50 (torchvision v1.5: the stride is on the 3x3)
    (3, 224, 64, 7, 2, 0), (64, 56, 64, 1, 1, 0), (64, 56, 64, 3, 1, 0), (64, 56, 256, 1, 1, 0),
    (256, 56, 64, 1, 1, 0), (128, 56, 128, 3, 2, 0), (512, 28, 128, 1, 1, 0),
    (128, 28, 128, 3, 1, 0), (128, 28, 512, 1, 1, 0), (256, 56, 512, 1, 2, 0),
    (256, 28, 256, 3, 2, 0), (1024, 14, 256, 1, 1, 0), (256, 14, 256, 3, 1, 0),
    (256, 14, 1024, 1, 1, 0), (512, 14, 512, 3, 2, 0), (2048, 7, 512, 1, 1, 0),
    (512, 7, 512, 3, 1, 0), (512, 7, 2048, 1, 1, 0),
    # MobileNetV2: stem, depthwise 3x3, pointwise expand / project
    (3, 224, 32, 3, 2, 0), (32, 112, 32, 3, 1, 1), (32, 112, 16, 1, 1, 0), (16, 112, 96, 1, 1, 0),
    (96, 112, 96, 3, 2, 1), (24, 56, 144, 1, 1, 0), (144, 56, 144, 3, 1, 1), (144, 56, 24, 1, 1, 0),
    (32, 28, 192, 1, 1, 0), (192, 28, 192, 3, 2, 1), (64, 14, 384, 1, 1, 0), (384, 14, 384, 3, 1, 1),
    (384, 14, 96, 1, 1, 0), (960, 7, 960, 3, 1, 1), (160, 7, 960, 1, 1, 0), (320, 7, 1280, 1, 1, 0),
    # GoogLeNet / Inception-v3 (5x5, odd sizes), EfficientNet-B0 (depthwise 5x5)
    (16, 28, 32, 5, 1, 0), (192, 35, 64, 1, 1, 0), (48, 35, 64, 5, 1, 0), (768, 17, 192, 1, 1, 0),
    (240, 28, 240, 5, 1, 1), (672, 14, 672, 5, 2, 1),
)
# Dense layers: (tokens, d_in, d_out); BERT-base/large, GPT-2 qkv, ViT-B/16, T5-small, MiniLM,
# classifier heads (ImageNet-1k, ImageNet-21k, CIFAR-100).
_LINEAR = ((128, 768, 768), (128, 768, 3072), (128, 3072, 768), (1024, 768, 2304),
           (197, 768, 3072), (512, 1024, 4096), (64, 512, 2048), (256, 384, 1536),
           (1, 2048, 1000), (1, 1280, 1000), (1, 768, 21843), (1, 512, 100))
# Attention: (heads, tokens, head_dim); the same models, and ViT-L/16 at 384 px.
_ATTENTION = ((12, 128, 64), (12, 384, 64), (12, 197, 64), (16, 512, 64), (8, 64, 64),
              (12, 1024, 64), (16, 577, 64), (6, 256, 64))
# Max pools: (channels, size, kernel, stride); ResNet, VGG, GoogLeNet.
_POOL = ((64, 112, 3, 2), (64, 224, 2, 2), (128, 112, 2, 2), (256, 56, 2, 2), (512, 28, 2, 2),
         (192, 56, 3, 2), (480, 28, 3, 2), (192, 28, 3, 1))
# Global average pools (classifier, squeeze-and-excitation): (channels, size).
_MEAN = ((2048, 7), (1280, 7), (512, 7), (96, 56), (240, 28))
# Channel concats: (size, channels of each part); GoogLeNet, SqueezeNet, ShuffleNet, DenseNet.
_CONCAT = ((28, (64, 128, 32, 32)), (14, (192, 208, 48, 64)), (56, (64, 64)), (28, (116, 116)),
           (28, (128, 32)))

# The "small" family, in the same formats. Convolutions: ResNet-20/56 for CIFAR-10 (3x3 at 32/16/8
# px, 16/32/64 channels, 1x1 projection shortcuts); MobileNetV2 for CIFAR (stride-1 stem);
# MobileNetV1-0.25 at 96 px (Visual Wake Words); GoogLeNet for CIFAR (inception 3a); VGG-11 for
# CIFAR.
_SMALL_CONV = (
    (3, 32, 16, 3, 1, 0), (16, 32, 16, 3, 1, 0), (16, 32, 32, 3, 2, 0), (32, 16, 32, 3, 1, 0),
    (32, 16, 64, 3, 2, 0), (64, 8, 64, 3, 1, 0), (16, 32, 32, 1, 2, 0), (32, 16, 64, 1, 2, 0),
    (3, 32, 32, 3, 1, 0), (32, 32, 32, 3, 1, 1), (32, 32, 16, 1, 1, 0), (16, 32, 96, 1, 1, 0),
    (96, 32, 96, 3, 2, 1), (96, 16, 24, 1, 1, 0), (24, 16, 144, 1, 1, 0), (144, 16, 144, 3, 2, 1),
    (144, 8, 32, 1, 1, 0), (192, 8, 192, 3, 1, 1), (192, 8, 64, 1, 1, 0), (384, 4, 96, 1, 1, 0),
    (320, 4, 1280, 1, 1, 0),
    (3, 96, 8, 3, 2, 0), (8, 48, 8, 3, 1, 1), (8, 48, 16, 1, 1, 0), (16, 24, 32, 1, 1, 0),
    (32, 12, 64, 1, 1, 0), (64, 6, 128, 1, 1, 0),
    (192, 32, 64, 1, 1, 0), (96, 32, 128, 3, 1, 0), (16, 32, 32, 5, 1, 0), (192, 32, 16, 1, 1, 0),
    (64, 16, 128, 3, 1, 0), (256, 8, 256, 3, 1, 0), (512, 4, 512, 3, 1, 0),
)
# Dense layers: DeiT-Tiny; TinyBERT-4, MobileBERT's bottleneck; KWT-1; heads and an MNIST MLP.
_SMALL_LINEAR = ((197, 192, 576), (197, 192, 768), (197, 768, 192), (197, 192, 192),
                 (128, 312, 1200), (128, 1200, 312), (128, 128, 512), (128, 512, 128),
                 (99, 64, 192), (99, 64, 256), (99, 256, 64),
                 (1, 64, 10), (1, 256, 10), (1, 192, 35), (1, 784, 256), (1, 256, 128))
# Attention: DeiT-Tiny, TinyBERT-4, MobileBERT, KWT-1, a ViT for CIFAR (4x4 patches).
_SMALL_ATTENTION = ((3, 197, 64), (12, 128, 26), (4, 128, 32), (1, 99, 64), (4, 65, 32))
# Pools, global pools and concats: VGG and GoogLeNet for CIFAR, MobileNetV1-0.25, ResNet-20,
# MobileNetV2, DenseNet-BC-100 (growth 12, its 108/150/342-channel transitions), SqueezeNet.
_SMALL_POOL = ((64, 32, 2, 2), (192, 32, 3, 1), (480, 16, 3, 2), (128, 16, 2, 2), (8, 48, 2, 2))
_SMALL_MEAN = ((64, 8), (1280, 4), (1024, 8), (256, 3), (342, 8))
_SMALL_CONCAT = ((32, (64, 128, 32, 32)), (32, (24, 12)), (16, (108, 12)), (8, (150, 12)),
                 (16, (64, 64)))
# The "batch" family: dense layers over a batch of 2-32 rows, as an MLP or a classifier head
# serves a few requests at once. MNIST MLP (784-256-128-10), a keyword-spotting DNN
# (250-144-144-12), a recommender's MLP tower (512-256-64), MobileNetV2 / ResNet-50 heads.
_BATCH_LINEAR = ((8, 784, 256), (16, 256, 128), (32, 128, 10), (4, 250, 144), (2, 144, 144),
                 (4, 144, 12), (32, 512, 256), (16, 256, 64), (8, 64, 1), (2, 1280, 1000),
                 (4, 2048, 1000))
# The "narrow" family: dense layers of 8-36 inputs, whose short reduction LLVM unrolls and
# vectorises across the outputs (2-3x the FLOP/s of a wider layer, `code_features`). DLRM's bottom
# MLP (13 dense Criteo features), an MLP on the 14 Adult-census features, NCF's MLP and a
# two-tower recommender over 32-d embeddings, a 16-d control policy, a sensor MLP, a 4-feature
# classifier.
_NARROW_LINEAR = ((32, 13, 512), (16, 14, 64), (64, 32, 32), (8, 32, 64), (4, 16, 16),
                  (1, 24, 64), (2, 8, 32))
_FAMILIES = {
    "full": dict(conv=_CONV, linear=_LINEAR, attention=_ATTENTION, pool=_POOL, mean=_MEAN,
                 concat=_CONCAT),
    "small": dict(conv=_SMALL_CONV, linear=_SMALL_LINEAR, attention=_SMALL_ATTENTION,
                  pool=_SMALL_POOL, mean=_SMALL_MEAN, concat=_SMALL_CONCAT),
    "batch": dict(conv=(), linear=_BATCH_LINEAR, attention=(), pool=(), mean=(), concat=()),
    "narrow": dict(conv=(), linear=_NARROW_LINEAR, attention=(), pool=(), mean=(), concat=()),
}
#: What each family's seeds are, in a few words (for help texts).
FAMILY_HELP = {"full": "full-size models",
               "small": "CIFAR, keyword spotting, microcontroller models",
               "batch": "dense layers over 2-32 rows", "narrow": "dense layers of 8-36 inputs"}


def sweep_names() -> list[str]:
    """The op types :func:`sweep` can sample, as :attr:`OpNode.op_type` spells them."""
    return list(_OPS)


def sweep_families(op_type: str | None = None) -> list[str]:
    """The seed tables :func:`sweep` can start from (its ``family``); with ``op_type``, those
    that have layers of it."""
    return [f for f in _FAMILIES if op_type is None or (op_type in _OPS and _table(op_type, f))]


def from_specs(specs: Iterable[str]) -> list[tuple[str, tvm.IRModule]]:
    """``(f"sweep:{name}", module)`` for command-line specs ``OP[:N[:FAMILY]]`` (N default 32,
    family default ``full``), e.g. ``nn.conv2d:48:small``."""
    out = []
    for spec in specs:
        parts = spec.split(":")
        op, n, family = (parts + ["", ""])[:3]
        if len(parts) > 3 or not (n or "32").isdigit():
            raise ValueError(f"bad sweep {spec!r}: expected OP[:N[:FAMILY]], "
                             "e.g. nn.conv2d:48:small")
        out += [(f"sweep:{name}", mod)
                for name, mod in sweep(op, int(n or 32), family=family or "full")]
    return out


def sweep(
    op_type: str,
    n: int = 32,
    *,
    rng: np.random.Generator | None = None,
    seen: Iterable[OpNode] | None = None,
    max_flops: float = 3e8,
    family: str = "full",
) -> list[tuple[str, tvm.IRModule]]:
    """``n`` distinct single-op modules of ``op_type``, sampled around real-model shapes.

    Parameters
    ----------
    op_type
        One of :func:`sweep_names`, e.g. ``"nn.conv2d"``.
    n
        How many distinct workloads (by :attr:`OpNode.workload_key`).
    rng
        Source of randomness; the same seed gives the same sweep. Default ``default_rng(0)``.
    seen
        Op nodes of real models (any op types; e.g. ``OpGraph.from_relax(mod).nodes``): those of
        ``op_type`` become extra seeds, and all of them add spatial sizes and sequence lengths.
    max_flops
        Samples above this are shrunk. At 3e8, a conv2d takes at most ~0.2 s with TVM's untuned
        CPU kernels (~2 GFLOP/s); untuned matmul is slower (~0.35 GFLOP/s, up to ~0.8 s).
    family
        The seed table, a key of :data:`FAMILY_HELP` (which says what each holds); see
        :func:`sweep_families`.

    Returns
    -------
    list of (name, IRModule)
        Short readable names, e.g. ``"conv2d_n1_c32_h28_w28_o64_k3_s1_g1"``.

    Raises
    ------
    ValueError
        For an op type that cannot be swept, an unknown family, or a family without layers of
        ``op_type`` (the message lists what can be used).
    RuntimeError
        If ``n`` distinct configurations are not found (ask for fewer).

    Examples
    --------
    >>> [name for name, _ in sweep("nn.conv2d", 2)]    # doctest: +SKIP
    ['conv2d_n1_c24_h28_w28_o24_k5_s1_g1', 'conv2d_n1_c128_h7_w7_o128_k3_s1_g1']
    """
    if op_type not in _OPS:
        raise ValueError(f"cannot sweep {op_type!r}; available op types: {', '.join(_OPS)}")
    if family not in _FAMILIES:
        raise ValueError(f"no sweep family {family!r}; available: {', '.join(_FAMILIES)}")
    rng = np.random.default_rng(0) if rng is None else rng
    parsed = [p for p in (_from_node(node) for node in (seen or ())) if p is not None]
    seeds = _unique([p for op, p in parsed if op == op_type] + _table(op_type, family))
    if not seeds:
        raise ValueError(f"the {family!r} sweep family has no {op_type} layers to start from; "
                         f"use another family ({', '.join(_FAMILIES)}) or pass `seen` nodes")
    every = [p for op in _OPS for p in _table(op, family)] + [p for _, p in parsed]
    pools = {key: sorted({p[key] for p in every if key in p}) for key in ("h", "t", "heads")}

    out: list[tuple[str, tvm.IRModule]] = []
    keys: set[str] = set()
    for _ in range(50 * n):
        if len(out) == n:
            break
        p = _perturb(seeds[rng.integers(len(seeds))], pools, rng)
        while p is not None:
            name, mod = _build(op_type, p)
            node = OpGraph.from_relax(mod).nodes[0]
            if node.flops <= max_flops and node.bytes_read + node.bytes_written <= _MAX_BYTES:
                break
            p = _shrink(p)
        if p is not None and node.workload_key not in keys:
            keys.add(node.workload_key)
            out.append((name, mod))
    if len(out) < n:
        raise RuntimeError(f"found only {len(out)} distinct {op_type} configurations "
                           f"(asked for {n}): ask for fewer or pass more `seen` nodes")
    return out


# ----------------------------------------------------------------------------- seeds

def _unique(params: list[dict]) -> list[dict]:
    """``params`` without repeats, in first-seen order."""
    first: dict[tuple, dict] = {}
    for p in params:
        first.setdefault(tuple(sorted(p.items())), p)
    return list(first.values())


def _table(op: str, family: str) -> list[dict]:
    """Seed parameters of ``op`` in a family. Activations: ``c, h`` (NCHW) or ``t, c`` (tokens)."""
    f = _FAMILIES[family]
    conv_out = _unique([dict(c=o, h=-(-h // s)) for _, h, o, _, s, _ in f["conv"]])
    tokens = [dict(t=t, c=c) for t, c, _ in f["linear"] if t > 1]
    hidden = _unique(tokens + [dict(t=t, c=o) for t, _, o in f["linear"] if t > 1])
    return {
        "nn.conv2d": [dict(c=c, h=h, o=o, k=k, s=s, dw=dw) for c, h, o, k, s, dw in f["conv"]],
        "matmul": [dict(kind="linear", t=t, c=c, o=o) for t, c, o in f["linear"]]
        + [dict(kind=kind, heads=hd, t=t, c=d) for hd, t, d in f["attention"]
           for kind in ("qk", "av")],
        "add": [dict(p, bias=0) for p in conv_out + hidden] + [dict(p, bias=1) for p in hidden],
        "nn.relu": conv_out or hidden,  # a family without convs: its dense layers' outputs
        "nn.gelu": hidden,
        "nn.batch_norm": conv_out,
        "nn.layer_norm": tokens,
        "nn.softmax": [dict(heads=hd, t=t) for hd, t, _ in f["attention"]]
        + [dict(c=o) for t, _, o in f["linear"] if t == 1],
        "nn.max_pool2d": [dict(c=c, h=h, k=k, s=s) for c, h, k, s in f["pool"]],
        "mean": [dict(c=c, h=h) for c, h in f["mean"]],
        "concat": [dict(h=h, cs=cs) for h, cs in f["concat"]],
    }[op]


def _from_node(node: OpNode) -> tuple[str, dict] | None:
    """``(op_type, parameters)`` of a real op node, or None where a sweep cannot express it."""
    op, attrs = node.op_type, dict(node.attrs)
    shapes = [t.shape for t in node.inputs]
    if op not in _OPS or not shapes or any(t.dtype != "float32" for t in node.inputs):
        return None
    if op == "add" and len(shapes) == 2:  # the larger operand first (torch writes bias + x)
        shapes.sort(key=lambda y: (math.prod(y), len(y)), reverse=True)
    x = shapes[0]
    square = len(x) == 4 and x[0] == 1 and x[2] == x[3]
    act = dict(c=x[1], h=x[2]) if square else (
        dict(t=math.prod(x[:-1]), c=x[-1]) if len(x) in (2, 3) else None)
    p = None
    if op == "nn.conv2d" and square and attrs.get("data_layout") == "NCHW" \
            and attrs.get("kernel_layout") == "OIHW" and attrs.get("dilation") == [1, 1]:
        o, _, k, k2 = shapes[1]
        s, g = attrs.get("strides", [1, 1]), attrs.get("groups", 1)
        if k == k2 and s[0] == s[1] and (g == 1 or g == x[1] == o):
            p = dict(c=x[1], h=x[2], o=o, k=k, s=s[0], dw=int(g > 1))
    elif op == "matmul" and len(shapes) == 2:
        b = shapes[1]
        if len(b) == 2 and len(x) >= 2:
            p = dict(kind="linear", t=math.prod(x[:-1]), c=x[-1], o=b[-1])
        elif len(x) == len(b) in (3, 4) and x[:-2] == b[:-2]:  # attention, heads as batch
            heads, (m, k), (_, n) = math.prod(x[:-2]), x[-2:], b[-2:]
            if m == n:
                p = dict(kind="qk", heads=heads, t=m, c=k)
            elif m == k:
                p = dict(kind="av", heads=heads, t=m, c=n)
    elif op == "add" and act and len(shapes) == 2:
        bias = (act["c"],) if "t" in act else (1, act["c"], 1, 1)
        p = dict(act, bias=int(shapes[1] == bias)) if shapes[1] in (x, bias) else None
    elif op in ("nn.relu", "nn.gelu"):
        p = act
    elif op == "nn.layer_norm":
        p = act if "t" in (act or {}) and attrs.get("axes") in ([-1], [len(x) - 1]) else None
    elif op == "nn.batch_norm":
        p = act if square and attrs.get("axis") == 1 else None
    elif op == "mean":
        p = act if square and sorted(attrs.get("axis") or []) in ([2, 3], [-2, -1]) else None
    elif op == "nn.softmax":
        if len(x) == 4 and x[0] == 1 and x[2] == x[3]:
            p = dict(heads=x[1], t=x[2])
        elif len(x) == 2 and x[0] == 1:
            p = dict(c=x[1])
    elif op == "nn.max_pool2d" and square:
        k, s = attrs.get("pool_size", [1, 1]), attrs.get("strides", [1, 1])
        p = dict(c=x[1], h=x[2], k=k[0], s=s[0]) if k[0] == k[1] and s[0] == s[1] else None
    elif op == "concat" and attrs.get("axis") == 1 and all(
            len(y) == 4 and y[0] == 1 and y[2] == y[3] == x[2] for y in shapes):
        p = dict(h=x[2], cs=tuple(y[1] for y in shapes))
    return (op, p) if p else None


# ----------------------------------------------------------------------------- sampling

def _round8(v: float) -> int:
    return max(8, int(round(v / 8)) * 8)


def _perturb(p: dict, pools: dict[str, list[int]], rng: np.random.Generator) -> dict:
    """Channels scaled; spatial size, tokens and heads moved to a seen value within a factor 2."""
    q = dict(p)
    for key, v in p.items():
        if key in ("c", "o") and v >= 8:
            q[key] = _round8(v * rng.choice(_CHANNEL_FACTORS))
        elif key == "cs":
            q[key] = tuple(_round8(c * rng.choice(_CHANNEL_FACTORS)) if c >= 8 else c for c in v)
        elif key in ("h", "t", "heads"):
            q[key] = int(rng.choice([s for s in pools[key] if v / 2 <= s <= 2 * v]))
    if q.get("dw"):
        q["o"] = q["c"]
    return q


def _shrink(p: dict) -> dict | None:
    """A smaller neighbour: spatial size or tokens halved first, then channels; None if minimal."""
    for key, low in (("h", 7), ("t", 16)):
        if p.get(key, 0) > low:
            return {**p, key: max(low, -(-p[key] // 2))}
    if "cs" in p and max(p["cs"]) > 8:
        return {**p, "cs": tuple(_round8(c / 2) if c > 8 else c for c in p["cs"])}
    wide = [k for k in ("c", "o") if p.get(k, 0) > 8]
    if not wide:
        return None
    key = max(wide, key=p.get)
    q = {**p, key: _round8(p[key] / 2)}
    if q.get("dw"):
        q["o"] = q["c"]
    return q


# ----------------------------------------------------------------------------- building

def _build(op: str, p: dict) -> tuple[str, tvm.IRModule]:
    """The name and one-op module of ``op`` with parameters ``p``."""
    from tvm import relax

    R = relax.op
    if "heads" in p:  # attention scores
        x = (1, p["heads"], p["t"], p["t"])
    elif "h" in p:  # NCHW activations
        x = (1, p.get("c"), p["h"], p["h"])
    else:  # token activations, or logits
        x = (1, p["t"], p["c"]) if "t" in p else (1, p["c"])
    tag = "x".join(map(str, x))
    short = op.removeprefix("nn.")
    if op == "nn.conv2d":
        c, h, k, s = p["c"], p["h"], p["k"], p["s"]
        g, o = (c, c) if p["dw"] else (1, p["o"])
        name = f"conv2d_n1_c{c}_h{h}_w{h}_o{o}_k{k}_s{s}_g{g}"
        shapes = [x, (o, c // g, k, k)]
        call = lambda a, w: R.nn.conv2d(a, w, strides=s, padding=k // 2, groups=g)  # noqa: E731
    elif op == "matmul":
        hd, t, c = p.get("heads"), p["t"], p["c"]
        if p["kind"] == "linear":
            shapes = [(t, c), (c, p["o"])]
        else:  # attention: scores = q @ k^T (qk), out = scores @ v (av)
            shapes = [(1, hd, t, c), (1, hd, c, t)] if p["kind"] == "qk" else \
                [(1, hd, t, t), (1, hd, t, c)]
        (*_, m, kk), (*_, nn_) = shapes
        name = f"matmul_{f'b{hd}_' if hd else ''}m{m}_k{kk}_n{nn_}"
        call = lambda a, b: R.matmul(a, b, out_dtype="float32")  # noqa: E731 - as the importers write it
    elif op == "add":
        shapes = [x, x if not p["bias"] else (p["c"],) if "t" in p else (1, p["c"], 1, 1)]
        name = f"add_{tag}{'_bias' if p['bias'] else ''}"
        call = R.add
    elif op in ("nn.relu", "nn.gelu", "mean"):
        shapes, name = [x], f"{short}_{tag}"
        call = {"nn.relu": R.nn.relu, "nn.gelu": R.nn.gelu,
                "mean": lambda a: R.mean(a, axis=[-1, -2], keepdims=True)}[op]
    elif op == "nn.batch_norm":
        shapes, name = [x] + [(p["c"],)] * 4, f"batch_norm_{tag}"
        call = lambda *a: R.nn.batch_norm(*a, axis=1, training=False)  # noqa: E731
    elif op == "nn.layer_norm":
        shapes, name = [x, (p["c"],), (p["c"],)], f"layer_norm_{tag}"
        call = lambda *a: R.nn.layer_norm(*a, axes=[-1])  # noqa: E731
    elif op == "nn.softmax":
        shapes, name = [x], f"softmax_{tag}"
        call = lambda a: R.nn.softmax(a, axis=-1)  # noqa: E731
    elif op == "nn.max_pool2d":
        k, s = p["k"], p["s"]
        shapes, name = [x], f"max_pool2d_{tag}_k{k}_s{s}"
        call = lambda a: R.nn.max_pool2d(a, k, s, k // 2 if k % 2 else 0)  # noqa: E731
    else:  # concat
        h, cs = p["h"], p["cs"]
        shapes = [(1, c, h, h) for c in cs]
        name = f"concat_1x{'+'.join(map(str, cs))}x{h}x{h}"
        call = lambda *a: R.concat(list(a), axis=1)  # noqa: E731

    bb = relax.BlockBuilder()
    params = [relax.Var(f"x{i}", relax.TensorType(shape, "float32"))
              for i, shape in enumerate(shapes)]
    with bb.function("main", params):
        with bb.dataflow():
            out = bb.emit_output(call(*params))
        bb.emit_func_output(out)
    return name, bb.get()
