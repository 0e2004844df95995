"""The package namespace: torch-free imports, lazy torch-side exports, a sorted ``__all__``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import dask_windows as dw

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_python(code: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([REPO, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize(
    "statement",
    [
        "import dask_windows",
        # what Dask workers unpickle for convert and stats tasks, and the CLI up to dispatch
        "import dask_windows.cli.convert, dask_windows.cli.readers, dask_windows.cli.summary, "
        "dask_windows.sources.manifest, dask_windows.cli.bench, dask_windows.cli; "
        "dask_windows.cli.build_parser()",
    ],
)
def test_imports_leave_torch_alone(statement):
    done = run_python(f"{statement}; import sys; assert 'torch' not in sys.modules, 'torch was imported'")
    assert done.returncode == 0, done.stderr


def test_torch_side_exports_resolve_on_access():
    done = run_python(
        "import sys, dask_windows as dw\n"
        "assert 'torch' not in sys.modules\n"
        "assert dw.WindowDataset.__module__ == 'dask_windows.dataset'\n"
        "assert 'torch' in sys.modules\n"
        "assert callable(dw.masks.subsequence_mask)\n"
        "from dask_windows import DevicePrefetcher, WindowDataset, masks, standardize\n"
        "assert WindowDataset is dw.WindowDataset and masks is sys.modules['dask_windows.ondevice.masks']\n"
        "assert DevicePrefetcher.__module__ == 'dask_windows.ondevice.prefetcher' and callable(standardize)\n"
    )
    assert done.returncode == 0, done.stderr


def test_namespace():
    assert dw.__all__ == sorted(dw.__all__)
    for name in dw.__all__:
        assert getattr(dw, name) is not None
    assert set(dw.__all__) <= set(dir(dw))
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        dw.no_such_name  # noqa: B018
    from dask_windows.dataset import WindowDataset

    assert dw.WindowDataset is WindowDataset


def test_old_module_paths_warn_and_are_the_new_modules():
    """Every old path of ``MOVED`` imports, warns naming the new path, and is the new module object; the
    old paths of torch-free modules (all but ``runtime``, ``speedups`` and ``ondevice``) import no torch.

    One interpreter for all of them (each old name is imported there for the first time)."""
    done = run_python(
        "import importlib, sys, warnings\n"
        "from dask_windows._moved import MOVED\n"
        "torch_side = ('dask_windows.runtime', 'dask_windows.speedups', 'dask_windows.ondevice')\n"
        "order = sorted(MOVED, key=lambda old: (MOVED[old].startswith(torch_side), old))\n"
        "problems = []\n"
        "for old in order:\n"
        "    new = MOVED[old]\n"
        "    with warnings.catch_warnings(record=True) as seen:\n"
        "        warnings.simplefilter('always')\n"
        "        module = importlib.import_module(old)\n"
        "    if module is not importlib.import_module(new):\n"
        "        problems.append(f'{old} is not the module {new}')\n"
        "    if not any(issubclass(w.category, DeprecationWarning) and new in str(w.message) for w in seen):\n"
        "        problems.append(f'{old}: no DeprecationWarning naming {new}: {[str(w.message) for w in seen]}')\n"
        "    if not new.startswith(torch_side) and 'torch' in sys.modules:\n"
        "        problems.append(f'{old} imported torch')\n"
        "assert not problems, problems\n"
        "assert len(order) == len(MOVED) == 24\n"
    )
    assert done.returncode == 0, done.stderr


#: the modules of the one release so far, 0.1.0 (``git ls-tree`` of the commit before ``_moved.py`` came)
RELEASED_MODULES = {
    *("array_source", "batch", "bench", "buffer", "cli", "convert", "dask_source", "dataset", "device", "errors"),
    *("faults", "index", "manifest", "masks", "memory", "parquet_source", "plan", "prefetch", "readers"),
    *("resume", "retry", "source", "spec", "split", "summary", "windows", "world"),
}


def test_old_module_paths_are_only_those_a_release_had():
    """A shim answers only for a module path 0.1.0 had and that is gone; every such path has one."""
    from dask_windows._moved import MOVED

    gone = {m for m in RELEASED_MODULES if not (PACKAGE / f"{m}.py").exists() and not (PACKAGE / m).is_dir()}
    assert set(MOVED) == {f"dask_windows.{m}" for m in gone}, (
        sorted(set(MOVED) - {f"dask_windows.{m}" for m in gone}),
        sorted(gone - {m.removeprefix("dask_windows.") for m in MOVED}),
    )


# --- the file tree and docs/architecture.md agree; the import rules that page states hold ---

import ast  # noqa: E402
import pathlib  # noqa: E402
import re  # noqa: E402

PACKAGE = pathlib.Path(REPO) / "dask_windows"
ARCHITECTURE = pathlib.Path(REPO) / "docs" / "architecture.md"


def _modules() -> dict[str, pathlib.Path]:
    """``dask_windows/x/y.py`` -> its path, for every module of the package."""
    return {
        path.relative_to(REPO).as_posix(): path for path in PACKAGE.rglob("*.py") if "__pycache__" not in path.parts
    }


def test_architecture_page_names_every_module_and_only_real_ones():
    named = set(re.findall(r"dask_windows/[A-Za-z0-9_/]+\.py", ARCHITECTURE.read_text(encoding="utf-8")))
    modules = set(_modules())
    assert not modules - named, f"modules missing from docs/architecture.md (add a row): {sorted(modules - named)}"
    assert not named - modules, f"docs/architecture.md names modules that do not exist: {sorted(named - modules)}"


def _imports(path: pathlib.Path) -> tuple[set[str], set[str]]:
    """(modules imported at module level, modules imported anywhere) by one source file.

    Module level includes ``if`` blocks at the top (``if TYPE_CHECKING:`` is left out:
    it never runs).
    """
    tree = ast.parse(path.read_text(encoding="utf-8"))

    def names(node: ast.AST) -> set[str]:
        if isinstance(node, ast.Import):
            return {alias.name for alias in node.names}
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            return {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        return set()

    anywhere = set().union(*(names(node) for node in ast.walk(tree)))
    top: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            continue
        for inner in [node, *(node.body + node.orelse if isinstance(node, (ast.If, ast.Try)) else [])]:
            top |= names(inner)
    return top, anywhere


def _roots(names: set[str]) -> set[str]:
    return {name.split(".")[0] for name in names}


PURE_STAGES = [  # rule 3: besides the planning/ sub-package (rule 6)
    "errors/__init__",
    "settings/spec",
    "settings/tuning",
    "runtime/prefetch",
    "runtime/buffer",
    "runtime/batch",
    "runtime/memory",
    "errors/faults",
    "errors/failures",
]

#: what the planning/ sub-package may import at module level (rule 6): the standard library, numpy, and these
PLANNING_MAY_IMPORT = {
    "dask_windows.errors",
    "dask_windows.settings.spec",
    "dask_windows.settings.tuning",
    "dask_windows.planning",
}
#: what no planning module imports, even inside a function (rule 6)
PLANNING_NEVER = ("dask_windows.runtime", "dask_windows.speedups", "dask_windows.sources", "dask_windows.cli")
#: the exceptions to rule 6 still to be taken out, each with its reason
PLANNING_EXCEPTIONS = {
    # the buffer permutation the report replays (to move into planning/), and the report's dataset argument
    "dask_windows/planning/mixing.py": {"dask_windows.runtime.buffer", "dask_windows.dataset"},
}


def _own(names: set[str], prefixes) -> set[str]:
    return {m for m in names if any(m == p or m.startswith(p + ".") for p in prefixes)}


def test_import_rules_of_the_architecture_page():
    modules = _modules()
    problems = []
    for name, path in sorted(modules.items()):
        top, anywhere = _imports(path)
        if not name.startswith("dask_windows/cli/") and any(m.startswith("dask_windows.cli") for m in anywhere):
            problems.append(f"{name} imports dask_windows.cli (rule 1)")
        if "torch" in _roots(top) and name.startswith("dask_windows/sources/"):
            problems.append(f"{name} imports torch at module level (rule 2)")
        if _roots(top) & {"dask", "distributed"} and not name.startswith("dask_windows/cli/"):
            problems.append(f"{name} imports dask at module level (rule 2)")
        if name.startswith("dask_windows/planning/"):
            allowed = PLANNING_EXCEPTIONS.get(name, set())
            third_party = {m for m in _roots(top) if m not in sys.stdlib_module_names} - {"numpy", "dask_windows"}
            own = {m for m in top if m.startswith("dask_windows.")} - _own(top, PLANNING_MAY_IMPORT | allowed)
            never = _own(anywhere, PLANNING_NEVER) - _own(anywhere, allowed)
            if third_party or own or never:
                problems.append(f"{name} imports {sorted(third_party | own | never)} (rule 6)")
        if name.startswith(("dask_windows/planning/", "dask_windows/runtime/", "dask_windows/sources/")):
            speedups = _own(top, ("dask_windows.speedups",))
            if speedups and not name.startswith("dask_windows/runtime/"):
                problems.append(f"{name} imports {sorted(speedups)} (rule 7)")
    for stage in PURE_STAGES:
        top, _ = _imports(PACKAGE / f"{stage}.py")
        third_party = {m for m in _roots(top) if m not in sys.stdlib_module_names} - {"numpy", "dask_windows"}
        own = {m for m in top if m.startswith("dask_windows.")}
        others = {m for m in own if m.split(".")[1] in {"sources", "dataset", "ondevice", "cli"}}
        if third_party or others:
            problems.append(f"dask_windows/{stage}.py imports {sorted(third_party | others)} at module level (rule 3)")
    _, base_imports = _imports(PACKAGE / "sources" / "base.py")
    concrete = {m for m in base_imports if m.startswith("dask_windows.sources.")}
    if concrete:
        problems.append(f"dask_windows/sources/base.py imports the concrete sources {sorted(concrete)} (rule 4)")
    allowed = {"ondevice/masks": "dask_windows.ondevice._mask_checks"}  # its private argument checks, themselves a leaf
    for leaf in ("ondevice/prefetcher", "ondevice/masks", "ondevice/_mask_checks"):
        _, anywhere = _imports(PACKAGE / f"{leaf}.py")
        own = {m for m in anywhere if m.startswith("dask_windows")}
        if any(m != allowed.get(leaf) and not m.startswith(f"{allowed.get(leaf)}.") for m in own):
            problems.append(f"dask_windows/{leaf}.py imports another module of the package (rule 5)")
    assert not problems, "\n".join(problems)


def test_the_import_rules_catch_a_planning_module_reaching_into_the_runtime(tmp_path, monkeypatch):
    """Rule 6 is not vacuous: a planning module importing the runtime inside a function is reported."""
    fake = tmp_path / "dask_windows" / "planning"
    fake.mkdir(parents=True)
    (fake / "sneaky.py").write_text("import numpy\n\ndef f():\n    from dask_windows.runtime import buffer\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "dask_windows")
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "PURE_STAGES", [])
    for leaf in ("ondevice/prefetcher", "ondevice/masks", "ondevice/_mask_checks", "sources/base"):
        (tmp_path / "dask_windows" / f"{leaf}.py").parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "dask_windows" / f"{leaf}.py").write_text("")
    with pytest.raises(AssertionError, match=r"sneaky.py imports .*'dask_windows.runtime.buffer'.* \(rule 6\)"):
        test_import_rules_of_the_architecture_page()


# --- the "may import" cells of docs/architecture.md are the imports of the code, both ways ---
#
# A cell lists what its module imports, each once: the package's modules relative to ``dask_windows``
# (``errors``, ``planning.index``; ``planning.{plan, pool}`` for several of one sub-package; a sub-package
# stands for any of its modules; ``dask_windows`` is the package's ``__init__``; a module named like a
# third-party package would keep its prefix) and third-party packages by their top-level
# name (``numpy``, ``torch``); the standard library is not listed. What is imported only inside functions
# (or only for type checking) follows ``; inside functions:``. ``stdlib`` or ``nothing`` is an empty list;
# text in parentheses is a comment.

INSIDE = "; inside functions:"


def _module_name(rel: str) -> str:
    """``dask_windows/planning/index.py`` -> ``dask_windows.planning.index`` (``x/__init__.py`` -> ``x``)."""
    return rel.removesuffix(".py").replace("/", ".").removesuffix(".__init__")


def _real_imports(path: pathlib.Path, modules: set[str]) -> dict[str, tuple[bool, int]]:
    """What ``path`` imports -> (at module level?, first line): the package's modules by full name,
    third-party packages by their top-level name, the standard library left out. ``from package import
    name`` counts as ``package.name`` where that is a module, else as ``package``."""
    found: dict[str, tuple[bool, int]] = {}

    def add(name: str, top: bool, line: int) -> None:
        if not name.startswith("dask_windows"):
            name = name.split(".")[0]
            if name in sys.stdlib_module_names or name == "__future__":
                return
        if name not in found or (top and not found[name][0]):
            found[name] = (top, line)

    def visit(node: ast.AST, top: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or (
            isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        ):
            top = False
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, top, node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                full = f"{node.module}.{alias.name}"
                add(full if full in modules else node.module, top, node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, top)

    visit(ast.parse(path.read_text(encoding="utf-8")), True)
    found.pop(_module_name(path.relative_to(REPO).as_posix()), None)
    return found


def _cell_names(cell: str) -> tuple[list[str], list[str]]:
    """(names imported at module level, names imported inside functions) as a "may import" cell writes them."""
    cell = re.sub(r"\([^()]*\)", "", cell.replace("`", ""))
    top, _, inside = cell.partition(INSIDE)

    def names(part: str) -> list[str]:
        out = []
        for group, members in re.findall(r"([\w.]+)\.\{([^}]*)\}", part):
            out += [f"{group}.{m.strip()}" for m in members.split(",") if m.strip()]
        part = re.sub(r"[\w.]+\.\{[^}]*\}", "", part)
        return out + [n.strip() for n in part.split(",") if n.strip() and n.strip() not in ("stdlib", "nothing")]

    return names(top), names(inside)


def _resolve(name: str, third_party: set[str]) -> str:
    """A cell's name -> the key of ``_real_imports``."""
    if name.startswith("dask_windows") or name in third_party:
        return name
    return f"dask_windows.{name}"


