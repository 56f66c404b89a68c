"""The README and docs/ name only what exists.

Fast (no torch, no Ray, no kernel): the tree is read as files and as Python syntax trees, and a
module is imported only where an attribute could not be found in its source.

- a module path (``looprl/x/y.py``, ``looprl/x/``) is a file or folder of the tree;
- a dotted name (``looprl.x.y``, ``looprl.x.y.name``) is a module, or an attribute of the longest
  module it starts with;
- a backticked ``Class.attribute`` of a class that looprl defines is an attribute of that class;
- an experiment script (``experiments/x.py``) and a result (``experiments/results/...``) exist:
  ``{a,b}`` stands for both, ``*`` and ``<placeholder>`` for any text; a name without an
  extension (an ``--out`` prefix) for the files it begins; a file git ignores (a local cache
  the page says how to make) is not looked for, nor one that a paragraph saying its figures are
  "to be re-measured with experiments/x.py" names as that script's output (``x_<cpu>.json``);
- a benchmark named as ``looprl-bench <benchmark>`` or ``python -m looprl.bench <benchmark>``
  is one of ``looprl-bench``'s subcommands;
- in a table row whose first cell is a package folder (``looprl/train/``), each backticked
  lowercase name is a module of that folder or a name its ``__init__`` exports, and each
  backticked ``x.py`` a file in it; a row of a module file (``looprl/torch.py``) names only
  words its source holds.

Each failure lists ``page:line: name``.
"""

from __future__ import annotations

import ast
import functools
import importlib
import itertools
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md"]
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def _mentions(pattern: re.Pattern, group: int = 0):
    """(page:line, matched text) of every match of ``pattern`` in every page, code included."""
    for path in DOCUMENTS:
        text = path.read_text()
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            yield f"{path.relative_to(ROOT)}:{line}", match.group(group)


def _report(missing: list[str], what: str) -> str:
    return f"the docs name {len(missing)} {what} that do not exist:\n  " + "\n  ".join(missing)


# ---- the tree, read without importing ---------------------------------------------------------


def _module_file(parts: list[str]) -> Path | None:
    """The source file of the module ``parts`` (``["looprl", "search"]``), if the tree has it."""
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _top_level_nodes(body):
    for node in body:
        if isinstance(node, (ast.If, ast.Try)):
            yield from _top_level_nodes(node.body)
            yield from _top_level_nodes(getattr(node, "orelse", []))
            for handler in getattr(node, "handlers", []):
                yield from _top_level_nodes(handler.body)
            yield from _top_level_nodes(getattr(node, "finalbody", []))
        else:
            yield node


