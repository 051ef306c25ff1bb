"""The house's layout, checked: dependencies flow one way with no circle, `eval/` and `agents/`
are rooms that import only what their docstrings allow, `tests/` mirrors them, no file or
function outgrows what a reader can hold, and each table, constant and rule of the project is
defined in one place."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("finality_gym", "agents", "eval", "train")
LAYER = {name: i for i, name in enumerate(PACKAGES)}

# Each room of eval and the rooms of eval it may import (besides itself); every module of eval is
# in one of them, but for the command table, the package's docstring and the file `inspect eval`
# loads by path.
ROOMS = {
    "grading": set(),
    "stats": {"grading"},
    "reports": {"grading", "stats"},
    "experiments": {"grading", "stats", "reports"},
    "sweeps": {"grading", "stats", "reports"},
    "models": {"grading", "stats", "reports"},
    "site": {"grading", "stats", "reports"},
    "board": {"grading", "stats", "reports", "models", "sweeps", "site"},
}
EVAL_TOP = {"__init__.py", "__main__.py", "inspect_task.py"}
# Each room of agents and the modules of agents it may import (besides its own): the sandbox only
# the spec (the repository's root, an outside spec's import path), the others nothing. The spec,
# the registry and the factory sit at the top and join them.
AGENT_ROOMS = {"sandbox": {"agents.spec"}, "learned": set(), "scripted": set(), "model": set()}
AGENTS_TOP = {"__init__.py", "spec.py", "registry.py", "factory.py"}
# The rooms of tests: each mirrors a part of the code (its `__init__` says which).
TEST_ROOMS = {"env", "grading", "sandbox", "learned", "model", "board", "site", "training"}
TESTS_TOP = {"__init__.py", "conftest.py", "test_docs.py", "test_layout.py"}
MAX_LINES, MAX_FUNCTION = 500, 80
SOURCES = ("finality_gym", "agents", "eval", "train", "tests", "benchmarks", "examples")


def _modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _imports(path: Path, module: str, is_package: bool) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([node.module] if node.module else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: {m for m in _imports(path, name, path.name == "__init__.py")
                   if m in modules and m != name}
            for name, path in modules.items()}


def test_dependencies_flow_one_way_and_have_no_circle():
    graph = _graph()
    assert "eval.grading.grader" in graph and "agents.registry" in graph  # the walk sees them
    for module, targets in graph.items():
        for target in targets:
            assert LAYER[target.split(".")[0]] <= LAYER[module.split(".")[0]], (module, target)
    state: dict[str, int] = {}

    def visit(node, stack):
        state[node] = 1
        for target in graph[node]:
            if _modules()[target].name == "__init__.py":
                continue  # a package's __init__ re-exports; its modules are the nodes that count
            if state.get(target) == 1:
                raise AssertionError(f"import circle: {' -> '.join(stack + [target])}")
            if not state.get(target):
                visit(target, stack + [target])
        state[node] = 2

    for node in graph:
        if not state.get(node):
            visit(node, [node])


def _imports_across(package: str, rooms) -> list[tuple[str, str, str]]:
    """(module, its room, target) for each import by a module in a room of `package` of a
    module of `package` outside that room (the package's `__init__` included)."""
    found = []
    for module, targets in _graph().items():
        parts = module.split(".")
        if parts[0] == package and len(parts) > 1 and parts[1] in rooms:
            found += [(module, parts[1], target) for target in targets
                      if target.split(".")[0] == package and target.split(".")[1:2] != parts[1:2]]
    return found


def test_every_module_of_eval_lives_in_a_room_that_imports_only_the_rooms_below_it():
    loose = {p.name for p in (ROOT / "eval").glob("*.py")} - EVAL_TOP
    assert not loose, f"modules of eval outside a room: {sorted(loose)}"
    rooms = {p.name for p in (ROOT / "eval").iterdir() if (p / "__init__.py").is_file()}
    assert rooms == set(ROOMS), rooms
    for module, room, target in _imports_across("eval", ROOMS):
        assert (target.split(".") + [""])[1] in ROOMS[room], \
            f"{module} imports {target}: {room} may import {sorted(ROOMS[room]) or 'no room'}"
    for room in ROOMS:  # each room says what lives there and what it may import
        doc = ast.get_docstring(ast.parse((ROOT / "eval" / room / "__init__.py").read_text()))
        assert doc and "May import" in doc, room


def test_every_module_of_agents_lives_in_a_room_that_imports_only_what_it_says():
    loose = {p.name for p in (ROOT / "agents").glob("*.py")} - AGENTS_TOP
    assert not loose, f"modules of agents outside a room: {sorted(loose)}"
    rooms = {p.name for p in (ROOT / "agents").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == set(AGENT_ROOMS), rooms
    for module, room, target in _imports_across("agents", AGENT_ROOMS):
        assert target in AGENT_ROOMS[room], \
            f"{module} imports {target}: {room} may import {sorted(AGENT_ROOMS[room]) or 'none'}"
    for room in AGENT_ROOMS:  # each room says what it may import and what imports it
        doc = ast.get_docstring(ast.parse((ROOT / "agents" / room / "__init__.py").read_text()))
        assert doc and "What it may import" in doc and "What imports it" in doc, room


# What importing a module of a room brings into the process: the host starts without the grader
# or torch; a loader's module without torch (it imports torch inside the functions that use it).
HEAVY = ("eval", "train", "torch", "stable_baselines3", "sb3_contrib", "onnxruntime", "ray")


@pytest.mark.parametrize("module", ["agents.sandbox.host", "agents.sandbox.self_test",
                                    "agents.learned.policy", "agents.learned.onnx_policy",
                                    "agents.learned.sb3_archive", "agents.learned.vecnormalize"])
def test_a_room_imports_without_the_grader_or_torch(module):
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); import {module}; "
            f"print(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r})))")
    done = subprocess.run([sys.executable, "-I", "-c", code], cwd=ROOT, capture_output=True,
                          text=True, check=True)
    assert done.stdout.strip() == "[]", (module, done.stdout, done.stderr[-500:])