def _cell_text(key: str, third_party: set[str]) -> str:
    short = key.removeprefix("dask_windows.")
    return key if key == "dask_windows" or short.split(".")[0] in third_party else short


def _render(imports: dict[str, tuple[bool, int]], third_party: set[str]) -> str:
    """The cell that lists ``imports`` exactly (what ``python tests/test_package.py`` prints)."""

    def names(level: bool) -> str:
        chosen = sorted(n for n, (top, _) in imports.items() if top is level)
        own = [n for n in chosen if n.startswith("dask_windows.")]
        groups: dict[str, list[str]] = {}
        for name in own:
            parent, _, leaf = _cell_text(name, third_party).rpartition(".")
            groups.setdefault(parent, []).append(leaf)
        items = []  # (sort key, text)
        for parent, leaves in groups.items():
            if parent and len(leaves) > 1:
                items.append((parent, f"{parent}.{{{', '.join(leaves)}}}"))
            else:
                items += [(f"{parent}.{leaf}".lstrip("."),) * 2 for leaf in leaves]
        texts = [text for _, text in sorted(items)]
        return ", ".join(texts + [n for n in chosen if not n.startswith("dask_windows.")])

    top, inside = names(True), names(False)
    return (top or "stdlib") + (f"{INSIDE} {inside}" if inside else "")


