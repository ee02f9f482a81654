#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""umbp started with standard output or error closed (a caller's '2>&-', a
supervisor that closed them): the pool's segment must not become fd 1 or 2.
Before, `umbp daemon NAME 2>&-` got its segment as fd 2 and wrote its log
over the pool's header: the pool was refused ("not a umbp pool", the magic
now log text) and the daemon died of SIGSEGV. Every command now opens a
closed fd among 0-2 on /dev/null first (tools/umbp.c)."""
import os
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import taplib  # noqa: E402

TOOL = os.path.abspath(os.environ["UMBP_TOOL"])
checks, check = taplib.registry()


def tool(*args):
    return subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=60)


def fd_target(pid, fd):
    try:
        return os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return None


def closed(*fds):
    """preexec_fn closing fds in the child before exec (as '2>&-' does)."""
    def fn():
        for fd in fds:
            os.close(fd)
    return fn


@check("a daemon with stdout and stderr closed serves an intact pool and stops cleanly")
def t_daemon():
    name = f"t-stdfd-{os.getpid()}"
    tool("pool", "destroy", name, "--force")
    # the daemon tells systemd it is ready (sd_notify) right after it logged
    # 'ready' to fd 2: that message says when the log line has been written
    tmp = tempfile.mkdtemp(prefix="umbp-stdfd-")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(os.path.join(tmp, "notify"))
    sock.settimeout(60)
    env = dict(os.environ, NOTIFY_SOCKET=os.path.join(tmp, "notify"))
    p = subprocess.Popen([TOOL, "daemon", name, "--capacity", "64MiB", "--foreground"], stdin=subprocess.DEVNULL,
                         preexec_fn=closed(1, 2), env=env)
    try:
        for _ in range(200):
            r = tool("inspect", name, "--json")
            if r.returncode == 0:
                break
            time.sleep(0.05)
        assert r.returncode == 0, f"inspect {name}: {r.stdout}{r.stderr}"
        for fd in (1, 2):
            t = fd_target(p.pid, fd)
            assert t == "/dev/null", f"the daemon's fd {fd} is {t}"
        try:
            msg = sock.recv(4096).decode()
        except socket.timeout:
            raise AssertionError("the daemon did not say it was ready within 60 s") from None
        assert "READY=1" in msg, f"the daemon's notify message: {msg!r}"
        r = tool("inspect", name, "--json")
        assert r.returncode == 0, f"inspect after the daemon logged: {r.stdout}{r.stderr}"
        p.terminate()
        rc = p.wait(timeout=30)
        assert rc == 0, f"the daemon exited {rc}"
        r = tool("pool", "ls")
        assert "not a umbp pool" not in r.stdout + r.stderr, r.stdout + r.stderr
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        tool("pool", "destroy", name, "--force")
        sock.close()
        os.unlink(os.path.join(tmp, "notify"))
        os.rmdir(tmp)


sys.exit(taplib.run(checks))
