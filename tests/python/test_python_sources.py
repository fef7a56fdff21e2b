"""The project's Python (benchmarks, scripts, tests) has no name that would fail only when its line runs.

Most benchmarks run only on the GPU machine, so a NameError there (a module used but not imported)
costs a GPU run to find. pyflakes finds undefined names statically; this test fails on any, in every
.py file of bench/, scripts/ and tests/python/.
"""
from pathlib import Path

import pyflakes.api
import pyflakes.messages
import pyflakes.reporter

ROOT = Path(__file__).resolve().parents[2]
UNDEFINED = (pyflakes.messages.UndefinedName, pyflakes.messages.UndefinedLocal, pyflakes.messages.UndefinedExport)


class Collect(pyflakes.reporter.Reporter):
    def __init__(self):
        self.found = []

    def unexpectedError(self, filename, msg):
        self.found.append(f"{filename}: {msg}")

    def syntaxError(self, filename, msg, lineno, offset, text):
        self.found.append(f"{filename}:{lineno}: {msg}")

    def flake(self, message):
        if isinstance(message, UNDEFINED):
            self.found.append(str(message))


def sources():
    return sorted(p for d in ("bench", "scripts", "tests/python") for p in (ROOT / d).glob("*.py"))


def test_there_are_sources_to_check():
    names = {p.name for p in sources()}
    assert {"train_bench.py", "bench_cli.py", "mutants.py", "conftest.py"} <= names


def test_no_python_source_uses_an_undefined_name():
    r = Collect()
    for p in sources():
        pyflakes.api.checkPath(str(p), r)
    assert r.found == []


def test_the_check_finds_an_undefined_name(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    return os.environ\n")
    r = Collect()
    pyflakes.api.checkPath(str(bad), r)
    assert len(r.found) == 1 and "undefined name 'os'" in r.found[0]
