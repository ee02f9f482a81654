#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""contrib/systemd/umbp-daemon@.service as meson generates it: its ExecStart
is the installed umbp, it has what docs/operations.md promises, and
`systemd-analyze verify` accepts it.

systemd-analyze verify checks that ExecStart's binary exists and is
executable. The installed path (PREFIX/bin/umbp) does not exist in a build
tree, and `systemd-analyze --root=DIR verify` is no way round it: under a root
it also needs sysinit.target, /bin/kill and the rest of an installed system
there (tried: "Unit sysinit.target not found"). So the test verifies a copy of
the generated unit whose ExecStart path, and only that, is replaced by the
build tree's umbp; the generated unit itself is checked to name the installed
path. Any message from verify fails the test, since a key it cannot parse is
only a warning (exit 0) to it.

argv: the generated unit, the installed umbp path it must name."""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import taplib  # noqa: E402

UNIT, INSTALLED = sys.argv[1], sys.argv[2]
TOOL = os.path.abspath(os.environ["UMBP_TOOL"])
ANALYZE = shutil.which("systemd-analyze")
if not ANALYZE:
    print("1..0 # SKIP systemd-analyze is missing: install Debian's systemd package (scripts/setup.sh does)")
    sys.exit(77)

with open(UNIT) as f:
    TEXT = f.read()
TMP = tempfile.mkdtemp(prefix="umbp-unit-")


def keys(section):
    """Key=value lines of one [section], in order."""
    m = re.search(r"^\[" + section + r"\]\n(.*?)(?=^\[|\Z)", TEXT, re.M | re.S)
    assert m, f"no [{section}]"
    return [ln.split("=", 1) for ln in m.group(1).splitlines() if ln and not ln.startswith("#") and "=" in ln]


def verify(name, text):
    p = os.path.join(TMP, name)
    with open(p, "w") as f:
        f.write(text)
    r = subprocess.run([ANALYZE, "verify", p], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout + r.stderr


checks, check = taplib.registry()


@check("ExecStart is the installed umbp, the pool is the instance, --group and --foreground are there")
def _():
    ex = dict(keys("Service"))["ExecStart"]
    assert ex.split()[0] == INSTALLED, (ex, INSTALLED)
    assert ex.split()[1:3] == ["daemon", "%i"], ex
    assert "--group ${UMBP_GROUP}" in ex and "--foreground" in ex and "--capacity ${UMBP_CAPACITY}" in ex, ex
    assert "@" not in ex.replace("%i", ""), "an unsubstituted @VAR@ is left: " + ex


@check("[Unit], [Service] (User, Group, Restart=on-failure, RemoveIPC note), [Install]")
def _():
    assert dict(keys("Unit")).get("Description")
    svc = dict(keys("Service"))
    assert svc["User"] == "umbp" and svc["Group"] == "umbp", svc
    assert svc["Restart"] == "on-failure" and svc["RemoveIPC"] == "no", svc
    assert "systemd-logind" in TEXT and "RemoveIPC=yes" in TEXT, "the RemoveIPC comment is gone"
    for bad in ("PrivateDevices", "PrivateIPC"):  # a private /dev/shm would hide the pool from the engines
        assert bad not in svc, bad
    assert dict(keys("Install"))["WantedBy"] == "multi-user.target"


@check("Type=notify: the daemon sends READY=1 to $NOTIFY_SOCKET, and only once its pool exists")
def _():
    assert dict(keys("Service"))["Type"] == "notify", "systemctl start would return before the pool exists"
    assert "--foreground" in dict(keys("Service"))["ExecStart"]  # the main pid, which systemd listens to
    for where in ("file", "abstract"):
        name = f"unit-notify-{where}-{os.getpid()}"
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        addr = os.path.join(TMP, "notify") if where == "file" else f"\0umbp-unit-test-{os.getpid()}"
        sock.bind(addr)
        sock.settimeout(10)
        env = dict(os.environ, NOTIFY_SOCKET=addr if where == "file" else "@" + addr[1:])
        d = subprocess.Popen([TOOL, "daemon", name, "--capacity", "16MiB", "--slot-size", "256KiB",
                              "--foreground"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        try:
            try:
                msg = sock.recv(4096)
            except socket.timeout:
                raise AssertionError(f"no READY=1 within 10 s ({where} socket)") from None
            assert msg == b"READY=1", msg
            info = subprocess.run([TOOL, "pool", "info", name], capture_output=True, text=True, timeout=30)
            assert info.returncode == 0, info.stderr
        finally:
            d.terminate()
            err = d.communicate(timeout=30)[1].decode(errors="replace")
            sock.close()
            if where == "file":
                os.unlink(addr)
            subprocess.run([TOOL, "pool", "destroy", name], capture_output=True, timeout=30)
        assert d.returncode == 0 and "NOTIFY_SOCKET" not in err, (d.returncode, err)


@check("systemd-analyze verify passes (ExecStart pointed at the build tree's umbp)")
def _():
    text = TEXT.replace("ExecStart=" + INSTALLED + " ", "ExecStart=" + TOOL + " ")
    assert text != TEXT
    for name in ("umbp-daemon@.service", "umbp-daemon@kv.service", "umbp-daemon@kv-1.2_b.service"):
        rc, out = verify(name, text)
        assert rc == 0 and not out.strip(), (name, rc, out)


@check("and fails on a broken copy, so the check above can fail")
def _():
    rc, out = verify("umbp-daemon@bad.service", TEXT.replace("Restart=on-failure", "Restart=sometimes"))
    assert rc != 0 or out.strip(), out
    rc, out = verify("umbp-daemon@kv.service", TEXT)  # the installed path, not installed here
    if os.path.exists(INSTALLED):
        return "SKIP " + INSTALLED + " exists on this machine"
    assert rc != 0 and "not executable" in out, (rc, out)


rc = taplib.run(checks)
shutil.rmtree(TMP, ignore_errors=True)
sys.exit(rc)
