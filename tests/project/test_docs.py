"""The README and docs/ say only what runs: every Python block runs, every command line parses.

- A ```python block runs as in a fresh interpreter (this checkout first on the path, a temporary
  working folder, and a measurement cache of this module's own: :func:`blocks_cache`), in an
  interpreter forked from one that has only imported what the blocks import first
  (:class:`Imported`): its own globals, modules and state as a fresh interpreter's, without
  paying those imports again. The blocks that import torch run one after another in one test,
  forked from an interpreter that imported torch; the others, one test each, from one that
  imported looprl (one per test process). A block whose first line is ``# not run`` is an
  illustration only; few may be.
- Every command in a ```bash / ```console block that starts a looprl command line
  (``.venv/bin/looprl-*``, ``python -m looprl...``) or an experiment script is parsed by that
  command's own argparse parser, stopped right after parsing: a renamed or mistyped flag fails
  here, and nothing trains or benchmarks.
- Relative links point at files that exist.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import runpy
import select
import shlex
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "experiments" / "README.md"]
NOT_RUN = "# not run"
MAX_NOT_RUN = 3  # illustrations that must not run; the rest of the manual's code runs
SNIPPET_TIMEOUT_S = 120
SHELLS = {"bash", "sh", "console", "shell"}
# Python blocks that take seconds each (torch, searches): marked slow, so that the unmarked
# blocks run in about ten seconds.
SLOW_WORDS = ("import torch", "search.run(")


def fenced_blocks(path: Path) -> list[tuple[str, int, str]]:
    """(language, line of the opening fence, text) of each fenced block in ``path``."""
    blocks, language, start, body = [], None, 0, []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.startswith("```"):
            if language is None:
                language, start, body = line[3:].strip().lower(), number, []
            else:
                blocks.append((language, start, "\n".join(body) + "\n"))
                language = None
        elif language is not None:
            body.append(line)
    assert language is None, f"{path.name}: the block opened on line {start} is never closed"
    return blocks


def _label(path: Path, line: int) -> str:
    return f"{path.relative_to(ROOT)}:{line}"


PYTHON_BLOCKS = [(path, line, text) for path in DOCUMENTS for language, line, text in fenced_blocks(path) if language == "python"]
SHELL_BLOCKS = [(path, line, text) for path in DOCUMENTS for language, line, text in fenced_blocks(path) if language in SHELLS]


def _imports_torch(text: str) -> bool:
    return "import torch" in text


TORCH_BLOCKS = [(path, line, text) for path, line, text in PYTHON_BLOCKS if _imports_torch(text) and not text.startswith(NOT_RUN)]


def _python_params():
    for path, line, text in PYTHON_BLOCKS:
        if (path, line, text) in TORCH_BLOCKS:
            continue  # test_the_torch_blocks_run
        marks = [pytest.mark.slow] if any(word in text for word in SLOW_WORDS) else []
        yield pytest.param(path, line, text, id=_label(path, line), marks=marks)


def test_the_documents_hold_code():
    assert (ROOT / "docs").is_dir()
    assert len(PYTHON_BLOCKS) >= 5 and len(SHELL_BLOCKS) >= 5


def test_few_blocks_are_left_unrun():
    not_run = [_label(path, line) for path, line, text in PYTHON_BLOCKS if text.startswith(NOT_RUN)]
    assert len(not_run) <= MAX_NOT_RUN, f"too many blocks marked {NOT_RUN!r}: {not_run}"


# What an Imported interpreter runs: it imports the modules named (as the blocks do first), then for each request (a
# JSON line: the block, its folder and environment, the files for its stdout and stderr) forks a child that empties
# __main__ and runs the block there as `python -c` would (an exception: its traceback and exit status 1; the
# interpreter's exit and its atexit handlers as usual), and answers the child's pid, then its exit status.
FORK_SERVER = """
def serve(modules):
    import builtins, importlib, json, os, sys
    for name in modules:
        importlib.import_module(name)
    import gc
    gc.freeze()  # what the imports made is out of the collector's generations: a block's full collections walk its own objects
    import __main__
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            for fd, name, flags in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY | os.O_CREAT),
                                    (2, request["stderr"], os.O_WRONLY | os.O_CREAT)):
                opened = os.open(name, flags)
                os.dup2(opened, fd)
                os.close(opened)
            namespace = __main__.__dict__
            namespace.clear()
            namespace.update(__name__="__main__", __doc__=None, __package__=None, __spec__=None, __builtins__=builtins)
            exec(compile(request["text"], "<string>", "exec"), namespace)
            return
        print(json.dumps(pid), flush=True)
        print(json.dumps(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])), flush=True)
