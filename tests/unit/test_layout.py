"""The package's layout: one subpackage per pipeline stage, imports running one way; the tests'
layout: unit tests mirroring the package apart from scenario tests."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src" / "transformer_nmt"
TESTS = Path(__file__).resolve().parents[1]

# Layers from the top (may import anything below) to the bottom (imports nothing of ours).
LAYERS = [
    {"cli"},
    {"plot"},
    {"evaluate", "interop"},
    {"train"},
    {"decode"},
    {"run"},
    {"checkpoint"},
    {"model", "data"},
    {"config", "choices", "fileio", "runtime", "errors"},
]


def _module_name(path: Path) -> str:
    parts = path.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Modules of ours that ``path`` imports (at module level or inside functions)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "transformer_nmt":
                out.update(f"transformer_nmt.{a.name}" for a in node.names)
            elif node.module.startswith("transformer_nmt."):
                out.add(node.module)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name.startswith("transformer_nmt."))
    return out


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for dep in _imports(path):
            # "from transformer_nmt.train import distributed" names a module or a package
            deps.add(dep if dep in modules else dep.rsplit(".", 1)[0])
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return stack[stack.index(dep):] + [dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_no_import_cycle_between_modules():
    assert _cycle(_graph()) is None, " -> ".join(_cycle(_graph()) or [])


def test_cycle_finder_finds_a_planted_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_imports_run_one_way_between_stages():
    """cli -> plot -> evaluate, interop -> train -> decode -> run -> checkpoint -> model, data
    -> shared."""
    layer_of = {stage: i for i, layer in enumerate(LAYERS) for stage in layer}
    wrong = []
    for module, deps in _graph().items():
        here = layer_of.get(_stage(module))
        for dep in deps:
            there = layer_of.get(_stage(dep))
            if here is None or there is None or _stage(dep) == _stage(module):
                continue
            if there < here:
                wrong.append(f"{module} -> {dep}")
    assert not wrong, wrong


def test_every_subpackage_is_listed_in_pyproject():
    text = (SRC.parents[1] / "pyproject.toml").read_text(encoding="utf-8")
    packages = {_module_name(p.parent / "__init__.py") for p in SRC.rglob("__init__.py")}
    assert packages, "no package found"
    missing = sorted(p for p in packages if f'"{p}"' not in text)
    assert not missing, f"add to [tool.setuptools] packages: {missing}"


def test_no_module_over_650_lines_outside_the_model():
    long = {_module_name(p): n for p in SRC.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 650
            and _stage(_module_name(p)) != "model"}
    assert not long, long


def test_unit_test_folders_mirror_the_package():
    """tests/unit/<package>/ for a subpackage of src/transformer_nmt (scripts/ for scripts/)."""
    folders = {p.name for p in (TESTS / "unit").iterdir()
               if p.is_dir() and p.name != "__pycache__"}
    packages = {p.parent.name for p in SRC.glob("*/__init__.py")}
    assert folders, "no unit test folder found"
    assert folders <= packages | {"scripts"}, sorted(folders - packages - {"scripts"})


def test_every_test_module_is_a_unit_or_a_scenario_test_in_a_package():
    """Test modules live under tests/unit or tests/scenario, in folders with an __init__.py
    (two modules of one basename in different folders import side by side)."""
    stray = sorted(p.name for p in TESTS.glob("test_*.py"))
    assert not stray, f"move into tests/unit/<package>/ or tests/scenario/: {stray}"
    modules = [p for kind in ("unit", "scenario") for p in (TESTS / kind).rglob("test_*.py")]
    assert modules, "no test module found"
    no_package = sorted(str(p.parent.relative_to(TESTS)) for p in modules
                        if not (p.parent / "__init__.py").is_file())
    assert not no_package, f"add an __init__.py to: {sorted(set(no_package))}"
