"""The package graph points one way: every import, also one inside a function or under
``TYPE_CHECKING``, goes from a unit (a top-level module or subpackage of ``autoplace``) to a unit
in a lower layer. Read from the bottom, the layers are the data flow."""

import ast
from collections import defaultdict
from pathlib import Path

import networkx as nx

import autoplace

# Bottom first. A unit imports only units of lower layers.
LAYERS = [
    ["_version", "backend"],      # TVM plumbing: lowering, one-device build, tensors, threads
    ["graph"],                    # the op graph and its fused kernels
    ["devices", "frontends"],
    ["solve"],                    # solvers over arrays
    ["plan", "zoo"],
    ["profile"],                  # timing on real devices, into a store
    ["predict", "tuning"],        # cost models trained on profiles; tuned kernels
    ["manual", "annotate"],
    ["run"],                      # multi-device build, stage split, pipeline executor
    ["cluster"],                  # hosts of a Ray cluster, links between them, stages as actors
    ["pricing"],                  # what the solver charges: costs, overheads, runtime devices
    ["report"],
    ["api"],
    ["pytorch"],                  # torch.compile backend and optimize_module: PyTorch's door
    ["dnn_partitioning"],         # the public benchmark's adapter, used by the CLI only
    ["__root__"],                 # autoplace/__init__.py re-exports the public surface
    ["cli"],
    ["__main__"],
]
ROOT = Path(autoplace.__file__).parent


def _unit(module: str) -> str:
    parts = module.split(".")
    return "__root__" if len(parts) == 1 else parts[1]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(root: Path = ROOT):
    """Each import of an ``autoplace`` module by a module of the package at ``root``:
    ``(importing module, imported module or package, names)``, ``names`` those that a
    ``from ... import`` takes from it (none for ``import``)."""
    for path in sorted(root.rglob("*.py")):
        name = _module_name(path, root)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [(a.name, ()) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(up + ([node.module] if node.module else []))
                names = tuple(a.name for a in node.names)
                targets = ([(f"{base}.{a}", ()) for a in names] if not node.module
                           else [(base, names)])
            else:
                continue
            for target, names in targets:
                if target.split(".")[0] == "autoplace":
                    yield name, target, names


def imports_between_units(root: Path = ROOT) -> dict[tuple[str, str], list[str]]:
    """(importing unit, imported unit) -> the modules whose imports make that edge."""
    edges = defaultdict(list)
    for name, target, _ in _imports(root):
        a, b = _unit(name), _unit(target)
        if a != b:
            edges[(a, b)].append(name)
    return edges


def imports_within_units(root: Path = ROOT) -> set[tuple[str, str]]:
    """(importing module, imported module) of the imports between two modules of one unit. A
    ``from`` import of a submodule (``from autoplace.solve import cpsat``) imports that module;
    of any other name, the module or package that defines it (a package: its ``__init__``)."""
    modules = {_module_name(p, root) for p in root.rglob("*.py")}
    edges = set()
    for name, target, names in _imports(root):
        while target not in modules and "." in target:
            target = target.rpartition(".")[0]
        subs = [f"{target}.{n}" for n in names if f"{target}.{n}" in modules]
        for b in subs + ([target] if len(subs) < len(names) or not names else []):
            if b != name and _unit(b) == _unit(name):
                edges.add((name, b))
    return edges


def cycles_within_units(edges) -> list[list[str]]:
    """The modules of each import cycle inside a unit (a strongly connected component of more
    than one module), sorted."""
    graph = nx.DiGraph(list(edges))
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def violations(edges, layers) -> list[str]:
    """Each import that goes sideways or up a layer, and each cycle, in words."""
    level = {u: k for k, units in enumerate(layers) for u in units}
    out = [f"{a} -> {b} (in {', '.join(sorted(set(mods)))}): unit not in LAYERS"
           for (a, b), mods in edges.items() if a not in level or b not in level]
    out += [f"{a} -> {b} (in {', '.join(sorted(set(mods)))}) goes up or sideways"
            for (a, b), mods in edges.items()
            if a in level and b in level and level[b] >= level[a]]
    out += [f"cycle: {' -> '.join(c)}" for c in nx.simple_cycles(nx.DiGraph(list(edges)))]
    return out


def test_every_import_goes_down_a_layer():
    edges = imports_between_units()
    assert edges, "found no imports: the walk is broken"
    assert violations(edges, LAYERS) == []


def test_every_unit_is_in_a_layer():
    units = {p.stem if p.is_file() else p.name for p in ROOT.iterdir()
             if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").exists()}
    assert units == {u for layer in LAYERS for u in layer} - {"__root__"}


def _package(root: Path, files: dict[str, str]) -> Path:
    """A package ``autoplace`` under ``root`` with a unit ``low`` and ``files`` (path relative
    to the package -> text)."""
    pkg = root / "autoplace"
    (pkg / "low").mkdir(parents=True)
    for name, text in {"__init__.py": "", "low/__init__.py": "", **files}.items():
        (pkg / name).write_text(text)
    return pkg


def test_violations_names_an_upward_import_and_a_cycle(tmp_path):
    pkg = _package(tmp_path, {"low/a.py": "def f():\n    from autoplace.high import g\n",
                              "high.py": "from autoplace.low import a\n"})
    edges = imports_between_units(pkg)
    assert set(edges) == {("low", "high"), ("high", "low")}
    found = violations(edges, [["low"], ["high"]])
    assert found[0] == "low -> high (in autoplace.low.a) goes up or sideways"
    assert found[1] in ("cycle: low -> high", "cycle: high -> low") and len(found) == 2


def test_no_module_imports_itself_through_a_cycle_inside_its_unit():
    edges = imports_within_units()
    assert ("autoplace.backend.lowering", "autoplace.backend.tuned") in edges, "walk is broken"
    assert cycles_within_units(edges) == []


def test_cycles_within_units_names_the_modules_of_a_cycle(tmp_path):
    pkg = _package(tmp_path, {
        "low/__init__.py": "from autoplace.low.a import f\n",
        "low/a.py": "def f():\n    from autoplace.low import b\n",
        "low/b.py": "from autoplace.low.c import h\n",
        "low/c.py": "from autoplace.low.a import f\nh = 1\n",
        "high.py": "from autoplace.low import a\nfrom autoplace.low.b import h\n"})
    edges = imports_within_units(pkg)
    assert edges == {("autoplace.low", "autoplace.low.a"), ("autoplace.low.a", "autoplace.low.b"),
                     ("autoplace.low.b", "autoplace.low.c"), ("autoplace.low.c", "autoplace.low.a")}
    assert cycles_within_units(edges) == [["autoplace.low.a", "autoplace.low.b", "autoplace.low.c"]]
    (pkg / "low" / "c.py").write_text("h = 1\n")
    assert cycles_within_units(imports_within_units(pkg)) == []
