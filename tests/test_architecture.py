"""The shape of the package: layers, each a folder, each importing only from the layers below it (imports for type
hints counted); no import cycles; nothing outside ``store.py`` touches a private part of the Store; every package's
docstring names its modules; SQL text is written only in ``trajstore/query/sql.py``; and the wheel installs nothing
at top level but ``trajstore`` (the service inside it as ``trajstore.api``)."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "trajstore"


def modules() -> dict[str, Path]:
    """Every module of the package (the service through the ``trajstore/api`` link), by dotted name."""
    out = {}
    for folder, dirs, files in os.walk(PACKAGE, followlinks=True):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if name.endswith(".py"):
                path = Path(folder) / name
                parts = path.relative_to(ROOT).with_suffix("").parts
                out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def imports(path: Path, name: str, known: set[str], *, type_hints: bool = False) -> set[str]:
    """The trajstore modules ``path`` imports, at top level or inside functions (with ``type_hints``, under
    TYPE_CHECKING too): for ``from package import module`` the module, not the package."""
    found: set[str] = set()
    is_package = path.name == "__init__.py"

    def visit(node: ast.AST) -> None:
        if _type_checking(node) and not type_hints:
            return
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("trajstore"))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = name.split(".") if is_package else name.split(".")[:-1]
                base = ".".join(parent[:len(parent) - node.level + 1] + ([base] if base else []))
            if base.startswith("trajstore"):
                subs = {f"{base}.{a.name}" for a in node.names} & known
                found.update(subs if len(subs) == len(node.names) else subs | {base})
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found


def graph(*, type_hints: bool = False) -> dict[str, set[str]]:
    mods = modules()
    return {name: {m for m in imports(path, name, set(mods), type_hints=type_hints) if m in mods and m != name}
            for name, path in mods.items()}


# The layers, lowest first (docs/architecture.md draws them): a module imports from its own layer and those below.
LAYERS = [
    ("base", ["trajstore.__about__", "trajstore.errors", "trajstore.settings", "trajstore.schema", "trajstore.retry",
              "trajstore.durations"]),
    ("the stored format and the log", ["trajstore.storage"]),
    ("the writer", ["trajstore.write"]),
    ("reading one committed version", ["trajstore.query"]),
    ("training loaders", ["trajstore.loaders"]),
    ("operations that change a store", ["trajstore.operations"]),
    ("the store", ["trajstore.store"]),
    ("what uses a store", ["trajstore.rollout", "trajstore.integrations", "trajstore.export", "trajstore.remote",
                           "trajstore.torch", "trajstore.torch_workers", "trajstore.ray", "trajstore.committer"]),
    ("the public API", ["trajstore"]),
    ("the service and the CLI", ["trajstore.api", "trajstore.cli"]),
]


def layer_of(module: str) -> int:
    """The index of ``module``'s layer (its longest matching prefix)."""
    best, index = -1, -1
    for i, (_, prefixes) in enumerate(LAYERS):
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best:
                best, index = len(p), i
    assert index >= 0, f"{module} is in no layer: add it to LAYERS (and to docs/architecture.md)"
    return index


def test_each_layer_imports_only_from_below() -> None:
    wrong = [f"{name} ({LAYERS[layer_of(name)][0]}) imports {dep} ({LAYERS[layer_of(dep)][0]})"
             for name, deps in graph(type_hints=True).items() for dep in sorted(deps)
             if layer_of(dep) > layer_of(name)]
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_layer_check_would_see_a_wrong_import() -> None:  # the check above can fail
    assert layer_of("trajstore.storage.log") < layer_of("trajstore.query.engine") < layer_of("trajstore.store")
    assert layer_of("trajstore") < layer_of("trajstore.api.app") and layer_of("trajstore.store") < layer_of("trajstore")


def test_the_library_never_imports_the_service_or_the_cli() -> None:
    for name, deps in graph().items():
        if not name.startswith(("trajstore.cli", "trajstore.api")):
            assert not {d for d in deps if d.startswith(("trajstore.api", "trajstore.cli"))}, name
        if name.startswith("trajstore.api"):
            assert not {d for d in deps if d.startswith("trajstore.cli")}, name


def _store_private_names() -> set[str]:
    """The private methods and attributes of :class:`trajstore.store.Store`."""
    tree = ast.parse((PACKAGE / "store.py").read_text())
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Store")
    names = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
    names |= {t.attr for n in ast.walk(cls) if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_nothing_outside_the_store_touches_its_private_parts() -> None:
    private = _store_private_names()
    offenders = []
    for name, path in modules().items():
        if name == "trajstore.store":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                holder = ast.unparse(node.value)
                if node.attr in private or re.search(r"(^|\.|_)(store|pinned|served)$", holder):
                    offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}: {holder}.{node.attr}")
    assert not offenders, "private parts of the Store used outside store.py:\n" + "\n".join(offenders)


