#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Command-line checks of `umbp bench copy` (host backend; no GPU needed). Prints TAP.

Usage errors exit 2 and name the option; what a run leaves behind (its
private pool) is gone after it ends, however it ends.
"""
import os
import re
import signal
import subprocess
import sys
import time

TOOL = os.environ.get("UMBP_TOOL", "")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import taplib  # noqa: E402

results, check = taplib.registry()


def run(args, timeout=120):
    return subprocess.run([TOOL] + args, capture_output=True, text=True, timeout=timeout)


@check("an unknown option, a missing value or '=value' on a flag is a usage error that names the option")
def _():
    for args, want in ((["--bogus"], "unknown option '--bogus'"),
                       (["--threads"], "option '--threads' needs a value"),
                       (["--json=1"], "option '--json' takes no value"),
                       (["--cuda-c", "dma"], "option '--cuda-c' is ambiguous")):
        r = run(["bench", "copy"] + args)
        assert r.returncode == 2 and want in r.stderr and not r.stdout, "%s: exit %d, stderr %r" % (
            args, r.returncode, r.stderr)


@check("--threads and --reps take whole numbers in range: '2abc' and 2^32 + 2 are usage errors")
def _():
    for opt, bad in (("--threads", "2abc"), ("--threads", "4294967298"), ("--threads", "0"), ("--threads", "65"),
                     ("--threads", "1.0"), ("--reps", "4294967297"), ("--reps", "x"), ("--reps", "1001")):
        r = run(["bench", "copy", opt, bad, "--bytes", "1MiB", "--cases", "64KiBx2"])
        assert r.returncode == 2 and "%s '%s'" % (opt, bad) in r.stderr and not r.stdout, "%s %r: exit %d, %s" % (
            opt, bad, r.returncode, r.stderr)


@check("the table's header gives --bytes as a size: 512KiB is '512 KiB per job', not '0 MiB per job'")
def _():
    for arg, want in (("512KiB", "512 KiB per job"), ("1536KiB", "1.50 MiB per job")):
        r = run(["bench", "copy", "--bytes", arg, "--cases", "64KiBx2", "--reps", "1"])
        assert r.returncode == 0 and want in r.stdout.splitlines()[0], (arg, r.returncode, r.stdout, r.stderr)


@check("--cases that names no case is a usage error, not an empty table")
def _():
    for bad in ("", ",", ",,"):
        r = run(["bench", "copy", "--cases", bad, "--bytes", "1MiB", "--json"])
        assert r.returncode == 2 and "--cases '%s' names no case" % bad in r.stderr and not r.stdout, \
            "--cases %r: exit %d, stdout %r, stderr %r" % (bad, r.returncode, r.stdout, r.stderr)
    # an empty entry beside real ones, and a list longer than the parser's buffer (it was cut silently)
    for bad, want in (("64KiBx2,", "has an empty entry"), (",64KiBx2", "has an empty entry"),
                      ("64KiBx2,,1MiBx80", "has an empty entry"),
                      (",".join(["64KiBx2"] * 30 + ["%sKiBx80" % ("0" * 300 + "1024")]), "at most 511 characters")):
        r = run(["bench", "copy", "--cases", bad, "--bytes", "1MiB", "--reps", "1", "--json"])
        assert r.returncode == 2 and want in r.stderr and not r.stdout, \
            "--cases %r: exit %d, stdout %r, stderr %r" % (bad[:80], r.returncode, r.stdout, r.stderr)


@check("--cpus naming a CPU this process may not run on is a usage error naming the option and the CPUs allowed")
def _():
    allowed = sorted(os.sched_getaffinity(0))
    for bad in ("999", "%d,65535" % allowed[0]):
        r = run(["bench", "copy", "--cpus", bad, "--bytes", "1MiB", "--cases", "64KiBx2", "--reps", "1"])
        cpu = bad.split(",")[-1]
        # it was exit 1 from the engine: "cannot bind copy thread 0 to cpu 999", naming no option
        assert r.returncode == 2 and "--cpus '%s': CPU %s is not one this process may run on" % (bad, cpu) in \
            r.stderr and "use CPUs from %d" % allowed[0] in r.stderr and not r.stdout, "%s: exit %d, %s" % (
            bad, r.returncode, r.stderr)


@check("--cpus that is not a list of CPU numbers says what it takes")
def _():
    # it said "a list like 0,1,2" for 99999 (a list like that) and for a range
    for bad in ("99999", "0-1", "1,,2", "x"):
        r = run(["bench", "copy", "--cpus", bad, "--bytes", "1MiB", "--cases", "64KiBx2", "--reps", "1"])
        assert r.returncode == 2 and "--cpus '%s': CPU numbers 0 to 65535 separated by commas" % bad in r.stderr \
            and "no ranges" in r.stderr and not r.stdout, "%s: exit %d, %s" % (bad, r.returncode, r.stderr)


def pool_files(pid):
    """The files of bench copy's pool of process pid: /dev/shm/umbp.bench-copy-PID and its
    index on huge pages, umbp-index.bench-copy-PID in a hugetlbfs mount."""
    name = "bench-copy-%d" % pid
    found = []
    for d, f in (("/dev/shm", "umbp." + name), ("/dev/hugepages", "umbp-index." + name)):
        if os.path.exists(os.path.join(d, f)):
            found.append(os.path.join(d, f))
    return found


@check("SIGINT, SIGTERM, SIGHUP or SIGQUIT (Ctrl-\\) during a run removes its pool (no /dev/shm or huge-page file left)")
def _():
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        # SIG_DFL in the child for SIGINT, SIGQUIT and SIGHUP: a shell's background job would otherwise inherit SIGINT ignored, nohup SIGHUP
        p = subprocess.Popen([TOOL, "bench", "copy", "--reps", "1000", "--bytes", "64MiB", "--cases", "64KiBx2"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=taplib.foreground)
        try:
            deadline = time.monotonic() + 30
            while not pool_files(p.pid) and p.poll() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            assert pool_files(p.pid), "%s: the run made no pool in 30 s (exit %r)" % (sig.name, p.poll())
            time.sleep(0.2)
            p.send_signal(sig)
            p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        assert p.returncode == -sig, "%s: exit %r" % (sig.name, p.returncode)
        left = pool_files(p.pid)
        assert not left, "%s: the run left %s" % (sig.name, left)


@check("--cuda without a usable GPU fails (exit 1) with the cause and what runs instead")
def _():
    r = run(["bench", "copy", "--cuda", "--reps", "1", "--bytes", "1MiB", "--cases", "64KiBx2", "--json"])
    if r.returncode == 0:
        return "SKIP a GPU is usable here: bench copy --cuda ran"
    assert r.returncode == 1 and not r.stdout, "exit %d, stdout %r, stderr %r" % (r.returncode, r.stdout, r.stderr)
    assert "bench copy --cuda: " in r.stderr and "without --cuda" in r.stderr, r.stderr


@check("on a 64 MiB /dev/shm (Docker's default) a pool too large is refused at once naming --bytes, and that --bytes runs")
def _():
    def small_shm(*args):
        # a private mount namespace whose /dev/shm is a 64 MiB tmpfs (needs root; skipped otherwise)
        return subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" "$@"',
                               TOOL, "bench", "copy", "--reps", "1", *args], capture_output=True, text=True,
                              timeout=120)
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return "SKIP cannot mount a private /dev/shm here (unshare -m needs root): " + probe.stderr.strip()[:100]
    # the default 256 MiB a job; 64-byte objects, each in a 4 KiB slot: 32 MiB of them is a 2 GiB pool
    for args in (["--cases", "64KiBx2"], ["--cases", "64x1", "--bytes", "32MiB"]):
        r = small_shm(*args)
        m = re.search(r"give --bytes (\S+) or less", r.stderr)
        assert r.returncode == 1 and m and "--capacity" not in r.stderr and not r.stdout, \
            "%s: exit %d, stderr %r" % (args, r.returncode, r.stderr)
        r = small_shm(*args, "--bytes", m.group(1))
        assert r.returncode == 0, "%s --bytes %s (the suggestion): exit %d, %s" % (args, m.group(1), r.returncode,
                                                                                   r.stderr)


def main():
    if not TOOL or not os.access(TOOL, os.X_OK):
        print("1..%d" % len(results))
        for i, (name, _) in enumerate(results, 1):
            print("not ok %d - %s # UMBP_TOOL not set or not executable: %r" % (i, name, TOOL))
        return 1
    return taplib.run(results)


if __name__ == "__main__":
    sys.exit(main())