def test_tests_mirror_the_rooms():
    loose = {p.name for p in (ROOT / "tests").glob("*.py")} - TESTS_TOP
    assert not loose, f"test modules outside a room: {sorted(loose)}"
    rooms = {p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert rooms == TEST_ROOMS, rooms
    for room in TEST_ROOMS:  # a package each (pytest names a test by its room), saying what
        # it tests
        doc = ast.get_docstring(ast.parse((ROOT / "tests" / room / "__init__.py").read_text()))
        assert doc, room
        assert list((ROOT / "tests" / room).glob("test_*.py")), room


def _python_files():
    for source in SOURCES:
        yield from (ROOT / source).rglob("*.py")


def test_no_file_over_500_lines_and_no_function_over_80():
    files = list(_python_files())
    assert len(files) > 100
    long_files = [f"{p.relative_to(ROOT)}: {n}" for p in files
                  if (n := p.read_text().count("\n")) > MAX_LINES]
    long_functions = [
        f"{p.relative_to(ROOT)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1}"
        for p in files for node in ast.walk(ast.parse(p.read_text()))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.end_lineno - node.lineno + 1 > MAX_FUNCTION]
    assert not long_files and not long_functions, long_files + long_functions


# A name of this list is bound at the top level of exactly one module of the project: one home
# for each table, constant and rule (its uses import it).
ONE_HOME = {
    "HEADLINE": "agents/registry.py", "GATE": "agents/registry.py",
    "FLOORS": "agents/registry.py", "CLASSES": "agents/registry.py",
    "BOOTSTRAP_SEED": "eval/stats/summary.py", "best_scripted": "eval/stats/summary.py",
    "rounded_interval": "eval/stats/summary.py", "win_share": "eval/stats/bootstrap.py",
    "money": "eval/reports/format.py", "interval": "eval/reports/format.py",
    "share": "eval/reports/format.py", "md_name": "eval/reports/format.py",
    "table": "eval/reports/format.py", "subplots": "eval/reports/figures.py",
    "SUMMARY": "eval/grading/runfolder.py", "transcript_name": "eval/grading/runfolder.py",
    "ALGORITHMS": "agents/learned/algorithms.py", "POLICY_TIMEOUT_S": "agents/sandbox/limits.py",
    "policy_timeout": "agents/sandbox/limits.py", "ChatEndpoint": "agents/model/endpoint.py",
    "TrainConfig": "train/config.py", "STATE_COLOUR": "finality_gym/frame.py",
    "check_keys": "finality_gym/records.py", "is_unprivileged_scripted": "agents/spec.py",
}


def _top_level_names(path: Path) -> set[str]:
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return names


def test_each_table_constant_and_rule_has_one_home():
    homes: dict[str, list[str]] = {name: [] for name in ONE_HOME}
    for path in _python_files():
        if path.parts[len(ROOT.parts)] == "tests":
            continue
        for name in _top_level_names(path) & set(ONE_HOME):
            homes[name].append(str(path.relative_to(ROOT)))
    assert homes == {name: [home] for name, home in ONE_HOME.items()}


def test_no_list_of_the_nine_is_typed_twice():
    """The nine scripted policies' names are listed in agents/registry.py alone (as its table of
    classes); a tuple or Makefile line naming several of them elsewhere is a second copy."""
    from agents.registry import HEADLINE
    nine = re.compile(r"\b(" + "|".join(HEADLINE) + r")\b")
    copies = []
    for path in [*_python_files(), ROOT / "Makefile"]:
        if path.parts[len(ROOT.parts)] == "tests" or path.name == "registry.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if len(set(nine.findall(line))) >= 4:
                copies.append(f"{path.relative_to(ROOT)}:{number}")
    assert not copies, copies


@pytest.mark.parametrize("helper", ["_ci", "_r", "_money", "_pct", "_interval", "_verified"])
def test_no_private_helper_is_imported_across_modules(helper):
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                names = {alias.name for alias in node.names}
                assert helper not in names, f"{path.relative_to(ROOT)} imports {helper}"
