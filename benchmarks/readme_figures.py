"""Make the README's figures from the commands it shows, so that they cannot drift from them.

Run: ``.venv/bin/python -m benchmarks readme_figures [--check]``

Each figure is a command the README shows, run as a user runs it (``python -m autoplace ...``
with ``--json``): its image is copied into ``docs/img/`` and its numbers written between
``<!-- figure:NAME -->`` and ``<!-- /figure:NAME -->`` in README.md. The numbers come from the
costs the command picks on this machine (the shipped profile where the machine matches it, else
roofline estimates); the line printed for each figure says which. ``--check`` writes nothing and
exits 1 when the README says something else than the commands give (or no longer shows them).
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"


def _inception_numbers(report: dict) -> str:
    # The baselines include the call from Python; the solver's schedule does not.
    call = (report.get("delivery") or {}).get("call_s", 0.0)
    single = min(v for k, v in report["baselines_s"].items() if k.startswith("only ")) - call
    # The solver's plans of equal value differ in their copies from run to run: the build's
    # prediction is given as a comparison only, so that the figure is the same every run.
    # Equal to the µs the figure shows: the same plan, whatever the rounding of its sums.
    build = report["predicted_s"] - call
    than = ("as fast as" if abs(build - single) < 0.5e-6 else
            "slower than" if build > single else "faster than")
    return (f"the schedule takes {report['solver_s'] * 1e6:.0f} µs against "
            f"{single * 1e6:.0f} µs on one device, and its build is predicted {than} one "
            "device")


#: name -> (the command as the README shows it, the file it writes, where the README's image
#: is, what the README says of it)
FIGURES = {
    "inception": ("autoplace report --model zoo:inception --device cpu:0:generic "
                  "--device cpu:1:generic --no-calibrate --no-guard --out report/", "gantt.png", "docs/img/inception_gantt.png",
                  _inception_numbers),
}


def run(command: str, out: Path) -> dict:
    """Run a README command (``--out`` pointed at ``out``, with ``--json``); its JSON report."""
    args = command.split()[1:]
    args[args.index("--out") + 1] = str(out)
    r = subprocess.run([sys.executable, "-m", "autoplace", *args, "--json"], cwd=REPO,
                       capture_output=True, text=True, timeout=600)
    if r.returncode != 0:
        raise SystemExit(f"{command}: exit {r.returncode}\n{r.stderr}")
    return json.loads(r.stdout)


def marked(text: str, name: str) -> re.Match:
    """The README's text between the markers of figure ``name``."""
    m = re.search(rf"<!-- figure:{name} -->(.*?)<!-- /figure:{name} -->", text, re.S)
    if m is None:
        raise SystemExit(f"README.md has no <!-- figure:{name} --> ... <!-- /figure:{name} -->")
    return m


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 if the README says something else")
    args = parser.parse_args(argv)
    text, stale = README.read_text(), []
    for name, (command, made, image, numbers) in FIGURES.items():
        if f"`{command}`" not in text:
            raise SystemExit(f"README.md no longer shows `{command}`: update FIGURES")
        with tempfile.TemporaryDirectory() as tmp:
            report = run(command, Path(tmp))
            said = numbers(report)
            if not args.check:
                shutil.copyfile(Path(tmp) / made, REPO / image)
        m = marked(text, name)
        print(f"{name}: {said} (costs: {report['cost_model']})")
        if m.group(1) != said:
            stale.append(f"{name}: README says {m.group(1)!r}, the command gives {said!r}")
            text = text[:m.start(1)] + said + text[m.end(1):]
    if args.check:
        print("\n".join(stale) or "README.md says what the commands give")
        return 1 if stale else 0
    README.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