def _bound_names(body) -> set[str]:
    """Names a module or class body binds: definitions, assignments, imports."""
    names: set[str] = set()
    for node in _top_level_nodes(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return names


@functools.cache
def _syntax(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


@functools.cache
def _module_names(path: Path) -> frozenset[str]:
    return frozenset(_bound_names(_syntax(path).body))


@functools.cache
def _classes() -> dict[str, set[str]]:
    """Each class looprl defines, by name: the names its body and its methods' ``self.x =`` bind,
    and its looprl bases'."""
    bodies: dict[str, set[str]] = {}
    bases: dict[str, set[str]] = {}
    for path in (ROOT / "looprl").rglob("*.py"):
        for node in ast.walk(_syntax(path)):
            if isinstance(node, ast.ClassDef):
                bound = bodies.setdefault(node.name, set())
                bound.update(_bound_names(node.body))
                bound.update(target.attr for inner in ast.walk(node) if isinstance(inner, (ast.Assign, ast.AnnAssign))
                             for target in getattr(inner, "targets", [getattr(inner, "target", None)])
                             if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                             and target.value.id == "self")  # attributes its methods set
                bases.setdefault(node.name, set()).update(base.id for base in node.bases if isinstance(base, ast.Name))
    def inherited(name, seen=()):
        names = set(bodies.get(name, ()))
        for base in bases.get(name, ()):
            if base in bodies and base not in seen:
                names |= inherited(base, (*seen, name))
        return names
    return {name: inherited(name) for name in bodies}


@functools.cache
def _missing_attributes(module: str, attributes: tuple[str, ...]) -> str | None:
    """None where ``module`` imports and holds ``attributes`` in turn, else what went wrong."""
    try:
        value = importlib.import_module(module)
    except Exception as error:  # noqa: BLE001 - a module that does not import is reported, whatever the error
        return f"(import {module} failed: {type(error).__name__}: {error})"
    for attribute in attributes:
        if not hasattr(value, attribute):
            return "(no such attribute)"
        value = getattr(value, attribute)
    return None


def _dotted_name_missing(dotted: str) -> str | None:
    """None where ``dotted`` is a module of the tree or an attribute of one, else why not.
    Read from the source first (``looprl.Target.host``: ``Target`` bound in ``looprl/__init__.py``,
    a class that defines ``host``); imported only where the source does not tell."""
    parts = dotted.split(".")
    cut = len(parts)
    while cut > 1 and _module_file(parts[:cut]) is None:
        cut -= 1
    module, attributes = parts[:cut], tuple(parts[cut:])
    if not attributes:
        return None
    if attributes[0] in _module_names(_module_file(module)):
        if len(attributes) == 1:
            return None
        if len(attributes) == 2 and attributes[1] in _classes().get(attributes[0], ()):
            return None
    return _missing_attributes(".".join(module), attributes)


def _ignored_by_git(relative: str) -> bool:
    done = subprocess.run(["git", "check-ignore", "-q", "--no-index", relative], cwd=ROOT, capture_output=True)
    return done.returncode == 0


# ---- the checks -------------------------------------------------------------------------------

DOTTED = re.compile(r"(?<![\w./-])looprl(?:\.[A-Za-z_]\w*)+")
MODULE_PATH = re.compile(r"(?<![\w./-])looprl/[\w./-]*")
EXPERIMENT_PATH = re.compile(r"(?<![\w./-])experiments/[\w./*{},<>-]*")
BENCHMARK = re.compile(r"(?:looprl-bench|-m looprl\.bench|-m looprl bench)\s+([a-z][\w-]*)")
CLASS_ATTRIBUTE = re.compile(r"`([A-Z]\w*)\.([A-Za-z_]\w*)(?:\(\))?`")


def test_dotted_names_exist():
    missing = [f"{where}: {name} {why}" for where, name in _mentions(DOTTED) if (why := _dotted_name_missing(name))]
    assert not missing, _report(missing, "modules or attributes")


def test_module_paths_exist():
    missing = []
    for where, path in _mentions(MODULE_PATH):
        if "..." in path:  # looprl/_shipped/...: a pattern
            continue
        path = path.rstrip(".")
        if not ((ROOT / path).exists() or (ROOT / f"{path}.py").is_file()):
            missing.append(f"{where}: {path}")
    assert not missing, _report(missing, "module paths")


def _expansions(pattern: str) -> list[str]:
    """``a_{x,y}.csv`` as ``a_x.csv`` and ``a_y.csv``; ``<target>`` as ``*``."""
    pattern = re.sub(r"<[^<>]*>", "*", pattern)
    pieces = re.split(r"\{([^{}]*)\}", pattern)
    choices = [[piece] if index % 2 == 0 else piece.split(",") for index, piece in enumerate(pieces)]
    return ["".join(choice) for choice in itertools.product(*choices)]


def _experiment_path_exists(relative: str) -> bool:
    if any(ROOT.glob(relative)) or (ROOT / relative).exists():
        return True
    if "." not in relative.rsplit("/", 1)[-1] and any(ROOT.glob(relative + "*")):
        return True  # an output prefix: the files it begins
    return not any(sign in relative for sign in "*?[") and _ignored_by_git(relative)


PENDING = re.compile(r"to\s+be\s+re-measured\s+with\s+experiments/(\w+)\.py")


def _pending_scripts(text: str, position: int) -> set[str]:
    """The scripts the paragraph around ``position`` says its figures are to be re-measured with
    ("not scripted; to be re-measured with experiments/x.py")."""
    start = text.rfind("\n\n", 0, position)
    end = text.find("\n\n", position)
    return set(PENDING.findall(text[start + 1 if start >= 0 else 0:end if end >= 0 else len(text)]))


def test_experiment_scripts_and_results_exist():
    """A result file is there, or is one a script the paragraph names as to re-measure its
    figures will write (its name begins with the script's), that script being there."""
    missing = []
    for path in DOCUMENTS:
        text = path.read_text()
        for match in EXPERIMENT_PATH.finditer(text):
            where = f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, match.start()) + 1}"
            pending = {stem for stem in _pending_scripts(text, match.start()) if (ROOT / "experiments" / f"{stem}.py").is_file()}
            for name in _expansions(match.group(0).rstrip(".,")):
                to_come = name.startswith("experiments/results/") and any(
                    name.removeprefix("experiments/results/").startswith(stem) for stem in pending)
                if not to_come and not _experiment_path_exists(name):
                    missing.append(f"{where}: {name}")
    assert not missing, _report(missing, "experiment scripts or result files")


