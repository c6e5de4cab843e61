"""``autoplace train`` and ``autoplace evaluate``: fit and score the learned cost model."""

from __future__ import annotations

import argparse
import json
import sys

EPILOG = """examples:
  autoplace train --db prof.db --out cpu_model.json
  autoplace evaluate --db prof.db --device cpu:0

In Python: autoplace.load_cost_model("cpu_model.json").predict(graph, device)
"""


def _cmd_train(args) -> int:
    from autoplace.predict.rows import check_enough_rows, profile_rows
    from autoplace.predict.learned import XGBCostModel
    from autoplace.profile.store import ProfileStore

    with ProfileStore(args.db, readonly=True) as store:
        rows = profile_rows(store, args.device)
    check_enough_rows(rows, args.db, "training a cost model; nothing was written")
    model = XGBCostModel().fit(rows)
    model.save(args.out)
    print(f"wrote {args.out}: XGBoost cost model (a point prediction and P10/P50/P90) trained on "
          f"{len(rows)} measurements of {len(model.devices_)} device(s), "
          f"{len(model.op_types_)} op types")
    return 0


def _cmd_evaluate(args) -> int:
    from autoplace.predict.evaluate import compiled_times, evaluate, format_table, to_json
    from autoplace.profile.store import ProfileStore

    with ProfileStore(args.db, readonly=True) as store:
        compiled, note = (None, "whole models not timed (--no-whole)") if args.no_whole \
            else compiled_times(store, args.device)
        print(note, file=sys.stderr)
        result = evaluate(store, args.device, compiled=compiled)
    print(json.dumps(to_json(result), indent=1) if args.json else format_table(result))
    return 0


def register_cli(sub) -> None:
    """Add the ``train`` and ``evaluate`` subcommands to an argparse subparsers object."""
    p = sub.add_parser("train", help="fit the learned cost model on a profile store",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="SQLite profile store (autoplace profile)")
    p.add_argument("--out", required=True, help="where to write the model (JSON)")
    p.add_argument("--device", help="only this device's measurements (spec or fingerprint)")
    p.set_defaults(func=_cmd_train)

    p = sub.add_parser("evaluate", help="score the learned cost model on held-out measurements",
                       epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", required=True, help="SQLite profile store (autoplace profile)")
    p.add_argument("--device", help="only this device's measurements (spec or fingerprint)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--no-whole", action="store_true",
                   help="do not compile and time the store's zoo models whole (then the "
                        "whole-model error is not measured; the sum-of-ops error still is)")
    p.set_defaults(func=_cmd_evaluate)
