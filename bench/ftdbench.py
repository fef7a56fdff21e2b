"""Shared pieces of the GPU benchmarks that go through the service: a random token file, and an ftd
daemon on free loopback ports with the ftctl command line that reaches it."""
import socket
import subprocess
import time
from pathlib import Path

import numpy as np


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def token_file(path, n, vocab=128256, seed=0):
    """n random uint32 token ids (docs/data-format.md)."""
    np.random.default_rng(seed).integers(0, vocab, size=n, dtype=np.uint32).astype("<u4").tofile(path)
    return Path(path)


def start_ftd(build, data_dir, log_path, *flags):
    """Starts ftd (with `flags` added) and waits until it answers; returns (process, ftctl argv prefix,
    metrics address)."""
    # Clients on ftd's unix socket: the benchmark, as the user who started ftd, is an admin there.
    sock, metrics = Path(data_dir) / "ftd.sock", f"127.0.0.1:{free_port()}"
    addr = f"unix:{sock}"
    log = open(log_path, "wb")
    proc = subprocess.Popen([str(Path(build) / "server" / "ftd"), "--listen", "", "--socket", str(sock),
                             "--metrics-listen", metrics, "--data-dir", str(data_dir), *flags], stdout=log, stderr=log)
    ftctl = [str(Path(build) / "client" / "ftctl"), "--addr", addr]
    deadline = time.time() + 30
    while time.time() < deadline:
        if subprocess.run(ftctl + ["list", "--timeout", "1"], capture_output=True).returncode == 0:
            return proc, ftctl, metrics
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"ftd did not start (log: {log_path})")
