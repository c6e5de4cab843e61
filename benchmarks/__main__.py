"""``python -m benchmarks``: the benchmarks, one line each; ``python -m benchmarks NAME [ARGS]``
runs ``benchmarks/NAME.py`` (or ``NAME.sh``) with ARGS, as running the script itself does.

A script runs as ``__main__`` with this folder first on ``sys.path`` (its helpers, ``_models``
and ``_timing``, import by their bare names) and ``sys.argv[0]`` its path, so the scripts that
start themselves again in a child process (``[sys.executable, __file__, ...]``) still do.
"""

from __future__ import annotations

import ast
import os
import runpy
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def benchmarks() -> dict[str, Path]:
    """Each benchmark's name and script: the ``*.py`` and ``*.sh`` here, helpers (``_*``) left out."""
    scripts = sorted([*HERE.glob("*.py"), *HERE.glob("*.sh")])
    return {p.stem: p for p in scripts if not p.stem.startswith("_")}


def summary(path: Path) -> str:
    """A script's first docstring line (a shell script's: its first comment line)."""
    if path.suffix == ".py":
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        return doc.strip().splitlines()[0] if doc.strip() else ""
    comments = [line for line in path.read_text().splitlines()[1:] if line.startswith("#")]
    return comments[0].lstrip("#").strip() if comments else ""


def listing() -> str:
    """The usage line, then every benchmark with its summary."""
    found = benchmarks()
    width = max(map(len, found))
    return "\n".join(["usage: python -m benchmarks NAME [ARGS]   (NAME --help: its options)", ""]
                     + [f"  {name:<{width}}  {summary(path)}" for name, path in found.items()]
                     + ["", "What each prints and how long it takes: benchmarks/README.md"])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(listing())
        return 0
    name, rest = argv[0], argv[1:]
    path = benchmarks().get(Path(name).stem)
    if path is None:
        print(f"no benchmark {name!r}; `python -m benchmarks` lists them", file=sys.stderr)
        return 2
    if path.suffix == ".sh":
        os.execvp("bash", ["bash", str(path), *rest])
    sys.argv = [str(path), *rest]
    sys.path.insert(0, str(HERE))
    runpy.run_path(str(path), run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
