"""The package's structure, as the tools see it: no import cycles, parts through their public modules, lazy commands."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The parts that run in production (a node, a producer, the reconciliation); the rest is scaffolding.
RUNTIME_PARTS = ("proxy", "store", "election", "delay_service", "spark")
SCAFFOLDING = ("delayq.dev", "delayq.testing", "delayq.bench", "delayq.demo")


def modules() -> dict[str, Path]:
    """Every module of the wheel, by import name."""
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    found = {}
    for name, folder in package_dir.items():
        for path in (ROOT / folder).rglob("*.py"):
            parts = [name, *path.relative_to(ROOT / folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def module_level_imports(name: str, path: Path) -> set[str]:
    """The delayq modules ``name`` imports when it is imported (not in functions, not for type checking only)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def visit(nodes) -> None:
        for node in nodes:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                    base = f"{anchor}.{base}".rstrip(".")
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, (ast.If, ast.Try)):
                visit(node.body)
                visit(getattr(node, "orelse", []))
                for handler in getattr(node, "handlers", []):
                    visit(handler.body)

    visit(tree.body)
    return found


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: {m for m in module_level_imports(name, path) if m in known and m != name}
            for name, path in known.items()}


def test_no_import_cycles_between_delayq_modules():
    graph = import_graph()
    cycles = []
    state: dict[str, int] = {}  # 1: on the stack, 2: done

    def walk(node: str, stack: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph[node]):
            if state.get(target) == 1:
                cycles.append([*stack[stack.index(target):], target])
            elif target not in state:
                walk(target, [*stack, target])
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            walk(name, [name])
    # A package importing its own submodules is how packages are made; a cycle through other modules is not.
    real = [c for c in cycles if not all(m.startswith(c[0] + ".") or m == c[0] for m in c)]
    assert real == [], "import cycles: " + "; ".join(" -> ".join(c) for c in real)


def test_runtime_parts_import_no_scaffolding_and_other_parts_only_through_their_package():
    graph = import_graph()
    problems = []
    for name, targets in graph.items():
        part = name.split(".")[1] if name.count(".") else ""
        runtime = part in RUNTIME_PARTS or (name.count(".") == 1 and part in ("wire", "settings", "errors", "clock"))
        if not runtime:
            continue
        for target in targets:
            if target.startswith(SCAFFOLDING):
                problems.append(f"{name} imports scaffolding {target}")
            other = target.split(".")[1] if target.count(".") else ""
            if other in RUNTIME_PARTS and other != part and target.count(".") > 1:
                problems.append(f"{name} imports {target}, not the part's package delayq.{other}")
    assert problems == []


# Modules of an optional extra (pyproject's optional-dependencies), which may be missing here: without it,
# importing them must fail with one line naming the extra to install.
OPTIONAL_EXTRAS = {"delayq.quix": "quix", "delayq.proxy.quix": "quix"}


def test_every_module_imports_alone_in_a_fresh_interpreter():
    names = sorted(name for name in modules() if not name.endswith("__main__"))  # __main__ runs the CLI

    def import_alone(name: str) -> str | None:
        done = subprocess.run([sys.executable, "-c", f"import {name}"], capture_output=True, text=True, timeout=120)
        if done.returncode == 0:
            return None
        said = done.stderr.strip().splitlines()[-1]
        if name in OPTIONAL_EXTRAS and f"pip install 'delayq[{OPTIONAL_EXTRAS[name]}]'" in said:
            return None  # an optional extra this environment lacks: it says how to get it
        return f"{name}: {said}"

    with ThreadPoolExecutor(4) as pool:
        failures = [f for f in pool.map(import_alone, names) if f]
    assert failures == []


def test_delayq_imports_in_any_order_of_its_public_names():
    for order in (["Producer", "Settings", "cancel", "lookup"], ["Settings", "lookup", "Producer", "cancel"]):
        code = "import delayq\n" + "\n".join(f"delayq.{name}" for name in order)
        code += "\nfrom delayq import " + ", ".join(reversed(order))
        assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0, order


def test_a_commands_help_loads_no_rocksdb_kazoo_or_prometheus_client():
    code = ("import sys\nfrom delayq.cli import main\n"
            "for argv in (['--help'], ['produce', '--help'], ['node', '--help'], ['bench', '--help'], "
            "['soak', '--help'], ['demo', '--help'], ['reconcile', '--help']):\n"
            "    try:\n        main(argv)\n    except SystemExit:\n        pass\n"
            "print(sorted(m for m in ('rocksdict', 'kazoo', 'prometheus_client', 'pyspark') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_only_user_facing_code_imports_the_producer_proxy():
    # The wire contract lives in delayq.wire; delayq.proxy is the user's producer, not a shared library.
    users = ("delayq.proxy", "delayq.commands", "delayq.demo", "delayq.bench", "delayq.aio", "delayq.quix")
    importers = {name for name, targets in import_graph().items()
                 if any(t == "delayq.proxy" or t.startswith("delayq.proxy.") for t in targets)}
    assert {name for name in importers if not name.startswith(users)} == set()


# Modules that install a signal handler of their own: the buffer reader, whose SIGTERM raises SystemExit (which
# takes no lock) so that its consumer closes on the way out.
OWN_SIGNAL_HANDLERS = {"delayq.signals", "delayq.delay_service.reader"}


def test_signal_handlers_live_in_delayq_signals():
    # A handler that sets a threading.Event can deadlock the main thread waiting on it (delayq.signals says how):
    # every long-running command catches SIGTERM through delayq.signals, which takes no lock.
    installers = {name for name, path in modules().items()
                  if any(isinstance(node, ast.Call) and ast.unparse(node.func) == "signal.signal"
                         for node in ast.walk(ast.parse(path.read_text())))}
    assert installers - OWN_SIGNAL_HANDLERS == set()