def _import_rows() -> dict[str, str]:
    """``dask_windows/x.py`` -> its "may import" cell, from the tables of docs/architecture.md."""
    rows: dict[str, str] = {}
    for line in ARCHITECTURE.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\| `(dask_windows/[\w/]+\.py)` \|.*\| ([^|]*) \|$", line)
        if match:
            assert match[1] not in rows, f"docs/architecture.md has two rows for {match[1]}"
            rows[match[1]] = match[2]
    return rows


def _cell_problems(cell: str, imports: dict[str, tuple[bool, int]], modules: set[str], third_party: set[str]):
    """What is wrong with a cell, each as an instruction."""
    top, inside = ([(n, _resolve(n, third_party)) for n in names] for names in _cell_names(cell))  # (as written, key)
    problems = [
        f"`{n}` names no module of the package and no package it imports: remove it (renamed? moved?)"
        for n, key in top + inside
        if key.startswith("dask_windows") and key not in modules
    ]

    def covers(listed: list[tuple[str, str]], real: str) -> bool:
        return any(real == key or (key != "dask_windows" and real.startswith(key + ".")) for _, key in listed)

    for real, (at_top, line) in sorted(imports.items()):
        text = _cell_text(real, third_party)
        if at_top and not covers(top, real):
            hint = " (move it before `; inside functions:`)" if covers(inside, real) else ""
            problems.append(f"add `{text}`: imported at module level, line {line}{hint}")
        elif not at_top and not covers(top + inside, real):
            problems.append(f"add `{text}` after `; inside functions:`: imported inside a function, line {line}")
        elif not at_top and not covers(inside, real):
            problems.append(f"move `{text}` after `; inside functions:`: imported only inside a function, line {line}")
    for n, key in top + inside:
        if (key in modules or not key.startswith("dask_windows")) and not any(covers([(n, key)], r) for r in imports):
            problems.append(f"remove `{n}`: not imported")
    return problems


