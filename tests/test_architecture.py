"""The shape of the package: layers, each a folder, each importing only from the layers below it (imports for type
hints counted); no import cycles (type-hint imports counted too); the Delta log's names spelled in one module and
deltalake imported only by the modules of the store's Delta tables; nothing outside ``store.py`` touches a private
part of the Store; every package's
docstring names its modules; SQL text is written only in ``trajstore/query/sql.py``; and the wheel installs nothing
at top level but ``trajstore`` (the service inside it as ``trajstore.api``)."""

from __future__ import annotations

import ast
import functools
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import trajstore

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


@functools.cache
def parsed(path: Path) -> ast.Module:
    """The syntax tree of ``path``, parsed once per session (the checks below only read the trees)."""
    return ast.parse(path.read_text())


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

    visit(parsed(path))
    return found


@functools.cache
def graph(*, type_hints: bool = False) -> dict[str, set[str]]:
    """The package's import graph (read-only: made once per session and shared by the checks)."""
    mods = modules()
    return {name: {m for m in imports(path, name, set(mods), type_hints=type_hints) if m in mods and m != name}
            for name, path in mods.items()}


# The layers, lowest first (docs/architecture.md draws them): a module imports from its own layer and those below.
LAYERS = [
    ("base", ["trajstore.__about__", "trajstore.errors", "trajstore.settings", "trajstore.schema", "trajstore.retry",
              "trajstore.durations", "trajstore.extras", "trajstore.progress_bar"]),
    ("the stored format and the log", ["trajstore.storage"]),
    ("the writer", ["trajstore.write"]),
    ("reading one committed version", ["trajstore.query"]),
    ("training loaders", ["trajstore.loaders"]),
    ("operations that change a store", ["trajstore.operations"]),
    ("the store", ["trajstore.store", "trajstore.maintenance", "trajstore.plumbing"]),
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


# The Store, and the two handles store.py gives its parts to (the maintenance and the service's plumbing): each keeps
# the parts (the table, the read engine, the loader layouts, the settings, the ingest upkeep) in private attributes.
HOLDERS = {"trajstore/store.py": "Store", "trajstore/maintenance.py": "Maintenance",
           "trajstore/plumbing.py": "Plumbing"}
# What a researcher calls on a Store (docs/architecture.md, "store.py: the façade"): a new member is a decision.
FACADE = {"uri", "root", "version", "read_only", "at", "history", "schema", "health", "writer", "set_run", "run_info",
          "runs", "episodes", "episode_steps", "stats", "returns", "curves", "scan", "iter_batches", "follow", "sql",
          "snapshot", "sequences", "transitions", "compare", "scores", "probability_of_improvement",
          "performance_profile", "maintain", "replay"}
CLIENT_FACING = ("self", "cls")


def held(path: Path, cls_name: str) -> set[str]:
    """The attributes instances of ``cls_name`` (in ``path``) are given: every ``self.<name> = …`` of its methods."""
    cls = next(n for n in parsed(path).body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    names = set()
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] \
            if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    names.add(t.attr)
    return names


def reaches(tree: ast.AST, names: set[str]) -> list[tuple[int, str]]:
    """Where ``tree`` reads one of ``names`` off anything but ``self`` (a class's own attribute of that name)."""
    return [(node.lineno, f"{ast.unparse(node.value)}.{node.attr}") for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr in names
            and not (isinstance(node.value, ast.Name) and node.value.id in CLIENT_FACING)]


def test_the_package_imports_each_name_when_first_used() -> None:
    """``import trajstore`` imports none of its modules (a SQL worker or the CLI's parser needs one or two); each public
    name is found where it lives on first use, and ``dir()`` lists them all."""
    code = ("import sys, trajstore; print(sorted(m for m in sys.modules if m.startswith('trajstore.') and "
            "m != 'trajstore.__about__'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    for name in trajstore.__all__:
        value = getattr(trajstore, name)
        assert name == "__version__" or value.__name__ == name, name
    assert set(trajstore.__all__) <= set(dir(trajstore))
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        trajstore.nope  # noqa: B018


def test_the_store_keeps_its_parts_private() -> None:
    public = [f"{cls}.{name}" for path, cls in HOLDERS.items() for name in sorted(held(ROOT / path, cls))
              if not name.startswith("_")]
    assert not public, f"parts of a store held in public attributes: {public}"


def test_the_store_is_a_researchers_facade() -> None:
    """At most ~30 public members, each named in :data:`FACADE`: the service's plumbing lives elsewhere."""
    members = {n for n in vars(trajstore.Store) if not n.startswith("_")}
    assert members == FACADE, (f"added: {sorted(members - FACADE)}", f"gone: {sorted(FACADE - members)}")
    assert len(members) <= 30


def _python_files() -> list[Path]:
    """Every module of the package (the service through its link), the tests and the benchmarks."""
    return [*modules().values(), *(ROOT / "tests").rglob("*.py"), *(ROOT / "benchmarks").rglob("*.py")]


def test_nothing_outside_the_store_reaches_its_parts() -> None:
    """The attributes the Store and its handles hold their parts in are read off a store only in ``store.py``
    (which hands them to the handles it makes); anywhere else, on any object, only a class's own ``self.<name>``."""
    names = {n for path, cls in HOLDERS.items() if (ROOT / path).is_file() for n in held(ROOT / path, cls)}
    offenders = []
    for path in _python_files():
        if path.resolve() == (PACKAGE / "store.py").resolve():
            continue
        offenders += [f"{path.relative_to(ROOT)}:{line}: {text}" for line, text in reaches(parsed(path),
                                                                                           names)]
    assert not offenders, "a store's parts reached outside store.py:\n" + "\n".join(offenders)


def test_the_reach_check_would_see_a_reach() -> None:  # the check above can fail
    tree = ast.parse("store._engine.files()\nplumbing(s)._layouts\nself._engine.files()\n")
    assert sorted(reaches(tree, {"_engine", "_layouts"})) == [(1, "store._engine"), (2, "plumbing(s)._layouts")]


def test_every_package_docstring_names_its_modules() -> None:
    missing = []
    for folder in [p for p in PACKAGE.iterdir() if (p / "__init__.py").is_file() and p.name != "api"]:
        text = ast.get_docstring(ast.parse((folder / "__init__.py").read_text())) or ""
        dotted = f"trajstore.{folder.name}"
        missing += [f"{dotted}.{m.stem}" for m in folder.glob("*.py") if not m.name.startswith("__")
                    and not re.search(rf"{re.escape(dotted)}\.{m.stem}[`.]", text)]
    assert not missing, f"package docstrings that do not name their modules: {missing}"


def cycle(g: dict[str, set[str]]) -> list[str] | None:
    """The first import cycle of ``g`` (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for dep in sorted(g[node]):
            if state.get(dep) == 1:
                return path[path.index(dep):] + [dep] if dep in path else [node, dep]
            if dep not in state:
                found = visit(dep, path + [dep])
                if found:
                    return found
        state[node] = 2
        return None

    for node in sorted(g):
        if node not in state:
            found = visit(node, [node])
            if found:
                return found
    return None


def test_no_import_cycles() -> None:
    """No cycle, imports made for type hints alone (under ``if TYPE_CHECKING:``) counted: such a pair is one
    concept cut in two, whichever import runs."""
    found = cycle(graph(type_hints=True))
    assert found is None, "import cycle: " + " -> ".join(found or [])


def test_the_cycle_check_would_see_a_type_hint_cycle(tmp_path: Path) -> None:  # the check above can fail
    (tmp_path / "a.py").write_text("from trajstore.b import B\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\n"
                                   "if TYPE_CHECKING:\n    from trajstore.a import A\n")
    known = {"trajstore.a", "trajstore.b"}
    g = {name: imports(tmp_path / f"{name[-1]}.py", name, known, type_hints=True) for name in known}
    assert cycle(g) == ["trajstore.a", "trajstore.b", "trajstore.a"]


# The Delta log's own names: the one module that reads and writes the log spells them (storage/log.py), every other
# module asks it (the runs table's module too, through its Log); docstrings and comments included.
LOG_NAMES = ("_delta_log", "_last_checkpoint", ".checkpoint.parquet", "020d}.json")
LOG_MODULE = "trajstore/storage/log.py"
# The modules of the store's two Delta tables (steps, runs): the only ones that import deltalake.
DELTA_MODULES = {"trajstore/storage/log.py", "trajstore/storage/runs_log.py", "trajstore/storage/priorities_log.py"}


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT)).replace("trajstore/api/", "api/")


def test_the_delta_logs_names_are_spelled_in_one_module() -> None:
    offenders = [f"{_relative(path)}: {name}" for path in modules().values() if _relative(path) != LOG_MODULE
                 for name in LOG_NAMES if name in path.read_text()]
    assert not offenders, f"the Delta log's names outside {LOG_MODULE}:\n" + "\n".join(offenders)


def test_only_the_delta_tables_modules_import_deltalake() -> None:
    offenders = []
    for path in modules().values():
        for node in ast.walk(parsed(path)):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n.split(".")[0] == "deltalake" for n in names) and _relative(path) not in DELTA_MODULES:
                offenders.append(f"{_relative(path)}:{node.lineno}")
    assert not offenders, f"deltalake imported outside {sorted(DELTA_MODULES)}:\n" + "\n".join(offenders)


def test_nothing_imports_a_top_level_api_package() -> None:
    for root in (PACKAGE, ROOT / "api", ROOT / "tests", ROOT / "benchmarks"):
        for path in root.rglob("*.py"):
            for node in ast.walk(parsed(path)):
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
        offenders += [f"{rel}: {s[:60]!r}" for s in _strings(parsed(path)) if SQL.search(s)]
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


@pytest.mark.slow
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