def _benchmarks() -> set[str]:
    """The keys of ``BENCHMARKS`` in ``looprl/cli/bench.py`` (``looprl-bench``'s subcommands),
    read from its source: nothing imported."""
    for node in _syntax(ROOT / "looprl" / "cli" / "bench.py").body:
        if isinstance(node, ast.Assign) and any(getattr(target, "id", None) == "BENCHMARKS" for target in node.targets):
            return {key.value for key in node.value.keys}
    raise AssertionError("looprl/cli/bench.py no longer assigns BENCHMARKS: read the subcommands another way")


def test_benchmark_subcommands_exist():
    benchmarks = _benchmarks()
    missing = [f"{where}: looprl-bench {name}" for where, name in _mentions(BENCHMARK, 1) if name not in benchmarks]
    assert not missing, _report(missing, "benchmarks")


def test_class_attributes_exist():
    classes = _classes()
    missing = [f"{where}: {name}" for where, name in _mentions(CLASS_ATTRIBUTE, 0)
               if (match := CLASS_ATTRIBUTE.fullmatch(name)) and match.group(1) in classes
               and match.group(2) not in classes[match.group(1)]]
    assert not missing, _report(missing, "class attributes")


def _table_rows():
    """(page:line, first cell's path, the rest of the row) of each table row whose first cell is
    one backticked looprl path."""
    for path in DOCUMENTS:
        for number, line in enumerate(path.read_text().splitlines(), 1):
            cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
            if line.startswith("|") and len(cells) >= 2 and re.fullmatch(r"`looprl/[\w/.]*`", cells[0]):
                yield f"{path.relative_to(ROOT)}:{number}", cells[0].strip("`"), " | ".join(cells[1:])


def _row_name_exists(folder: str, name: str) -> bool:
    directory = ROOT / folder
    if directory.is_file():  # a module's row: a word of its source
        return re.search(rf"\b{re.escape(name)}\b", directory.read_text()) is not None
    if name.endswith(".py"):
        return (directory / name).is_file()
    if (directory / f"{name}.py").is_file() or (directory / name / "__init__.py").is_file():
        return True
    return (directory / "__init__.py").is_file() and name in _module_names(directory / "__init__.py")


def test_table_rows_name_their_folders_modules():
    missing = []
    for where, folder, rest in _table_rows():
        for name in re.findall(r"`([^`]+)`", rest):
            checked = IDENTIFIER.fullmatch(name) and (name[0].islower() or (ROOT / folder).is_file())
            if (checked or re.fullmatch(r"\w+\.py", name)) and not _row_name_exists(folder, name):
                missing.append(f"{where}: {folder} {name}")
    assert not missing, _report(missing, "modules of their folders")


def test_the_checks_see_the_documents():
    """The patterns find what the pages hold (a broken pattern would pass everything)."""
    assert len(list(_mentions(DOTTED))) > 50 and len(list(_mentions(MODULE_PATH))) > 20
    assert len(list(_mentions(EXPERIMENT_PATH))) > 50 and len(list(_mentions(BENCHMARK, 1))) > 10
    assert len(list(_table_rows())) > 10
    assert _dotted_name_missing("looprl.no_such_module.name") and _dotted_name_missing("looprl.tune_nothing")
    assert _dotted_name_missing("looprl.Target.host") is None and _benchmarks() >= {"codegen", "tune"}
    assert _expansions("r/a_{x,}_<target>.csv") == ["r/a_x_*.csv", "r/a__*.csv"]