def _architecture_import_problems() -> list[str]:
    files = _modules()
    modules = {_module_name(rel) for rel in files}
    imports = {rel: _real_imports(path, modules) for rel, path in files.items()}
    third_party = {n for found in imports.values() for n in found if not n.startswith("dask_windows")}
    rows = _import_rows()
    out = []
    for rel in sorted(files):
        cell = _render(imports[rel], third_party)
        if rel not in rows:
            out.append(f"docs/architecture.md has no row for `{rel}`: add one, with this 'may import' cell: | {cell} |")
        elif problems := _cell_problems(rows[rel], imports[rel], modules, third_party):
            out.append(
                f"docs/architecture.md, the row of `{rel}`, column 'may import': "
                + "; ".join(problems)
                + f"\n    the cell that matches the code: | {cell} |"
            )
    out += [
        f"docs/architecture.md has a row for `{r}`, which does not exist: remove it" for r in rows if r not in files
    ]
    return out


def test_may_import_cells_of_the_architecture_page_are_the_real_imports():
    """Every import of every module is in its row's "may import" cell, at its level, and every name in a cell
    is a module or package that the row's module imports (``python tests/test_package.py`` prints the cells
    as the code has them)."""
    problems = _architecture_import_problems()
    fix = "(`python tests/test_package.py --write` puts the cells that match the code into the page)"
    assert not problems, "\n".join([*problems, fix])


