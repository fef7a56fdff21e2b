#!/usr/bin/env python3
"""Fails if a std:: symbol of one of our executables binds into LibTorch's libraries at run time.

The PyPI LibTorch exports unversioned copies of parts of libstdc++ (docs/building.md); where one of
our calls binds to such a copy it runs code built against another libstdc++ (a std::filesystem::
remove_all that jumped to address 0). The build puts libstdc++.so.6 first in each executable's
DT_NEEDED list (ftd_torch in CMakeLists.txt); this check proves the result with the dynamic linker
itself.

usage: check_std_bindings.py BUILD_DIR

Every ELF executable under BUILD_DIR that needs a LibTorch library is loaded by ld.so in trace mode
(LD_TRACE_LOADED_OBJECTS: nothing of the program runs) with LD_BIND_NOW and LD_DEBUG=bindings, so
every symbol is bound as a run would bind it. A binding from the executable into the directory that
holds libtorch.so fails the check when the symbol is one libstdc++ or libgcc_s defines, or when it
demangles into the std, __gnu_cxx or __cxxabiv1 namespaces.
"""
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

TORCH_LIB = re.compile(r"^lib(torch|c10)[\w.-]*\.so")
BINDING = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: \w+ symbol `([^']+)'")
STD_PREFIXES = ("std::", "__gnu_cxx::", "__cxxabiv1::", "typeinfo for std::", "typeinfo name for std::",
                "vtable for std::", "VTT for std::", "construction vtable for std::", "operator new",
                "operator delete")
# The executables that must be found, so the check cannot pass by finding nothing.
REQUIRED = ("ftd-worker", "ftd-parity")


def needed(path):
    try:
        out = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True).stdout
    except subprocess.CalledProcessError:
        return []
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", out)


def torch_executables(build):
    """ELF executables (they have a program interpreter) under build that need a LibTorch library."""
    found = []
    for root, dirs, files in os.walk(build):
        dirs[:] = [d for d in dirs if d != "CMakeFiles"]
        for name in files:
            p = Path(root) / name
            if p.is_symlink() or not os.access(p, os.X_OK):
                continue
            with open(p, "rb") as f:
                if f.read(4) != b"\x7fELF":
                    continue
            if not any(TORCH_LIB.match(n) for n in needed(p)):
                continue
            headers = subprocess.run(["readelf", "-l", str(p)], capture_output=True, text=True).stdout
            if "Requesting program interpreter" in headers:
                found.append(p)
    return sorted(found)


def defined_symbols(lib):
    out = subprocess.run(["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True).stdout
    return {line.split()[-1].split("@")[0] for line in out.splitlines() if line.strip()}


def demangle(names):
    if not names:
        return {}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return dict(zip(names, out.splitlines()))


def trace(exe):
    """(loaded objects: soname -> path, bindings from exe: [(to_path, symbol)])"""
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LD_TRACE_LOADED_OBJECTS="1", LD_BIND_NOW="1", LD_WARN="yes",
                   LD_DEBUG="bindings", LD_DEBUG_OUTPUT=str(Path(tmp) / "trace"))
        env.pop("LD_PRELOAD", None)
        p = subprocess.run([str(exe)], env=env, capture_output=True, text=True, timeout=300)
        loaded = dict(re.findall(r"^\s*(\S+) => (\S+) \(0x", p.stdout, re.M))
        bindings = []
        real = os.path.realpath(exe)
        for f in Path(tmp).iterdir():
            for line in f.read_text(errors="replace").splitlines():
                m = BINDING.search(line)
                if m and os.path.realpath(m.group(1)) == real:
                    bindings.append((m.group(2), m.group(3)))
    return p, loaded, bindings


def main():
    build = Path(sys.argv[1]).resolve()
    exes = torch_executables(build)
    names = {e.name for e in exes}
    missing = [r for r in REQUIRED if r not in names]
    if missing:
        print(f"check_std_bindings: {', '.join(missing)} not found under {build} (build them first)")
        return 1
    failures = 0
    for exe in exes:
        p, loaded, bindings = trace(exe)
        torch_dirs = {os.path.dirname(os.path.realpath(path)) for so, path in loaded.items() if TORCH_LIB.match(so)}
        std_libs = [path for so, path in loaded.items() if so.startswith(("libstdc++.so", "libgcc_s.so"))]
        if not torch_dirs or not std_libs or not bindings:
            print(f"{exe}: could not trace its bindings (ld.so exit {p.returncode}): {p.stderr.strip()[:500]}")
            failures += 1
            continue
        libstd = set().union(*(defined_symbols(l) for l in std_libs))
        into_std = sum(1 for to, _ in bindings if to in std_libs or os.path.realpath(to) in map(os.path.realpath, std_libs))
        into_torch = [(to, sym) for to, sym in bindings if os.path.dirname(os.path.realpath(to)) in torch_dirs]
        names = demangle(sorted({s for _, s in into_torch}))
        bad = sorted({(os.path.basename(to), names[s]) for to, s in into_torch
                      if s in libstd or names[s].startswith(STD_PREFIXES)})
        rel = exe.relative_to(build)
        if bad:
            failures += 1
            print(f"FAIL {rel}: {len(bad)} libstdc++ symbols bind into LibTorch's libraries "
                  f"(link it through ftd_torch; docs/building.md):")
            for lib, sym in bad:
                print(f"    {lib}: {sym}")
        else:
            print(f"ok   {rel}: {len(bindings)} bindings, {into_std} into libstdc++/libgcc_s, "
                  f"{len(into_torch)} into LibTorch (none of them libstdc++'s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