"""
# The modules imported before a block is forked: torch and torch._dynamo (which torch.compile loads; 1.5 and 2.8 CPU s
# a fresh interpreter pays for them) for the blocks that import torch, looprl (and numpy, which it imports) for the others.
TORCH_MODULES = ("torch", "torch._dynamo")
LOOPRL_MODULES = ("looprl",)


def _without_test_name(environment: dict) -> dict:
    return {name: value for name, value in environment.items() if name != "PYTEST_CURRENT_TEST"}


class Imported:
    """An interpreter that has imported ``modules`` and nothing else, whose forks run blocks:
    each fork has a fresh interpreter's globals, modules and state but for those modules',
    whose import each block would pay again. Started with the environment of the first block
    it runs."""

    def __init__(self, modules: tuple[str, ...], environment: dict):
        self.environment = environment
        self.process = subprocess.Popen([sys.executable, "-c", f"{FORK_SERVER}\nserve({list(modules)!r})\n"], env=environment,
                                        text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)

    def _answer(self, deadline: float):
        """The next answer, None at ``deadline``."""
        ready, _, _ = select.select([self.process.stdout], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        line = self.process.stdout.readline()
        assert line, f"the interpreter that imported the blocks' modules exited ({self.process.wait()})"
        return json.loads(line)

    def run(self, text: str, folder: Path, environment: dict, timeout_s: float) -> tuple[int, str]:
        """(exit status, stderr) of ``text`` run in a fork, in ``folder`` with ``environment``
        (which the modules' import saw, but for the running test's name); killed after ``timeout_s``."""
        assert _without_test_name(environment) == _without_test_name(self.environment), "a block's environment differs from the first's"
        deadline = time.monotonic() + timeout_s
        request = {"text": text, "cwd": str(folder), "env": environment, "stdout": str(folder / ".stdout"), "stderr": str(folder / ".stderr")}
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        pid = self._answer(deadline + 60)  # the first request waits for the modules' import too
        assert pid is not None, "the interpreter that imported the blocks' modules does not answer"
        status = self._answer(deadline)
        if status is None:
            os.kill(pid, signal.SIGKILL)
            self._answer(time.monotonic() + 60)
            pytest.fail(f"timed out after {timeout_s} s")
        return status, (folder / ".stderr").read_text()

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)


@pytest.fixture(scope="module")
def blocks_cache(tmp_path_factory) -> Path:
    """The measurement cache folder (``LOOPRL_CACHE_DIR``) of every block this module runs in
    one test process: the blocks share it as a reader's session shares theirs, and none sees
    the measurements the other tests of the process left in theirs (a block that trains
    AutoTVM's global model on the host's database, ``transfer=True``, trains on the blocks'
    measurements alone). It holds this host's memory bandwidths at one thread from the start,
    as a reader's cache holds them after their first tune: measured in this process, once per
    test process (tests/conftest.py), where each block's first tune measured them again
    (about 4 CPU s: what a bandwidth is, is checked by tests/measurement/test_roofline.py)."""
    from looprl.measurement import roofline

    folder = tmp_path_factory.mktemp("docs-cache")
    roofline.memory_bandwidth(cache=folder / "measurements.sqlite")
    return folder


def _environment(cache_folder: Path) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
                LOOPRL_CACHE_DIR=str(cache_folder))


@pytest.fixture(scope="module")
def looprl_imported(blocks_cache):
    """The interpreter that imported looprl, whose forks run the blocks that do not import
    torch: one per test process that runs any of them (``import looprl``: ~0.5 CPU s a block)."""
    interpreter = Imported(LOOPRL_MODULES, _environment(blocks_cache))
    yield interpreter
    interpreter.close()


@pytest.mark.parametrize(("path", "line", "text"), list(_python_params()))
def test_python_block_runs(path, line, text, tmp_path, blocks_cache, looprl_imported):
    if text.startswith(NOT_RUN):
        pytest.skip(f"marked {NOT_RUN!r}")
    started = time.monotonic()
    status, stderr = looprl_imported.run(text, tmp_path, _environment(blocks_cache), SNIPPET_TIMEOUT_S)
    assert status == 0, f"{_label(path, line)} failed after {time.monotonic() - started:.1f} s:\n{stderr[-3000:]}"


@pytest.mark.slow
def test_the_torch_blocks_run(tmp_path, blocks_cache):
    """Every block that imports torch, in the documents' order, each in a fork of one
    interpreter that imported torch (one such interpreter per test process, not one per worker
    that ran any of them: ~3.5 CPU s each). A failing block does not stop the others; the
    failure names each that failed."""
    assert TORCH_BLOCKS, "no block imports torch"
    environment = _environment(blocks_cache)
    interpreter = Imported(TORCH_MODULES, environment)
    failed = []
    try:
        for index, (path, line, text) in enumerate(TORCH_BLOCKS):
            folder = tmp_path / str(index)
            folder.mkdir()
            started = time.monotonic()
            status, stderr = interpreter.run(text, folder, environment, SNIPPET_TIMEOUT_S)
            if status != 0:
                failed.append(f"{_label(path, line)} failed after {time.monotonic() - started:.1f} s:\n{stderr[-3000:]}")
    finally:
        interpreter.close()
    assert not failed, "\n\n".join(failed)


# ---- command lines ----------------------------------------------------------------------


def command_lines(text: str) -> list[list[str]]:
    """The commands of a shell block: comments and prompts dropped, continuations joined,
    ``&&`` / ``;`` chains split, each command as its words."""
    joined = re.sub(r"\\\n", " ", text)
    commands = []
    for line in joined.splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        words = shlex.split(line, comments=True)
        command: list[str] = []
        for word in words + ["&&"]:
            if word in ("&&", ";", "||"):
                if command:
                    commands.append(command)
                command = []
            else:
                command.append(word)
    return commands


def _console_scripts() -> dict[str, str]:
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]["scripts"]


CONSOLE_SCRIPTS = _console_scripts()
# The modules `python -m` starts a command line with; any other module would run for real.
COMMAND_MODULES = ("looprl", "looprl.search", "looprl.train", "looprl.bench")


class _Parsed(Exception):
    """Raised by the patched parse_args once a command line has parsed: nothing runs."""


def _how_to_run(words: list[str]):
    """(callable that runs the command's entry point, argv) for a looprl or experiment command;
    None for other commands (pip, venv, pytest)."""
    program, *arguments = words
    name = program.removeprefix(".venv/bin/")
    if name in CONSOLE_SCRIPTS:
        module, function = CONSOLE_SCRIPTS[name].split(":")

        def entry():
            __import__(module)
            return getattr(sys.modules[module], function)()
        return entry, [name, *arguments]
    if name in ("python", "python3") and arguments[:1] == ["-m"] and arguments[1] in COMMAND_MODULES:
        module = arguments[1]
        return (lambda: runpy.run_module(module, run_name="__main__", alter_sys=True)), [module, *arguments[2:]]
    if name in ("python", "python3") and arguments and arguments[0].startswith("experiments/"):
        script = ROOT / arguments[0]
        assert script.is_file(), f"no script {arguments[0]}"
        return (lambda: runpy.run_path(str(script), run_name="__main__")), [str(script), *arguments[1:]]
    return None


INLINE_COMMAND = re.compile(r"`(\.venv/bin/[^`]+)`")
# An inline command holding one of these is a pattern (optional parts, placeholders), not a command.
PATTERN_SIGNS = ("[", "<", "...", "POLICY")


def inline_commands(path: Path) -> list[tuple[int, list[str]]]:
    """(line, words) of each `.venv/bin/...` command in the prose of ``path`` (a span may wrap lines)."""
    text = path.read_text()
    found = []
    for match in INLINE_COMMAND.finditer(text):
        if text[:match.start()].count("```") % 2 or any(sign in match.group(1) for sign in PATTERN_SIGNS):
            continue
        found.append((text[:match.start()].count("\n") + 1, shlex.split(match.group(1))))
    return found


def _looprl_commands():
    for path, line, text in SHELL_BLOCKS:
        for words in command_lines(text):
            if _how_to_run(words) is not None:
                yield pytest.param(words, id=f"{_label(path, line)}:{' '.join(words[:3])}")
    for path in DOCUMENTS:
        for line, words in inline_commands(path):
            if _how_to_run(words) is not None:
                yield pytest.param(words, id=f"{_label(path, line)}:{' '.join(words[:3])}")


LOOPRL_COMMANDS = list(_looprl_commands())


def test_the_documents_show_command_lines():
    shown = {words[0].removeprefix(".venv/bin/") for words in (param.values[0] for param in LOOPRL_COMMANDS)}
    assert set(CONSOLE_SCRIPTS) <= shown, f"command lines never shown: {set(CONSOLE_SCRIPTS) - shown}"


@pytest.mark.parametrize("words", LOOPRL_COMMANDS)
def test_command_line_parses(words, monkeypatch, capsys):
    assert not words[0].startswith("looprl-"), f"{' '.join(words)}: run it from the set-up's .venv/bin/"
    entry, argv = _how_to_run(words)
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        original(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_then_stop)
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.syspath_prepend(str(ROOT / "experiments"))  # as `python experiments/x.py` puts its folder first
    monkeypatch.chdir(ROOT)
    with pytest.raises((_Parsed, SystemExit)) as stopped:
        entry()
    if stopped.type is SystemExit:
        pytest.fail(f"{' '.join(words)} does not parse: {capsys.readouterr().err.strip().splitlines()[-1]}")


def test_no_bare_python_in_commands():
    """The set-up makes .venv; commands use its interpreter, not whatever `python` is on the PATH."""
    bare = [f"{_label(path, line)}: {' '.join(words)}" for path, line, text in SHELL_BLOCKS
            for words in command_lines(text) if words[0] in ("python", "pip", "pytest")]
    assert not bare, bare


def test_readme_test_command_is_what_ci_runs():
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines() if line.startswith("python3 -m venv")]
    assert len(ci) == 1
    readme = [text for _, _, text in fenced_blocks(ROOT / "README.md")]
    assert any(text.strip() == ci[0].strip() for text in readme), "README's test command differs from .ci/run's"


# ---- links ------------------------------------------------------------------------------

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _relative_links():
    for path in DOCUMENTS:
        text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
        for target in LINK.findall(text):
            if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
                yield path, target


def test_relative_links_exist():
    links = list(_relative_links())
    readme_to_docs = [target for path, target in links if path.name == "README.md" and target.startswith("docs/")]
    assert len(readme_to_docs) >= 10
    missing = [f"{path.relative_to(ROOT)} -> {target}" for path, target in links
               if not (path.parent / target.split("#")[0]).exists()]
    assert not missing, missing


def test_every_docs_page_is_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    unlinked = [page.name for page in (ROOT / "docs").glob("*.md") if f"(docs/{page.name})" not in readme]
    assert not unlinked, unlinked