def test_the_cell_check_names_the_row_and_what_to_change(tmp_path, monkeypatch):
    """The check is not vacuous: an import missing from a cell, a module that is gone, an import at the
    other level, a name not imported are each reported with the row to edit."""
    (tmp_path / "dask_windows" / "planning").mkdir(parents=True)
    (tmp_path / "dask_windows" / "errors.py").write_text("import os\nimport numpy\n")
    (tmp_path / "dask_windows" / "planning" / "plan.py").write_text(
        "import numpy\nfrom dask_windows import errors\n\ndef f():\n    import pyarrow.parquet\n"
    )
    (tmp_path / "docs").mkdir()
    page = tmp_path / "docs" / "architecture.md"
    page.write_text(
        "| `dask_windows/errors.py` | x | numpy, pyarrow |\n"
        "| `dask_windows/planning/plan.py` | x | errors, pyarrow, gone |\n"
    )
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", tmp_path / "dask_windows")
    monkeypatch.setattr(sys.modules[__name__], "REPO", str(tmp_path))
    monkeypatch.setattr(sys.modules[__name__], "ARCHITECTURE", page)
    errors, plan = _architecture_import_problems()
    assert errors.startswith("docs/architecture.md, the row of `dask_windows/errors.py`, column 'may import'")
    assert "remove `pyarrow`: not imported" in errors
    assert plan.startswith("docs/architecture.md, the row of `dask_windows/planning/plan.py`, column 'may import'")
    assert "`gone` names no module of the package" in plan
    assert "add `numpy`: imported at module level, line 1" in plan
    assert "move `pyarrow` after `; inside functions:`" in plan
    assert plan.endswith("| errors, numpy; inside functions: pyarrow |")
    page.write_text(
        "| `dask_windows/errors.py` | x | numpy |\n"
        "| `dask_windows/planning/plan.py` | x | errors, numpy (a comment); inside functions: pyarrow |\n"
    )
    assert _architecture_import_problems() == []
    (tmp_path / "dask_windows" / "planning" / "plan.py").unlink()
    assert _architecture_import_problems() == [
        "docs/architecture.md has a row for `dask_windows/planning/plan.py`, which does not exist: remove it"
    ]


def test_import_dask_windows_leaves_dask_alone():
    done = run_python(
        "import dask_windows, sys; assert not {'dask', 'distributed'} & set(sys.modules), "
        "sorted(m for m in sys.modules if m.split('.')[0] in ('dask', 'distributed'))"
    )
    assert done.returncode == 0, done.stderr


def test_changelog_lists_every_deprecated_module_path():
    from dask_windows._moved import MOVED

    text = (pathlib.Path(REPO) / "docs" / "changelog.md").read_text(encoding="utf-8")
    missing = [f"{old} -> {new}" for old, new in MOVED.items() if f"| `{old}` | `{new}` |" not in text]
    assert not missing, f"docs/changelog.md lacks these rows of dask_windows._moved.MOVED: {missing}"


# --- import cycles (function-level and type-only imports counted), threads, worker detection ---


