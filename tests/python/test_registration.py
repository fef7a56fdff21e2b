"""Every test file runs in CI: each tests/python/test_*.py and each *_test.cc is registered with
ctest through cmake/FtdTests.cmake's helpers (ftd_pytest, ftd_test). A file that no helper names is
never built or run, and its tests pass silently by not existing.

The helpers record what they register; CMake writes that list to the build tree
($FTD_REGISTERED_TESTS). Parts the configuration leaves out (kernels/ without nvcc,
test_build_graph.py without Ninja) are named in $FTD_TESTS_NOT_CONFIGURED.
"""
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", ".devdeps", "node_modules", "__pycache__"}


def candidate_files(root):
    """The test files of the tree at `root`, relative to it: git's tracked and untracked (not
    ignored) files where it is a checkout, else every file outside build directories."""
    root = Path(root)
    names = None
    if (root / ".git").exists():
        p = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=root, capture_output=True,
                           text=True)
        if p.returncode == 0:
            names = [n for n in p.stdout.split("\0") if n and (root / n).is_file()]
    if names is None:
        names = []
        for d, dirs, files in os.walk(root):
            dirs[:] = [x for x in dirs if x not in SKIP_DIRS and not x.startswith("build")]
            names += [str(Path(d, f).relative_to(root)) for f in files]
    return sorted(n for n in names
                  if (n.startswith("tests/python/") and Path(n).name.startswith("test_") and n.endswith(".py")
                      and n.count("/") == 2)
                  or n.endswith("_test.cc"))


def unregistered(root, registered, not_configured=()):
    """The test files under `root` that are not in `registered` (absolute paths) and not under a
    part named in `not_configured` (relative paths; a trailing / names a directory)."""
    root = Path(root).resolve()
    known = {str(Path(r).resolve()) for r in registered}
    missing = []
    for n in candidate_files(root):
        if any(n == p or (p.endswith("/") and n.startswith(p)) for p in not_configured):
            continue
        if str((root / n).resolve()) not in known:
            missing.append(n)
    return missing


def registered_list():
    path = os.environ.get("FTD_REGISTERED_TESTS")
    if not path:
        build = Path(os.environ.get("FTD_BUILD_DIR", ROOT / "build"))
        path = build / "registered_tests.txt"
    path = Path(path)
    if not path.is_file():
        pytest.fail(f"{path} is missing: configure the build (cmake) first; cmake/FtdTests.cmake writes it")
    return [line for line in path.read_text().splitlines() if line.strip()]


def test_every_test_file_is_registered_with_ctest():
    registered = registered_list()
    assert len(registered) >= 50, registered  # the helpers did record what they registered
    not_configured = [p for p in os.environ.get("FTD_TESTS_NOT_CONFIGURED", "").split(":") if p]
    missing = unregistered(ROOT, registered, not_configured)
    assert missing == [], (f"not registered with ctest (add ftd_pytest/ftd_test in the CMakeLists.txt beside "
                           f"them, cmake/FtdTests.cmake): {missing}")


def test_the_check_finds_an_unregistered_file(tmp_path):
    for name in ("tests/python/test_a.py", "tests/python/test_b.py", "tests/python/helper.py", "srv/x_test.cc",
                 "srv/y_test.cc", "srv/x.cc", "kernels/k_test.cc", "build/gen_test.cc"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("")
    registered = [tmp_path / "tests/python/test_a.py", tmp_path / "srv/x_test.cc"]
    assert unregistered(tmp_path, registered, ["kernels/"]) == ["srv/y_test.cc", "tests/python/test_b.py"]
    assert unregistered(tmp_path, registered) == ["kernels/k_test.cc", "srv/y_test.cc", "tests/python/test_b.py"]