def test_every_package_docstring_names_its_modules() -> None:
    missing = []
    for folder in [p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file() and p.name != "api"]:
        text = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        dotted = f"trajstore.{folder.name}"
        missing += [f"{dotted}.{m.stem}" for m in folder.glob("*.py") if not m.name.startswith("__")
                    and not re.search(rf"{re.escape(dotted)}\.{m.stem}[`.]", text)]
    assert not missing, f"package docstrings that do not name their modules: {missing}"


def test_no_import_cycles() -> None:
    g = graph()
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(g[node]):
            if state.get(dep) == 1:
                cycle = path[path.index(dep):] + [dep] if dep in path else [node, dep]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if dep not in state:
                visit(dep, path + [dep])
        state[node] = 2

    for node in sorted(g):
        if node not in state:
            visit(node, [node])


def test_nothing_imports_a_top_level_api_package() -> None:
    for root in (PACKAGE, ROOT / "api", ROOT / "tests", ROOT / "benchmarks"):
        for path in root.rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
                assert not [n for n in names if n == "api" or n.startswith("api.")], path


SQL = re.compile(r"\b(SELECT\b[\s\S]*\bFROM|CREATE\s+(TEMP|TABLE|VIEW|OR)|DESCRIBE\s|SET\s+\w+\s*=|INSERT\s+INTO|"
                 r"\bWHERE\s|\bIN\s*\(|ORDER\s+BY|LIMIT\s+\{)")
# Strings that show SQL to a person (help and examples), not SQL that trajstore runs.
EXAMPLES = {"trajstore/cli/parser.py", "api/routes/sql.py"}


def _strings(tree: ast.AST) -> list[str]:
    """String constants and f-string parts, docstrings left out."""
    docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                  if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
                  and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            out.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
    return out


# DuckDB's SQL, and the decoding SQL in Spark's dialect (what Spark users run; nothing trajstore runs itself)
SQL_MODULES = ("trajstore/query/sql.py", "trajstore/query/spark_sql.py")


def test_sql_is_written_only_in_the_sql_module() -> None:
    offenders = []
    for path in modules().values():
        rel = str(path.relative_to(ROOT)).replace("trajstore/api/", "api/")
        if rel in SQL_MODULES or rel in EXAMPLES:
            continue
        offenders += [f"{rel}: {s[:60]!r}" for s in _strings(ast.parse(path.read_text())) if SQL.search(s)]
    assert not offenders, f"SQL text outside {SQL_MODULES}:\n" + "\n".join(offenders)


def test_the_sql_check_would_see_sql() -> None:  # the check above can fail
    assert SQL.search("SELECT episode_id FROM episodes") and SQL.search(f"x WHERE {'y'}")
    assert not SQL.search("select the columns from a table") and not SQL.search("where the data is")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(ROOT)],
                   check=True, capture_output=True, timeout=600)
    return next(out.glob("trajstore-*.whl"))


def test_the_wheel_installs_only_trajstore(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names} == {"trajstore", wheel.name.split("-py")[0] + ".dist-info"}
    assert {"trajstore/api/app.py", "trajstore/api/dashboard/page.html", "trajstore/_schemas/step.v1.json",
            "trajstore/py.typed"} <= set(names)


def test_the_installed_service_imports_as_trajstore_api(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)],
                   check=True, capture_output=True, timeout=300)
    code = ("import sys, importlib.machinery, trajstore.api.app, trajstore.cli; print(trajstore.api.app.__file__); "
            "print(importlib.machinery.PathFinder.find_spec('api', [sys.argv[1]]))")
    out = subprocess.run([sys.executable, "-c", code, str(target)], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env={**os.environ, "PYTHONPATH": str(target)}, check=True).stdout.splitlines()
    assert out == [str(target / "trajstore" / "api" / "app.py"), "None"]


def test_the_architecture_map_names_every_module() -> None:
    """docs/architecture.md is a map of the package: every module (by its path inside ``trajstore/``, the service's
    as ``api/…``) appears in it; a package's ``__init__`` only as its room."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    missing = []
    for path in modules().values():
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.endswith("__init__.py") and relative != "__init__.py":
            room = relative.removesuffix("/__init__.py")
            if f"`{room}/" not in text:
                missing.append(room + "/")
        elif f"`{relative}`" not in text:
            missing.append(relative)
    assert not missing, f"docs/architecture.md does not name {missing}"
