"""Fixtures shared by the pytest suites."""
import pytest


@pytest.fixture
def daemon(tmp_path):
    """A real ftd on loopback ports with one CPU slot (tests/python/ftdservice.py), stopped after the test."""
    from ftdservice import Daemon
    d = Daemon(tmp_path)
    yield d
    d.stop()


SKIPPED_EXIT_CODE = 77  # SKIP_RETURN_CODE in cmake/FtdTests.cmake


def pytest_sessionfinish(session, exitstatus):
    """Tells ctest what happened through the exit code: 77 when every test skipped (ctest shows
    "Skipped", not "Passed"), and a failure when any test skipped while FTD_TEST_NO_SKIP is set
    (scripts/gpu.sh: on a GPU machine a GPU test must not skip)."""
    import os
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    stats = reporter.stats if reporter is not None else {}
    skipped = len(stats.get("skipped", []))
    ran = sum(len(stats.get(k, [])) for k in ("passed", "failed", "error", "xfailed", "xpassed"))
    if skipped and os.environ.get("FTD_TEST_NO_SKIP", "") not in ("", "0"):
        if reporter is not None:
            reporter.write_line(f"{skipped} test(s) skipped with FTD_TEST_NO_SKIP set: counted as a failure")
        session.exitstatus = 1
    elif exitstatus == 0 and skipped and not ran:
        session.exitstatus = SKIPPED_EXIT_CODE
