"""A latency benchmark's measured times against what the profiles given predict now.

Run: PYTHONPATH=. .venv/bin/python benchmarks/recost_latency.py RESULTS.json --profile FILE ...

``RESULTS.json`` is a ``latency_plans.py --json`` report (from another machine, say a GPU
session's). Each model is planned again over the report's devices (``check_devices=False``:
they need not be here) with the measured profiles given (``--profile``, as ``latency_plans.py``
takes them) and without tuning records; the table puts each single device's prediction, then
and now, beside the time the report measured for it, and says which devices the plan takes
now. What changed between the two predictions is the profiles: new overheads, new rows.
"""

from __future__ import annotations

import argparse
import json
import logging
import re

import autoplace
from autoplace import zoo
from autoplace.predict import MeasuredCostModel
from autoplace.profile import DeviceProfile
from _timing import aligned


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="a latency_plans.py --json report")
    ap.add_argument("--profile", action="append", required=True,
                    help="measured profile JSON for the devices of its kind (repeatable)")
    args = ap.parse_args(argv)
    logging.disable(logging.WARNING)
    report = json.load(open(args.results))
    # latency_plans.py names a device of spec KIND:N "KINDN"
    devices = [autoplace.Device.from_spec(re.sub(r"(\d+)$", r":\1", n))
               for n in report["devices"]]
    model = MeasuredCostModel([DeviceProfile.load(p) for p in args.profile])
    table = [["model", "plan now", *(f"{d.name} {what}" for d in devices
                                     for what in ("pred then", "pred now", "meas", "m/p then",
                                                  "m/p now"))]]
    for row in report["rows"]:
        if "error" in row:
            continue
        m = zoo.load(row["model"].removeprefix("zoo:"))
        res = autoplace.optimize(m.mod, devices, cost_model=model, check_devices=False, db=None)
        cells = [row["model"], "+".join(d.name for d in res.plan.used_devices())]
        for d in devices:
            key = f"only {d.name}"
            then, now = row["predicted_ms"][key], res.baselines[key] * 1e3
            meas = row["measured_ms"][key]
            cells += [f"{then:.3f}", f"{now:.3f}", f"{meas:.3f}", f"{meas / then:.2f}",
                      f"{meas / now:.2f}"]
        table.append(cells)
    print(aligned(table, "ms; pred then: the report's prediction; pred now: with the profiles "
                         "given; m/p: measured / predicted."))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
