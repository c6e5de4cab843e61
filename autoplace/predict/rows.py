"""A profile store's measurements as rows for fitting cost models, and which fitted device a
device is."""

from __future__ import annotations

from collections.abc import Mapping


def profile_rows(store, device: str | None = None) -> list[dict]:
    """The successful measurements of a profile store as rows for fitting cost models.

    Each row is a ``workloads`` row (``key``, ``op_type``, ``flops``, ``bytes_read``,
    ``bytes_written``, ``param_bytes``) plus ``device`` (fingerprint), ``device_name``,
    ``device_kind``, ``threads``, ``target``, ``latency_s`` (:attr:`Measurement.latency_s`), ``cv``,
    ``occasion_spread`` (:attr:`Measurement.occasion_spread`) and ``models`` (``{model: count}``).

    Parameters
    ----------
    store : ProfileStore
    device : str, optional
        Only this device (its profiled spec or fingerprint); default all devices.
    """
    devs = {d.fingerprint: d for d in store.devices()}
    fps = [store.device(device).fingerprint] if device is not None else list(devs)
    workloads = {w["key"]: w for w in store.workloads()}
    used_by = store.workload_models()
    rows = []
    for fp in fps:
        info = devs[fp].info
        for m in store.measurements(fp):
            if m.ok and m.latency_s and m.latency_s > 0 and m.workload in workloads:
                rows.append({**workloads[m.workload], "device": fp, "device_name": devs[fp].name,
                             "device_kind": info.get("kind", "cpu"),
                             "threads": info.get("threads"), "target": info.get("target"),
                             "latency_s": float(m.latency_s),
                             "cv": m.cv, "occasion_spread": m.occasion_spread,
                             "models": used_by.get(m.workload, {})})
    return rows


#: Fewest measurements a learned cost model is trained or evaluated on: fewer say nothing
#: about the ops it has to predict.
MIN_ROWS = 10


def check_enough_rows(rows: list, where, what: str) -> None:
    """Raise ``ValueError`` if ``rows`` (of the store at ``where``) are fewer than
    :data:`MIN_ROWS`; ``what`` is the work refused ("training a cost model")."""
    if len(rows) < MIN_ROWS:
        raise ValueError(f"only {len(rows)} measurements in {where}: profile more workloads (at "
                         f"least {MIN_ROWS}) before {what}")


def match_device(device, known: Mapping[str, Mapping]) -> str | None:
    """The fingerprint in ``known`` (fingerprint -> ``{"name", "kind", ...}``) that ``device`` is.

    ``device`` is a fingerprint or profiled spec (``"cpu:0"``), a mapping or record with a
    ``fingerprint``, or an :class:`autoplace.Device`: matched by name or ``kind:index`` spec, else
    the only known device of its kind (the rule of :class:`MeasuredCostModel`). ``None`` if none.
    """
    if device is None:
        return None
    get = device.get if isinstance(device, Mapping) else (lambda k: getattr(device, k, None))
    if isinstance(device, str):
        fp, names, kind = device, {device}, None
    else:
        fp, kind = get("fingerprint"), get("kind") or get("device_kind")
        names = {get("name"), get("device_name")}
        if kind is not None and get("index") is not None:
            names.add(f"{kind}:{get('index')}")
    if fp in known:
        return fp
    by_name = [f for f, d in known.items() if d.get("name") in names - {None}]
    if len(by_name) == 1:
        return by_name[0]
    same_kind = [f for f, d in known.items() if kind is not None and d.get("kind", "cpu") == kind]
    return same_kind[0] if len(same_kind) == 1 else None
