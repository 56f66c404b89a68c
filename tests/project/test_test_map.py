"""The tests keep their map (tests/README.md): every test file sits in a folder the map lists,
each folder but project/ is named after a looprl package, and every ``tests/...`` path named
in the docs, the code, the experiments and pyproject.toml exists."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests"
WHOLE_PROJECT = "project"
TEST_PATH = re.compile(r"tests/[\w/.*-]*\w")


def mapped_folders() -> set[str]:
    """The folders the first column of tests/README.md's table names (`ir/` -> ``ir``)."""
    cells = re.findall(r"^\| `(\w+)/` \|", (TESTS / "README.md").read_text(), flags=re.MULTILINE)
    return set(cells)


def test_every_test_file_sits_in_a_folder_the_map_lists():
    folders = mapped_folders()
    misplaced = [str(path.relative_to(TESTS)) for path in TESTS.rglob("test_*.py")
                 if len(path.relative_to(TESTS).parts) != 2 or path.parent.name not in folders]
    assert not misplaced, f"test files outside the folders tests/README.md lists: {misplaced}"


def test_each_listed_folder_is_a_package_named_after_a_looprl_package():
    folders = mapped_folders()
    assert len(folders) >= 10 and WHOLE_PROJECT in folders  # the pattern reads the table
    for folder in folders:
        assert (TESTS / folder / "__init__.py").is_file(), f"tests/{folder}/ has no __init__.py"
        if folder != WHOLE_PROJECT:
            assert (ROOT / "looprl" / folder).is_dir() or (ROOT / "looprl" / f"{folder}.py").is_file(), \
                f"tests/{folder}/ names no looprl package"
    unlisted = {path.parent.name for path in TESTS.glob("*/test_*.py")} - folders
    assert not unlisted, f"folders of tests that tests/README.md does not list: {sorted(unlisted)}"


def _texts():
    """(file, text) of every file that may name a test by its path."""
    paths = [ROOT / "README.md", ROOT / "pyproject.toml", ROOT / ".ci" / "run", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "experiments").glob("*.md")), *sorted((ROOT / "experiments").glob("*.py")),
             *sorted((ROOT / "looprl").rglob("*.py")), *sorted(TESTS.rglob("*.py")), TESTS / "README.md"]
    for path in paths:
        if path.is_file():
            yield path, path.read_text()


def test_every_named_test_path_exists():
    named = [(path, match) for path, text in _texts() for match in TEST_PATH.findall(text)]
    missing = [f"{path.relative_to(ROOT)}: {name}" for path, name in named
               if not any(ROOT.glob(name)) and not (ROOT / name).exists()]
    assert len(named) > 10  # the pattern finds the paths
    assert not missing, "paths under tests/ that do not exist:\n  " + "\n  ".join(missing)


def test_every_target_dependent_test_is_in_a_file_that_names_the_marker(request):
    """The second command of .ci/run (``-m target_dependent``) imports only the test files whose
    text names the marker (tests/conftest.py: pytest_ignore_collect): a test marked any other way
    (a marker applied from elsewhere) would be left out of it silently."""
    from tests.conftest import TARGET_DEPENDENT

    marked = {item.path for item in request.session.items if item.get_closest_marker(TARGET_DEPENDENT)}
    unnamed = [str(path.relative_to(ROOT)) for path in marked if TARGET_DEPENDENT not in path.read_text()]
    assert not unnamed, f"target_dependent tests in files that never name the marker: {unnamed}"
