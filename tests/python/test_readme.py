"""The README's "Using it" commands and docs/ftctl.md's command block run as written, top to bottom,
against a real ftd on the CPU, with ftd, ftd-worker and ftctl from `cmake --install` on PATH. A block
that needs a model directory (/models/...) cannot run on a CPU machine without one and is left out."""
import os
import re
import subprocess
from pathlib import Path

import pytest

from ftdservice import Daemon
from ftdtest import BUILD, ROOT


def sh_blocks(path, section=None):
    text = (ROOT / path).read_text()
    if section:
        text = text[text.index(section):]
        text = text[:text.index("\n## ", 1)] if "\n## " in text[1:] else text
    return [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "/models/" not in b]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("prefix")
    p = subprocess.run(["cmake", "--install", str(BUILD), "--prefix", str(prefix)], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stderr
    for exe in ("ftd", "ftd-worker", "ftctl"):
        assert (prefix / "bin" / exe).exists(), exe
    unit = (prefix / "lib" / "systemd" / "system" / "ftd.service").read_text()
    assert f"ExecStart={prefix}/bin/ftd " in unit
    # The worker's runtime path names only directories that exist (LibTorch's, in this clone's
    # .venv), and the install says that the worker depends on them.
    dynamic = subprocess.run(["readelf", "-d", str(prefix / "bin" / "ftd-worker")], capture_output=True, text=True,
                             check=True).stdout
    runpath = re.search(r"\((?:RUNPATH|RPATH)\).*\[(.*)\]", dynamic).group(1).split(":")
    assert runpath and all(d and Path(d).is_dir() for d in runpath), runpath
    torch_lib = next(d for d in runpath if Path(d, "libtorch_cpu.so").exists())
    assert f"ftd-worker loads LibTorch from {torch_lib}" in p.stdout and "breaks the installed ftd-worker" in p.stdout, \
        p.stdout
    return prefix


@pytest.mark.parametrize("doc,section", [("README.md", "## Using it"), ("docs/ftctl.md", None)])
def test_documented_commands_run_as_written(tmp_path, installed, doc, section):
    blocks = sh_blocks(doc, section)
    assert blocks, f"no sh block in {doc}"
    d = Daemon(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    # docs/ftctl.md's examples use the spec file the README makes
    subprocess.run([str(installed / "bin" / "ftd-worker"), "default-spec"], stdout=open(work / "job.json", "w"),
                   check=True, timeout=60)
    env = dict(os.environ, PATH=f"{installed / 'bin'}:{os.environ['PATH']}", FTD_ADDR=d.addr)
    try:
        for block in blocks:
            p = subprocess.run(["bash", "-euo", "pipefail", "-x", "-c", block], cwd=work, env=env, capture_output=True,
                               text=True, timeout=600)
            assert p.returncode == 0, f"{doc}: a command failed:\n{p.stderr[-3000:]}"
        assert (work / "trace.json").stat().st_size > 0
    finally:
        d.stop()