def _graph() -> dict[str, set[str]]:
    """module -> the package's modules it imports anywhere (inside functions and ``TYPE_CHECKING`` too).

    ``from package import name`` counts as importing ``package.name`` where that is a module, else
    ``package``; parent packages are not counted (Python imports them first in any case).
    """
    modules = {}
    for rel, path in _modules().items():
        name = rel[:-3].replace("/", ".")
        modules[name.removesuffix(".__init__")] = path
    graph = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                subs = {f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules}
                found |= subs or {node.module}
        graph[name] = {m for m in found if m in modules and m != name}
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(component)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


#: cycles that arrived with other branches' merges, each left to its owner to untangle
LATER_CYCLES = [
    # the workflow's modules import each other inside functions (core <-> fit <-> artifact, batch -> core)
    {
        "dask_windows.workflow.artifact",
        "dask_windows.workflow.batch",
        "dask_windows.workflow.core",
        "dask_windows.workflow.fit",
    },
    # corpus.dataset uses mixture's pieces while mixture accepts corpus members
    {"dask_windows.corpus", "dask_windows.corpus.dataset", "dask_windows.mixture"},
]


def test_no_import_cycle_but_the_known_ones():
    known = LATER_CYCLES
    cycles = _cycles(_graph())
    assert all(any(c <= k for k in known) for c in cycles), [
        sorted(c) for c in cycles if not any(c <= k for k in known)
    ]


def test_the_cycle_finder_finds_a_function_level_cycle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert _cycles(graph) == [{"a", "b", "c"}]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def _calls(path: pathlib.Path, names: set[str]) -> set[str]:
    """Which of ``names`` (``Thread``, ``get_worker_info``...) ``path`` calls or imports, by name or attribute."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name) and node.id in names:
            used.add(node.id)
        elif isinstance(node, ast.Attribute) and node.attr in names:
            used.add(node.attr)
        elif isinstance(node, ast.ImportFrom):
            used |= {a.name for a in node.names if a.name in names}
    return used


THREADS = {"Thread", "GuardedThread", "ThreadPoolExecutor", "start_new_thread", "Timer"}
#: outside ``runtime/prefetch.py``, where the package may start threads (each with its reason)
THREAD_STARTERS = {
    "dask_windows/runtime/prefetch.py",  # the loader's reader and builder threads
    "dask_windows/planning/index.py",  # the series scan at open, on a pool of the user's `threads`
    "dask_windows/planning/split.py",  # the time split's scan at open, likewise
    "dask_windows/sources/parquet/footers.py",  # footers read at open, likewise
    "dask_windows/sources/retry.py",  # a remote call's deadline
    "dask_windows/speedups/lanes.py",  # the second copying lane (batches of 1 MiB and more)
    "dask_windows/speedups/nextpass.py",  # optional: the read-ahead's expiry
    "dask_windows/cli/readers.py",  # the command line's input listing
    "dask_windows/passes/workerwatch.py",  # in a forkserver worker: the watch of the training process
}


def test_threads_start_in_the_listed_modules_only_and_in_one_runtime_module():
    starters = {name for name, path in _modules().items() if _calls(path, THREADS)}
    assert starters == THREAD_STARTERS, (sorted(starters - THREAD_STARTERS), sorted(THREAD_STARTERS - starters))
    assert [m for m in starters if m.startswith("dask_windows/runtime/")] == ["dask_windows/runtime/prefetch.py"]


def test_worker_and_rank_detection_live_in_one_module():
    asking = {
        name
        for name, path in _modules().items()
        if _calls(path, {"get_worker_info", "get_rank", "get_world_size", "is_initialized"})
    }
    assert asking == {"dask_windows/runtime/detect.py"}, sorted(asking)


def test_no_module_looks_itself_up_in_sys_modules():
    """Dependencies are imports, not ``sys.modules`` lookups whose result depends on what else was imported
    (one left: ``runtime/memory.py`` asks whether pyarrow was loaded before releasing Arrow's pool)."""
    lookups = {name for name, path in _modules().items() if "sys.modules.get(" in path.read_text(encoding="utf-8")}
    assert lookups <= {"dask_windows/runtime/memory.py", "dask_windows/_moved.py"}, sorted(lookups)


#: modules of runtime/ and speedups/ still allowed to reach into a dataset's private members, with the reason
#: (none since issue 21: the next pass's read-ahead receives ``nextpass.NextPass``, values and callables
#: the dataset builds, as runtime/streams.py receives StreamValues)
REACHES_INTO_THE_DATASET: set[str] = set()


def _dataset_private_members() -> set[str]:
    """The private methods and attributes ``WindowDataset`` defines (``_plan``, ``_read_values``, ...)."""
    tree = ast.parse((PACKAGE / "dataset.py").read_text(encoding="utf-8"))
    names = set()
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == "WindowDataset"):
        for node in ast.walk(cls):
            if isinstance(node, ast.FunctionDef) and node.name.startswith("_") and not node.name.startswith("__"):
                names.add(node.name)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                names.add(node.attr)
    return names


