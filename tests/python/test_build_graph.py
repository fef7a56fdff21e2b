"""The layers, checked on the build graph itself (docs/architecture.md):

    client -> spec <- server,  worker -> spec,  worker -> kernels,  server and worker -> util,
    everything -> proto

ftctl and ftd link nothing from the engine (ftd_engine_core, ftd_engine, ftd_kernels, LibTorch): read
from the link command ninja runs. No translation unit includes a header from a layer above it or
beside it, the engine's never include generated protobuf headers (LibTorch bundles its own), and the
agent and CLI never include LibTorch: read from the header dependencies the compiler recorded
(`ninja -t deps`). Runs on a built tree (ctest runs after the build).
"""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUILD = Path(os.environ.get("FTD_BUILD_DIR", ROOT / "build")).resolve()
NINJA = os.environ.get("FTD_NINJA") or shutil.which("ninja")

# What a library or program file name must not be, for a program that must not link the engine.
ENGINE_LIBS = re.compile(r"(^|/)(libftd_engine_core\.a|libftd_engine\.a|libftd_kernels\.a|libftd_worker_reports\.a|"
                         r"libtorch[^/]*\.so[^/]*|libc10[^/]*\.so[^/]*)$")

# Header classes, by the path of the included file.
WORKER, SERVER, CLIENT, KERNELS, SPEC = "worker/", "server/", "client/", "kernels/", "spec/"
TORCH = "LibTorch"      # anything under a torch/include directory
PROTO_GEN = "protobuf"  # our generated .pb.h files

# Per build target: the header classes its translation units must not include.
FORBIDDEN = {
    "ftd_spec_core": {WORKER, SERVER, CLIENT, KERNELS, TORCH, PROTO_GEN},
    "ftd_spec": {WORKER, SERVER, CLIENT, KERNELS, TORCH},
    "ftd_client": {WORKER, SERVER, KERNELS, TORCH},
    "ftctl": {WORKER, SERVER, KERNELS, TORCH},
    "ftd_server": {WORKER, CLIENT, KERNELS, TORCH},
    "ftd_daemon": {WORKER, CLIENT, KERNELS, TORCH},
    "ftd": {WORKER, CLIENT, KERNELS, TORCH},
    "ftd_engine_core": {SERVER, CLIENT, PROTO_GEN},
    "ftd_engine": {SERVER, CLIENT, PROTO_GEN},
    "ftd_worker_reports": {SERVER, CLIENT, TORCH},
    "ftd-worker": {SERVER, CLIENT, TORCH},
    "ftd_kernels": {WORKER, SERVER, CLIENT, SPEC, TORCH},
    "ftd_tokenizer": {SERVER, CLIENT, KERNELS, SPEC, TORCH, PROTO_GEN},
    "ftd_tokenize_cli": {SERVER, CLIENT, KERNELS, SPEC, TORCH, PROTO_GEN},
    "ftd_dir_tree": {WORKER, SERVER, CLIENT, KERNELS, SPEC, TORCH, PROTO_GEN},
}
OPTIONAL = {"ftd_kernels"}  # built only where nvcc is present

pytestmark = pytest.mark.skipif(not (BUILD / "build.ninja").exists() or NINJA is None,
                                reason=f"needs a Ninja build in {BUILD}")


def ninja(*args):
    return subprocess.run([NINJA, "-C", str(BUILD), *args], check=True, capture_output=True, text=True).stdout


def link_inputs(program):
    """The libraries on the command line that links `program` (a path relative to the build dir)."""
    cmd = ninja("-t", "commands", "-s", program).strip().splitlines()[-1]
    return [t for t in cmd.split() if t.startswith("-l") or re.search(r"\.a$|\.so(\.[0-9.]+)?$", t)]


def header_class(path):
    """The class of an included file (absolute path), or None for system and third-party headers."""
    if "/torch/include/" in path:
        return TORCH
    gen = str(BUILD / "proto" / "gen") + os.sep
    if path.startswith(gen) and path.endswith(".pb.h"):
        return PROTO_GEN
    try:
        rel = Path(path).relative_to(ROOT).as_posix()
    except ValueError:
        return None
    for cls in (WORKER, SERVER, CLIENT, KERNELS, SPEC):
        if rel.startswith(cls):
            return cls
    return None


def recorded_deps():
    """{object file: (build target, [included files])} for every object in the build graph."""
    objects = [line.split(":")[0] for line in ninja("-t", "targets", "all").splitlines()
               if re.match(r"^\S+\.o: ", line)]
    deps, current = {}, None
    for line in ninja("-t", "deps", *objects).splitlines():
        if line and not line.startswith(" "):
            obj = line.split(":")[0]
            m = re.search(r"CMakeFiles/([^/]+)\.dir/", obj)
            current = deps.setdefault(obj, (m.group(1) if m else "", []))
        elif line.strip() and current is not None:
            current[1].append(os.path.normpath(os.path.join(BUILD, line.strip())))
    return deps


@pytest.mark.parametrize("program", ["client/ftctl", "server/ftd"])
def test_ftctl_and_ftd_link_nothing_from_the_engine(program):
    libs = link_inputs(program)
    bad = [l for l in libs if ENGINE_LIBS.search(l)]
    assert not bad, f"{program} links the engine: {bad}"
    assert any(l.endswith("spec/libftd_spec.a") for l in libs), f"{program} should link ftd_spec: {libs}"


def test_the_worker_links_the_engine_and_the_spec():
    # The same reading finds the engine where it belongs, so the checks above can fail.
    libs = link_inputs("worker/ftd-worker")
    assert any(l.endswith("worker/libftd_engine.a") for l in libs), libs
    assert any(l.endswith("spec/libftd_spec.a") for l in libs), libs


def test_no_translation_unit_includes_a_layer_it_must_not():
    deps = recorded_deps()
    seen, violations = set(), []
    for obj, (target, headers) in sorted(deps.items()):
        if target not in FORBIDDEN or not headers:
            continue
        seen.add(target)
        source = Path(headers[0]).relative_to(ROOT).as_posix() if headers[0].startswith(str(ROOT)) else headers[0]
        for h in headers[1:]:
            cls = header_class(h)
            if cls in FORBIDDEN[target]:
                violations.append(f"{source} ({target}) includes {cls} header {h}")
    assert not violations, "\n".join(violations[:40])
    assert set(FORBIDDEN) - OPTIONAL <= seen, f"no recorded dependencies for {set(FORBIDDEN) - OPTIONAL - seen}"
