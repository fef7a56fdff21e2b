"""Fixtures shared by the pytest suites."""
import pytest


@pytest.fixture
def daemon(tmp_path):
    """A real ftd on loopback ports with one CPU slot (tests/python/ftdservice.py), stopped after the test."""
    from ftdservice import Daemon
    d = Daemon(tmp_path)
    yield d
    d.stop()