def _reaches_into(path: pathlib.Path, private: set[str]) -> list[str]:
    """``obj._member`` of another object (not ``self``) naming one of ``private``, as ``line: code``."""
    return [
        f"{node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and node.attr in private
        and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
    ]


def test_the_runtime_receives_values_and_never_reaches_into_the_dataset():
    """Rule 8's other half: no module of runtime/ or speedups/ calls or reads a private member of a
    ``WindowDataset`` (its plan, values, slots): they receive frozen values (``runtime/values.py``,
    ``runtime/streams.StreamValues``), but the listed ``REACHES_INTO_THE_DATASET``."""
    private = _dataset_private_members()
    assert {"_plan", "_batches", "_pass_values", "_read_values", "_stream_values", "_next_pass"} <= private
    found = {
        name: hits
        for name, path in _modules().items()
        if name.startswith(("dask_windows/runtime/", "dask_windows/speedups/"))
        and (hits := _reaches_into(path, private))
    }
    assert set(found) == REACHES_INTO_THE_DATASET, {k: v for k, v in found.items() if k not in REACHES_INTO_THE_DATASET}


def test_the_dataset_rule_catches_a_runtime_module_calling_the_dataset(tmp_path):
    module = tmp_path / "streams.py"
    module.write_text("def windows(ds, reader):\n    return ds._batches(ds._plan(reader, 0, 0), counted=False)\n")
    assert _reaches_into(module, _dataset_private_members()) == [
        "2: ds._batches",
        "2: ds._plan",
    ]
    module.write_text("def windows(stream, reader):\n    return stream.batches(stream.plan(reader, 0, 0))\n")
    assert _reaches_into(module, _dataset_private_members()) == []


#: Test files kept in ``tests/`` itself: tests of the top-level modules and of the package as a whole.
ROOT_TESTS = {
    "test_dataset.py",  # dataset.py
    "test_mixture.py",  # mixture.py
    "test_package.py",  # import rules, the architecture page, this layout
    "test_golden.py",  # whole epochs, bit for bit
    "test_docs.py",  # README.md and docs/
    "test_examples.py",  # examples/
    "test_example_ddp.py",
    "test_example_mixture.py",
    "test_ddp.py",  # gloo ranks through the whole package
    "test_harden.py",  # hostile input across the package
    "test_hangs.py",
    "test_real_data.py",  # data sets shipped in PyPI packages
    "test_forkrun.py",  # the suite's own child-process runner (tests/forkrun.py)
}


def test_the_slow_tests_conftest_names_exist(request):
    """Every file and test of ``tests/conftest.py``'s ``SLOW_TESTS`` exists (a renamed test would
    otherwise silently join the quick run)."""
    (conftest,) = (
        p
        for p in request.config.pluginmanager.get_plugins()
        if str(getattr(p, "__file__", "")).endswith(os.path.join("tests", "conftest.py"))
    )
    all_tests, slow_tests = conftest.ALL, conftest.SLOW_TESTS

    missing = []
    for rel, names in slow_tests.items():
        path = pathlib.Path(REPO) / rel
        if not path.is_file():
            missing.append(rel)
            continue
        tests = {
            n.name for n in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if isinstance(n, ast.FunctionDef)
        }
        missing += [f"{rel}::{name}" for name in ([] if names == all_tests else sorted(names)) if name not in tests]
    assert not missing, f"tests/conftest.py SLOW_TESTS names tests that do not exist (rename or remove): {missing}"


