#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""scripts/setup.sh installs what the README's steps need from Debian: for
each file a step uses, the Debian package that owns it on this machine
(dpkg -S) is in setup.sh's list, or a dependency of a package in it. A file
that is missing here, or that no package owns (another Python, a file
installed by hand), is skipped with a note: then this machine cannot say.

argv: the source root."""
import glob
import os
import re
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import taplib  # noqa: E402

ROOT = sys.argv[1]
if not shutil.which("dpkg-query"):
    print("1..0 # SKIP not a Debian system (no dpkg-query)")
    sys.exit(77)
with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
    m = re.search(r"^pkgs=\((.*?)\)", f.read(), re.M | re.S)
PKGS = m.group(1).split()


def dpkg(*args):
    r = subprocess.run(["dpkg-query", *args], capture_output=True, text=True, timeout=60)
    return r.stdout if r.returncode == 0 else ""


def owner(pattern):
    """The package owning the first file matching `pattern`, or a SKIP string."""
    files = sorted(glob.glob(pattern))
    if not files:
        return f"SKIP {pattern} is not on this machine"
    out = dpkg("-S", files[0])
    if not out:
        return f"SKIP no Debian package owns {files[0]}"
    return out.split(":")[0].strip()


def provided():
    """The packages of setup.sh's list and their direct dependencies."""
    have = set(PKGS)
    for p in PKGS:
        deps = dpkg("-W", "-f=${Depends},${Pre-Depends}", p)
        have |= {re.split(r"[ :(]", d.strip())[0] for alt in deps.split(",") for d in alt.split("|") if d.strip()}
    return have


HAVE = provided()
checks, check = taplib.registry()
NEEDS = [
    ("python3 -m venv (scripts/setup-python.sh, the wheel suite): ensurepip", "/usr/lib/python3.*/ensurepip/__init__.py"),
    ("systemd-analyze (the systemd-unit check)", "/usr/bin/systemd-analyze"),
    ("pkg-config (meson's dependency lookups)", "/usr/bin/pkg-config"),
    ("the C library's headers", "/usr/include/stdio.h"),
]
for what, pattern in NEEDS:
    def fn(pattern=pattern, what=what):
        pkg = owner(pattern)
        if pkg.startswith("SKIP"):
            return pkg
        assert pkg in HAVE, f"{what}: {pattern} is in Debian's {pkg}, which scripts/setup.sh does not install"
    check(f"setup.sh installs {what}")(fn)

sys.exit(taplib.run(checks))
