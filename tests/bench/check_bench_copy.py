#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Command-line checks of `umbp bench copy` (host backend; no GPU needed). Prints TAP.

Usage errors exit 2 and name the option; what a run leaves behind (its
private pool) is gone after it ends, however it ends.
"""
import os
import subprocess
import sys
import traceback

TOOL = os.environ.get("UMBP_TOOL", "")

results = []


def check(name):
    def deco(fn):
        results.append((name, fn))
        return fn
    return deco


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


@check("--cases that names no case is a usage error, not an empty table")
def _():
    for bad in ("", ",", ",,"):
        r = run(["bench", "copy", "--cases", bad, "--bytes", "1MiB", "--json"])
        assert r.returncode == 2 and "--cases '%s' names no case" % bad in r.stderr and not r.stdout, \
            "--cases %r: exit %d, stdout %r, stderr %r" % (bad, r.returncode, r.stdout, r.stderr)


def main():
    print("1..%d" % len(results))
    if not TOOL or not os.access(TOOL, os.X_OK):
        for i, (name, _) in enumerate(results, 1):
            print("not ok %d - %s # UMBP_TOOL not set or not executable: %r" % (i, name, TOOL))
        return 1
    failed = 0
    for i, (name, fn) in enumerate(results, 1):
        try:
            res = fn()
            if isinstance(res, str) and res.startswith("SKIP"):
                print("ok %d - %s # %s" % (i, name, res))
            else:
                print("ok %d - %s" % (i, name))
        except Exception:  # noqa: BLE001 - report every failure as TAP
            failed += 1
            print("not ok %d - %s" % (i, name))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
