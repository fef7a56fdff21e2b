"""ftctl as a daily tool, against real ftd daemons on loopback (or none at all): fast and clear
failures without a daemon, addresses, specs from stdin and YAML, relative paths, output formats, list
options, several ids to cancel. Every wait is bounded."""
import subprocess
import time

from ftdservice import FTD, Daemon, free_port, stop_process


def test_ftd_refuses_a_port_in_use_at_once(tmp_path, daemon):
    # A second ftd on the first one's port must fail fast and say why on stderr (gRPC's default
    # SO_REUSEPORT would let it start and share the port).
    t0 = time.monotonic()
    p = subprocess.Popen([str(FTD), "--listen", daemon.addr, "--metrics-listen", "",
                          "--data-dir", str(tmp_path / "second"), "--gpus", "0"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, err = p.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        stop_process(p)
        raise AssertionError("a second ftd on a port in use kept running")
    assert p.returncode != 0
    assert f"cannot listen on --listen {daemon.addr}" in err and "in use" in err, err
    assert time.monotonic() - t0 < 5