def test_tests_are_laid_out_like_the_package():
    """A module's tests live in ``tests/<sub-package>/``; only ROOT_TESTS stay at the top."""
    tests = os.path.join(REPO, "tests")
    package = os.path.join(REPO, "dask_windows")
    folders = {d for d in os.listdir(tests) if os.path.isdir(os.path.join(tests, d)) and not d.startswith((".", "_"))}
    subpackages = {d for d in os.listdir(package) if os.path.isfile(os.path.join(package, d, "__init__.py"))}
    assert folders <= subpackages, (
        f"test folders that are no sub-package of dask_windows: {sorted(folders - subpackages)}"
    )
    at_top = {n for n in os.listdir(tests) if n.startswith("test_") and n.endswith(".py")}
    assert at_top <= ROOT_TESTS, (
        f"move {sorted(at_top - ROOT_TESTS)} into tests/<sub-package>/ (the package folder of the module "
        "they test), or add them to ROOT_TESTS with the reason they test the package as a whole"
    )
    for folder in folders:
        assert any(n.startswith("test_") for n in os.listdir(os.path.join(tests, folder))), folder


#: The package's top level (issue 33): the public objects and sub-packages whose names say what they hold. A new
#: module goes into a sub-package; one that must be at the top is added here with its reason.
TOP_LEVEL = {
    "__init__.py",
    "_moved.py",
    "dataset.py",
    "mixture.py",
    *("cli", "corpus", "errors", "integrations", "ondevice", "opening", "passes"),
    *("planning", "runtime", "settings", "sources", "speedups", "workflow"),
}


def test_the_top_level_is_the_public_objects_and_the_sub_packages():
    found = {p.name for p in PACKAGE.iterdir() if p.suffix == ".py" or (p / "__init__.py").is_file()}
    assert found == TOP_LEVEL, (sorted(found - TOP_LEVEL), sorted(TOP_LEVEL - found))
    assert len(TOP_LEVEL - {"__init__.py", "_moved.py"}) <= 16


def test_the_0_1_paths_of_the_top_level_modules_moved_in_0_3_still_import():
    """0.1.0's ``spec``, ``faults``, ``device`` and ``masks`` moved into sub-packages (issue 33): their old
    paths import the same objects, each with one ``DeprecationWarning``, and no torch for the first two."""
    done = run_python(
        "import sys, warnings\n"
        "import dask_windows as dw\n"
        "with warnings.catch_warnings(record=True) as seen:\n"
        "    warnings.simplefilter('always')\n"
        "    from dask_windows.spec import WindowSpec\n"  # 0.1 path
        "    from dask_windows.faults import SkippedPartitionWarning, classify\n"  # 0.1 path
        "    assert 'torch' not in sys.modules\n"
        "    import dask_windows.masks as old_masks\n"  # 0.1 path
        "    from dask_windows.device import DevicePrefetcher\n"  # 0.1 path
        "from dask_windows.errors.failures import classify as new_classify\n"
        "from dask_windows.settings.spec import WindowSpec as new_spec\n"
        "assert WindowSpec is new_spec and SkippedPartitionWarning is dw.SkippedPartitionWarning\n"
        "assert classify is new_classify and old_masks is dw.masks and DevicePrefetcher is dw.DevicePrefetcher\n"
        "moved = [w for w in seen if issubclass(w.category, DeprecationWarning) and ' moved to ' in str(w.message)]\n"
        "assert len(moved) == 4, [str(w.message) for w in seen]\n"
    )
    assert done.returncode == 0, done.stderr


def _write_cells() -> int:
    """Every "may import" cell of docs/architecture.md set to what the code imports; the rows changed."""
    modules = {_module_name(rel) for rel in _modules()}
    found = {rel: _real_imports(path, modules) for rel, path in _modules().items()}
    third_party = {n for imports in found.values() for n in imports if not n.startswith("dask_windows")}
    lines, changed = [], 0
    for line in ARCHITECTURE.read_text(encoding="utf-8").split("\n"):
        match = re.match(r"(\| `(dask_windows/[\w/]+\.py)` \|.*\| )([^|]*)( \|)$", line)
        if match and match[2] in found and _cell_problems(match[3], found[match[2]], modules, third_party):
            line = match[1] + _render(found[match[2]], third_party) + match[4]
            changed += 1
        lines.append(line)
    ARCHITECTURE.write_text("\n".join(lines), encoding="utf-8")
    return changed


if __name__ == "__main__":
    # print every module's "may import" cell as the code has it; --write: put them in docs/architecture.md
    if sys.argv[1:] == ["--write"]:
        print(f"{_write_cells()} rows of docs/architecture.md updated")
    else:
        _names = {_module_name(rel) for rel in _modules()}
        _found = {rel: _real_imports(path, _names) for rel, path in _modules().items()}
        _third = {n for found in _found.values() for n in found if not n.startswith("dask_windows")}
        for _rel in sorted(_found):
            print(f"{_rel}: {_render(_found[_rel], _third)}")
