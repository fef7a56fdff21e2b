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
    **{lib: {WORKER, CLIENT, KERNELS, TORCH} for lib in ("ftd_server_common", "ftd_store", "ftd_auth", "ftd_requests",
                                                           "ftd_executor_local", "ftd_policy", "ftd_jobs", "ftd_api")},
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

# Inside server/: the folders each one's library sits on (docs/architecture.md's picture). A library's
# translation units may include headers of its own folder and of the folders below it, transitively;
# executors/ itself holds what every executor shares (exit_status.h).
SERVER_BELOW = {
    "common": set(),
    "store": {"common"},
    "auth": {"common"},
    "requests": {"common"},
    "executors": set(),
    "executors/local": {"executors", "store", "common"},
    "policy": {"executors", "common"},
    "jobs": {"policy", "requests", "executors", "store", "common"},
    "api": {"jobs", "auth", "requests", "common"},
}
SERVER_LIB = {"ftd_server_common": "common", "ftd_store": "store", "ftd_auth": "auth", "ftd_requests": "requests",
              "ftd_executor_local": "executors/local", "ftd_policy": "policy", "ftd_jobs": "jobs", "ftd_api": "api"}


def below(folder):
    out, todo = set(), [folder]
    while todo:
        f = todo.pop()
        if f not in out:
            out.add(f)
            todo.extend(SERVER_BELOW[f])
    return out


def server_folder(rel):
    """server/jobs/job_manager.h -> "jobs"; server/executors/local/x.h -> "executors/local"; server/x.h -> "server"."""
    parts = rel.split("/")[1:-1]
    if not parts:
        return "server"
    return "/".join(parts[:2]) if parts[0] == "executors" and len(parts) > 1 else parts[0]

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


def test_the_servers_folders_include_only_the_folders_below_them():
    """Inside server/, the arrows run one way: no folder's library includes a header of a folder above
    or beside it (jobs -> policy, never policy -> jobs), nor of server/ itself (main's flags, start-up). The job manager sees only the executor interface
    (executors/executor.h), never the local executor."""
    deps = recorded_deps()
    seen, violations = set(), []
    for obj, (target, headers) in sorted(deps.items()):
        folder = SERVER_LIB.get(target)
        if folder is None or not headers:
            continue
        seen.add(target)
        allowed = below(folder)
        for h in headers[1:]:
            try:
                rel = Path(h).relative_to(ROOT).as_posix()
            except ValueError:
                continue
            if rel.startswith(SERVER) and server_folder(rel) not in allowed:
                violations.append(f"{obj} ({target}, server/{folder}) includes {rel}")
    assert not violations, "\n".join(violations[:40])
    assert set(SERVER_LIB) <= seen, f"no recorded dependencies for {set(SERVER_LIB) - seen}"


def test_the_folder_check_finds_an_arrow_the_wrong_way():
    # The check above can fail: a policy header including the job manager is outside policy's folders.
    assert server_folder("server/jobs/job_manager.h") not in below("policy")
    assert server_folder("server/executors/executor.h") in below("jobs")
    assert server_folder("server/executors/local/worker_launcher.h") not in below("jobs")
    assert server_folder("server/executors/exit_status.h") == "executors"
    assert server_folder("server/daemon_flags.h") not in below("api")
