#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The index on huge pages for a user who is not root (the daemon of
contrib/systemd runs as the `umbp` system user).

The index file goes on the first hugetlbfs mount, which on most systems only
root may write. A user who may not write it is told which mount, its owner and
mode, and the fix (docs/operations.md, "Huge pages for a daemon that is not
root"); and the fix works, in both forms the docs give (chgrp + chmod 1775 on
the mount, and a mount with gid= and mode=).

The checks run in a mount namespace of their own (unshare -m, private
propagation) with a fresh hugetlbfs mounted over the first hugetlbfs mount's
path (or, without one, on a temporary directory, then the first): the host's
mount and its mode are never touched. The pools' main files are in the host's
/dev/shm; each check removes its pool inside the namespace, where its index
file is. Needs root, unshare(1), runuser(1), a 'nobody' user and 2 free 2 MiB
huge pages; says why it skips otherwise."""
import grp
import json
import os
import pwd
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import taplib  # noqa: E402

TOOL = os.path.abspath(os.environ["UMBP_TOOL"])
INSIDE = "UMBP_HUGETLBFS_USER_NS"


def first_hugetlbfs():
    with open("/proc/mounts") as f:
        for line in f:
            dev, path, fstype = line.split()[:3]
            if fstype == "hugetlbfs":
                return path
    return None


def free_huge_pages():
    try:
        with open("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages") as f:
            return int(f.read())
    except OSError:
        return 0


def skip_all(why):
    print(f"1..0 # SKIP {why}")
    sys.exit(0)


if os.environ.get(INSIDE) is None:
    if os.geteuid() != 0:
        skip_all("needs root (to mount a private hugetlbfs and run commands as 'nobody')")
    for prog in ("unshare", "runuser"):
        if not shutil.which(prog):
            skip_all(f"{prog} is missing (Debian package util-linux)")
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        skip_all("no 'nobody' user to run the commands as")
    if free_huge_pages() < 2:
        skip_all(f"needs 2 free 2 MiB huge pages, {free_huge_pages()} are free (sysctl vm.nr_hugepages=N)")
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "mount", "-t", "hugetlbfs", "-o", "pagesize=2M",
                        "none", first_hugetlbfs() or "/mnt"], capture_output=True, text=True, timeout=30)
    if r.returncode != 0:
        skip_all(f"cannot mount a private hugetlbfs in a mount namespace here: {r.stderr.strip()}")
    env = dict(os.environ, **{INSIDE: "1"})
    os.execvpe("unshare", ["unshare", "-m", "--propagation", "private", sys.executable, os.path.abspath(__file__)],
               env)

NOBODY = pwd.getpwnam("nobody")
GROUP = grp.getgrgid(NOBODY.pw_gid).gr_name
MNT = first_hugetlbfs()
OWN_DIR = None
if MNT is None:
    OWN_DIR = MNT = tempfile.mkdtemp(prefix="umbp-hugetlbfs-")
NAME = f"t-hugeuser-{os.getppid()}"


def mount(opts):
    """A fresh hugetlbfs over MNT (stacked on the last one: the path resolves to it)."""
    r = subprocess.run(["mount", "-t", "hugetlbfs", "-o", "pagesize=2M" + ("," + opts if opts else ""), "none", MNT],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, f"mount -t hugetlbfs on {MNT}: {r.stderr}"
    assert first_hugetlbfs() is not None


def as_nobody(*args, user="nobody"):
    r = subprocess.run(["runuser", "-u", user, "--", TOOL, *args], capture_output=True, text=True, timeout=120)
    return r.returncode, r.stdout, r.stderr


def cleanup():
    subprocess.run([TOOL, "pool", "destroy", NAME, "--force"], capture_output=True, timeout=60)
    # unmount every hugetlbfs this process stacked on MNT (the host's stays: other namespace)
    while subprocess.run(["umount", MNT], capture_output=True).returncode == 0 and MNT == OWN_DIR:
        pass


def index_pages():
    r = subprocess.run([TOOL, "pool", "info", NAME, "--json"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)["index_hugepages"]


checks, check = taplib.registry()


@check("a user who may not write the hugetlbfs mount is told its owner, its mode and the fix")
def _():
    mount("mode=0755")
    rc, out, err = as_nobody("pool", "create", NAME, "--capacity", "16MiB", "--index-pages", "huge")
    assert rc == 1, (rc, out, err)
    for want in (f"the hugetlbfs mount {MNT} (owner uid 0, group gid 0, mode 0755)",
                 f"does not let uid {NOBODY.pw_uid} create the index file there",
                 f"chgrp {GROUP} {MNT} && chmod 1775 {MNT}", "\"Huge pages for a daemon that is not root\"",
                 "or use --index-pages small"):
        assert want in err, (want, err)
    assert "Traceback" not in err and NAME not in subprocess.run([TOOL, "pool", "ls"], capture_output=True,
                                                                  text=True).stdout


@check("--index-pages try (the default) falls back to 4 KiB pages at once, and its note names the fix")
def _():
    mount("mode=0755")
    rc, out, err = as_nobody("pool", "create", NAME, "--capacity", "16MiB")
    assert rc == 0, (rc, out, err)
    assert "index on 4 KiB pages" in out, out
    assert f"chgrp {GROUP} {MNT} && chmod 1775 {MNT}" in err and "then re-create the pool" in err, err
    assert index_pages() is False
    rc, _, err = as_nobody("pool", "destroy", NAME)
    assert rc == 0, err


@check("the fix as the message gives it (chgrp GROUP MNT && chmod 1775 MNT): the index on 2 MiB pages")
def _():
    mount("mode=0755")
    r = subprocess.run(f"chgrp {GROUP} {MNT} && chmod 1775 {MNT}", shell=True, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    rc, out, err = as_nobody("pool", "create", NAME, "--capacity", "16MiB", "--index-pages", "huge")
    assert rc == 0, (rc, out, err)
    assert "index on 2 MiB pages" in out, out
    assert index_pages() is True
    st = os.stat(os.path.join(MNT, f"umbp-index.{NAME}"))
    assert st.st_uid == NOBODY.pw_uid, st
    rc, _, err = as_nobody("pool", "destroy", NAME)
    assert rc == 0, err
    assert not os.path.exists(os.path.join(MNT, f"umbp-index.{NAME}"))


@check("the boot-time form (a hugetlbfs mounted with gid= and mode=1775, as in /etc/fstab): 2 MiB pages")
def _():
    mount(f"gid={NOBODY.pw_gid},mode=1775")
    rc, out, err = as_nobody("pool", "create", NAME, "--capacity", "16MiB", "--index-pages", "huge")
    assert rc == 0, (rc, out, err)
    assert index_pages() is True
    rc, _, err = as_nobody("pool", "destroy", NAME)
    assert rc == 0, err


try:
    status = taplib.run(checks, after_each=cleanup)
finally:
    cleanup()
    if OWN_DIR:
        os.rmdir(OWN_DIR)
sys.exit(status)
