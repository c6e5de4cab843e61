"""Test-retest noise of a profile: the same workloads measured in two campaigns, side by side.

Run: .venv/bin/python -m benchmarks retest_noise --db A.db --db B.db [--device cpu:0]

A cost model is scored against measured labels, so the share of workloads whose second
measurement lands within +-10 % of the first is the most any model can score on that metric
against these labels (the first measurement would be a perfect predictor of the true latency and
still miss by this much). Printed overall, per latency band and per op type.
"""

import argparse

import numpy as np

from autoplace.predict.features import parse_key
from autoplace.profile import ProfileStore


def _times(path, device):
    with ProfileStore(path) as store:
        fp = store.device(device).fingerprint
        return {m.workload: (m.latency_s, parse_key(m.workload)[0]) for m in store.measurements(fp)
                if m.ok}


def _row(label, ratio):
    err = np.abs(ratio - 1)
    print(f"{label:<22}{ratio.size:>6}{np.median(err) * 100:>10.1f}{np.mean(err) * 100:>9.1f}"
          f"{np.mean(err <= 0.10) * 100:>9.1f}{np.mean(err <= 0.25) * 100:>9.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", action="append", required=True, help="two profile stores (SQLite)")
    ap.add_argument("--device", default="cpu:0", help="device name or fingerprint in both")
    args = ap.parse_args()
    if len(args.db) != 2:
        ap.error("give exactly two --db")
    first, second = (_times(p, args.device) for p in args.db)
    keys = sorted(set(first) & set(second))
    if not keys:
        raise SystemExit("the two stores share no measured workload on that device")
    t1 = np.array([first[k][0] for k in keys])
    ratio = np.array([second[k][0] for k in keys]) / t1
    ops = np.array([first[k][1] for k in keys])
    print(f"{len(keys)} workloads measured in both ({len(first)} and {len(second)} in each)")
    print(f"{'':<22}{'n':>6}{'median %':>10}{'mean %':>9}{'<=10 %':>9}{'<=25 %':>9}"
          "   (|second / first - 1|)")
    _row("all", ratio)
    for lo, hi, label in ((0, 10e-6, "first < 10 us"), (10e-6, 100e-6, "10-100 us"),
                          (100e-6, 1e-3, "100 us - 1 ms"), (1e-3, np.inf, ">= 1 ms")):
        sel = (t1 >= lo) & (t1 < hi)
        if sel.any():
            _row(label, ratio[sel])
    for op in sorted(set(ops.tolist())):
        _row(op, ratio[ops == op])
    print(f"second/first over all: median {np.median(ratio):.3f} (a drift of the machine "
          "between the campaigns shows here)")


if __name__ == "__main__":
    main()
