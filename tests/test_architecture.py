"""The architecture of docs/design.md §4 and §6, checked: no import cycle between modules or
between the package's parts, the layering rules, the registries (every entry the package tree
defines is registered and offered by the scenario), short functions, small classes and
modules."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
from pathlib import Path
from types import ModuleType

import pytest

import fedpenalty
from fedpenalty import coordinator, kinds, models
from fedpenalty.config import load_scenario, resolve
from fedpenalty.coordinator.algorithms import ALGORITHMS
from fedpenalty.coordinator.base import ChainAlgorithm, ReleaseAlgorithm
from fedpenalty.coordinator.transport_base import Transport
from fedpenalty.coordinator.transports import TRANSPORTS
from fedpenalty.kinds import KINDS, QueryKind, query_kind
from fedpenalty.models import HIERARCHICAL, MODELS, Model

ROOT = Path(fedpenalty.__file__).parent
#: The driver, which runs every kernel (docs/design.md §4).
DRIVER = "fedpenalty.coordinator.driver"
#: Largest module (lines; generated protocol code aside) and class (lines) of the package.
MAX_MODULE_LINES, MAX_CLASS_LINES = 800, 400
#: The leaves every layer may import; they import no other part of the package.
LEAVES = ("errors", "models", "privacy")
#: Just above the leaves: the query kinds (``common`` imports their registry).
KINDS_LAYER = "kinds"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> list[str]:
    """The fedpenalty modules one ``from ... import ...`` statement loads."""
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - node.level + 1]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    if not prefix.startswith("fedpenalty"):
        return []
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def import_graph() -> dict[str, set[str]]:
    """Module → the fedpenalty modules it imports when it is imported (module level, outside
    ``if TYPE_CHECKING:`` blocks; imports inside functions run later and are left out)."""
    paths = {_module(p): p for p in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for module, path in paths.items():
        tree = ast.parse(path.read_text())
        targets: set[str] = set()
        for node in tree.body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            for child in (
                ast.walk(node) if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) else ()
            ):
                if isinstance(child, ast.Import):
                    targets |= {a.name for a in child.names if a.name.startswith("fedpenalty")}
                elif isinstance(child, ast.ImportFrom):
                    targets |= set(_resolve(module, path.name == "__init__.py", child))
        # importing a.b.c first imports the packages a.b (unless the importer is inside them)
        parents = {".".join(t.split(".")[:i]) for t in targets for i in range(2, t.count(".") + 1)}
        own = {".".join(module.split(".")[:i]) for i in range(1, module.count(".") + 2)}
        graph[module] = {t for t in targets | (parents - own) if t in paths and t != module}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in list(graph):
        if v not in index:
            visit(v)
    return found


def kernel_modules() -> set[str]:
    """The kernel layer, pure numpy over the oracle interface (docs/design.md §4): the modules
    of every registered chain algorithm's kernel and state, the driver, and every coordinator
    module they import."""
    graph = import_graph()
    chains = [a for a in ALGORITHMS.values() if isinstance(a, ChainAlgorithm)]
    todo = [DRIVER, *(m for a in chains for m in (a.build.__module__, a.state.__module__))]
    found: set[str] = set()
    while todo:
        module = todo.pop()
        if module not in found:
            found.add(module)
            todo += [t for t in graph.get(module, ()) if t.startswith(coordinator.__name__)]
    return found - {coordinator.__name__}


def _part(module: str) -> str:
    """The part of the package a module belongs to: ``fedpenalty.owner``, ``fedpenalty.config``."""
    return ".".join(module.split(".")[:2])


def test_no_import_cycle_between_modules():
    assert _cycles(import_graph()) == []


def test_no_import_cycle_between_the_parts_of_the_package():
    parts: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        if module == "fedpenalty":
            continue
        parts.setdefault(_part(module), set()).update(
            _part(t) for t in targets if _part(t) != _part(module)
        )
    parts.pop("fedpenalty", None)
    for targets in parts.values():
        targets.discard("fedpenalty")
    assert _cycles(parts) == []


def test_the_cycle_check_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_kernel_layer_is_what_the_registry_runs():
    kernels = kernel_modules()
    assert DRIVER in kernels
    for name, algorithm in ALGORITHMS.items():
        if isinstance(algorithm, ChainAlgorithm):
            assert algorithm.build.__module__ in kernels, name
    assert all(m.startswith(f"{coordinator.__name__}.") for m in kernels)


def test_layers_point_one_way():
    graph = import_graph()
    kernels = kernel_modules()
    for module, targets in graph.items():
        parts = {_part(t) for t in targets}
        if module.startswith("fedpenalty.owner"):
            assert "fedpenalty.coordinator" not in parts, f"{module} imports the coordinator"
        if module in kernels:
            assert "fedpenalty.owner" not in parts, f"kernel {module} imports the owner side"
        if _part(module) in (f"fedpenalty.{leaf}" for leaf in LEAVES):
            allowed = {f"fedpenalty.{leaf}" for leaf in LEAVES}
            assert parts <= allowed, f"leaf {module} imports {parts - allowed}"
        if _part(module) == f"fedpenalty.{KINDS_LAYER}":
            allowed = {f"fedpenalty.{leaf}" for leaf in (*LEAVES, KINDS_LAYER)}
            assert parts <= allowed, f"query kind {module} imports {parts - allowed}"


@pytest.mark.parametrize("name", sorted(ALGORITHMS))
def test_registered_algorithms_take_the_settings_they_declare(name):
    algorithm = ALGORITHMS[name]
    assert algorithm.name == name
    if isinstance(algorithm, ChainAlgorithm):
        parameters = inspect.signature(algorithm.build).parameters
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
        for key in algorithm.settings:
            assert takes_any or key in parameters, f"{name}.build does not take sampler.{key}"
            assert key in resolve({})["sampler"], (
                f"{name} declares sampler.{key}, which the scenario has not"
            )
        ledger_names = {kind.ledger_name for kind in KINDS.values()}
        assert algorithm.query is None or algorithm.query in ledger_names
    else:
        assert isinstance(algorithm, ReleaseAlgorithm)


#: algorithms that refuse the embedded default model → the model they are offered with
ONE_MODEL = {"objpert": "logistic", "private_gibbs": "linear_regression"}


def test_registries_are_what_the_scenario_offers():
    for name, entry in ALGORITHMS.items():  # a hierarchical sampler with a hierarchical model
        model = {"model": {"name": "random_intercept"}} if _hierarchical(entry) else {}
        model = {"model": {"name": ONE_MODEL[name]}} if name in ONE_MODEL else model
        assert resolve({**model, "sampler": {"algorithm": name}})["sampler"]["algorithm"] == name
    for name in TRANSPORTS:
        assert resolve({"run": {"transport": name}})["run"]["transport"] == name
    for name in [*MODELS, *HIERARCHICAL]:
        assert load_scenario(None, {"model.name": name})["model"]["name"] == name
    # every query kind is the one some offered algorithm asks its owners for, by default,
    # with its per-record clip set or with its release chosen (``ChainAlgorithm.asks``)
    asked = {a.query for a in ALGORITHMS.values() if isinstance(a, ChainAlgorithm)}
    clipped = {"sampler": {"ratio_clip": 1.0, "release": "laplace"}}
    for name, a in ALGORITHMS.items():
        if isinstance(a, ChainAlgorithm):
            model = {"model": {"name": "random_intercept"}} if a.hierarchical else {}
            model = {"model": {"name": ONE_MODEL[name]}} if name in ONE_MODEL else model
            section = {"sampler": {**clipped["sampler"], "algorithm": name}}
            sampler = resolve({**model, **section})
            asked |= {query_kind(kind).ledger_name for kind in a.asks(sampler["sampler"])}
    assert {kind.ledger_name for kind in KINDS.values()} <= asked


def _hierarchical(entry: object) -> bool:
    return isinstance(entry, ChainAlgorithm) and entry.hierarchical


def _defined(package: ModuleType, cls: type) -> dict[str, list[str]]:
    """Module → the names of the ``cls`` instances defined (not imported) at its top level, in
    every module of ``package``."""
    found: dict[str, list[str]] = {}
    for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
        module = importlib.import_module(info.name)
        names = [
            name
            for name, value in vars(module).items()
            if isinstance(value, cls) and name in _assigned(module)
        ]
        if names:
            found[info.name] = names
    return found


def _assigned(module: ModuleType) -> set[str]:
    """The names a module's own top-level statements assign."""
    tree = ast.parse(Path(module.__file__ or "").read_text())
    return {
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }


def _subclasses(package: ModuleType, base: type) -> set[type]:
    """The concrete subclasses of ``base`` defined in the modules of ``package``."""
    for info in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
        importlib.import_module(info.name)
    todo, found = [base], set()
    while todo:
        for sub in todo.pop().__subclasses__():
            todo.append(sub)
            if sub.__module__.startswith(f"{package.__name__}.") and not inspect.isabstract(sub):
                found.add(sub)
    return found


def test_every_entry_the_package_defines_is_registered():
    """The registries list what the package tree holds: no algorithm, transport, model or
    query kind is defined and left out of its registry (docs/design.md §6)."""
    registered_algorithms = set(map(id, ALGORITHMS.values()))
    for module, names in _defined(coordinator, ChainAlgorithm | ReleaseAlgorithm).items():
        for name in names:
            entry = getattr(importlib.import_module(module), name)
            assert id(entry) in registered_algorithms, f"{module}.{name} is not in ALGORITHMS"
    for module, names in _defined(coordinator, Transport).items():
        for name in names:
            entry = getattr(importlib.import_module(module), name)
            assert TRANSPORTS.get(entry.name, None) is not None, f"{module}.{name}"
            assert TRANSPORTS[entry.name].launch is entry.launch, f"{module}.{name}"
    assert _subclasses(models, Model) == set(MODELS.values())
    assert _subclasses(kinds, QueryKind) == {type(kind) for kind in KINDS.values()}


def test_modules_and_classes_are_small():
    """No module over 800 lines (generated protocol code aside) and no class over 400."""
    big = []
    for path in ROOT.rglob("*.py"):
        if path.parent.name == "proto" and "_pb2" in path.name:
            continue
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            big.append(f"{path.relative_to(ROOT)} ({len(text.splitlines())} lines)")
        for node in ast.walk(ast.parse(text)):
            lines = getattr(node, "end_lineno", 0) - getattr(node, "lineno", 0) + 1
            if isinstance(node, ast.ClassDef) and lines > MAX_CLASS_LINES:
                big.append(f"{path.relative_to(ROOT)}:{node.name} ({lines} lines)")
    assert big == []


def test_functions_are_short():
    """No function body over 50 lines (docstring excluded) in the package."""
    long = []
    for path in ROOT.rglob("*.py"):
        if "proto" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                first = node.body[0]
                docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                start = first.end_lineno + 1 if docstring and len(node.body) > 1 else first.lineno
                if node.end_lineno - start + 1 > 50:
                    long.append(
                        f"{path.relative_to(ROOT)}:{node.name} ({node.end_lineno - start + 1} "
                        f"lines)"
                    )
    assert long == []
