#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Smoke test of `umbp bench index` (docs/bench-index.md). Prints TAP.

Runs `$UMBP_TOOL bench index --keys 20000 --seconds 0.1 --reps 2 --json` and
checks that the JSON parses and holds every case, each with our figure, each
reference's figure, every repetition's figures and the ratios, each the median
of the repetitions' ratios (rte_hash's may be null only when the run says DPDK
is unavailable, with the reason); that the pools it created are gone; and the
exit codes of --help and of usage errors.
"""
import json
import re
import math
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import taplib  # noqa: E402  (tests/taplib.py: foreground())

TOOL = os.environ.get("UMBP_TOOL", "")
KEYS = 20000
REPS = 2

results = []


def check(name):
    def deco(fn):
        results.append((name, fn))
        return fn
    return deco


def run(args, timeout=240):
    return subprocess.run([TOOL] + args, capture_output=True, text=True, timeout=timeout)


def run_peak_rss(args, timeout=240):
    """run(args), and the run's peak RSS in KiB (os.wait4's ru_maxrss of
    that one process): what it touched, which a wall-clock bound only
    guessed at. Its output is a few lines: read whole before the wait."""
    p = subprocess.Popen([TOOL] + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    timer = threading.Timer(timeout, p.kill)
    timer.start()
    try:
        out, err = p.stdout.read(), p.stderr.read()
        _, status, ru = os.wait4(p.pid, 0)
    finally:
        timer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err), ru.ru_maxrss


def small_run(as_json=True):
    """A run of one case on a 2000-key table of ours alone (a second or two):
    for the checks of what a run says and does before and after it measures."""
    args = ["bench", "index", "--keys", "2000", "--seconds", "0.01", "--reps", "1", "--impls", "ours",
            "--lf", "0.5", "--filter", "hit-single-lf0.5-p1"]
    return run(args + (["--json"] if as_json else []))


def expected_names():
    names = []
    for lf in ("lf0.5", "lf0.9"):
        for op in ("hit-single", "hit-bulk", "miss-single", "miss-bulk",
                   "pin-hit-single", "pin-hit-bulk", "pin-miss-single", "pin-miss-bulk"):
            for p in (1, 2):
                names.append("%s-%s-p%d" % (op, lf, p))
        for p in (1, 2):
            names.append("churn-%s-p%d" % (lf, p))
            names.append("churn-reader-%s-p%d" % (lf, p))
    return names


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def quantile(v, q):
    """Quantile q, interpolated between the nearest values (numpy's default)."""
    v = sorted(v)
    h = (len(v) - 1) * q
    i = int(h)
    return v[i] + (h - i) * (v[i + 1] - v[i]) if i + 1 < len(v) else v[-1]


def close(a, b):
    return abs(a - b) <= 1e-6 * abs(b) + 1e-9


def check_ref(c, ref):
    """ref's figure is the median of its repetitions, and the ratio ours/ref the
    median of the ratios of figures measured in the same repetition."""
    n = c["name"]
    reps = c[ref + "_reps"]
    assert isinstance(reps, list) and len(reps) == REPS and all(positive(v) for v in reps), \
        "%s: %s_reps %r" % (n, ref, reps)
    assert close(c[ref + "_mops"], median(reps)), "%s: %s_mops %r is not the median of %r" % (
        n, ref, c[ref + "_mops"], reps)
    rr = [o / r for o, r in zip(c["ours_reps"], reps)]
    want_r = median(rr)
    assert positive(c["ratio_" + ref]) and close(c["ratio_" + ref], want_r), \
        "%s: ratio_%s %r != %r (median of the repetitions' ratios)" % (n, ref, c["ratio_" + ref], want_r)
    for q, key in ((0.25, "_p25"), (0.75, "_p75")):
        got = c["ratio_" + ref + key]
        assert positive(got) and close(got, quantile(rr, q)), "%s: ratio_%s%s %r != %r (quantile %g of %r)" % (
            n, ref, key, got, quantile(rr, q), q, rr)


def positive(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


_json_run = {}


def json_run():
    if not _json_run:
        p = subprocess.Popen([TOOL, "bench", "index", "--keys", str(KEYS), "--seconds", "0.1",
                              "--reps", str(REPS), "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
        out, err = p.communicate(timeout=240)
        _json_run.update(pid=p.pid, rc=p.returncode, out=out, err=err)
    return _json_run



@check("bench index --json exits 0 and prints one JSON object")
def _():
    r = json_run()
    assert r["rc"] == 0, "exit %d, stderr:\n%s" % (r["rc"], r["err"])
    doc = json.loads(r["out"])
    assert isinstance(doc, dict), "top level is not an object"
    assert doc["keys"] == KEYS, "keys = %r" % doc["keys"]
    assert doc["reps"] == REPS, "reps = %r" % doc["reps"]
    assert isinstance(doc["dpdk"], bool), "dpdk = %r" % doc["dpdk"]


@check("every case is present, once, with our figure, both references' figures and the ratios")
def _():
    doc = json.loads(json_run()["out"])
    names = [c["name"] for c in doc["cases"]]
    want = expected_names()
    missing = [n for n in want if n not in names]
    extra = [n for n in names if n not in want]
    assert not missing, "missing cases: %s" % missing
    assert not extra, "unexpected cases: %s" % extra
    assert len(names) == len(set(names)), "duplicate cases"
    for c in doc["cases"]:
        n = c["name"]
        assert c["unit"] in ("Mlookups/s", "Mpairs/s"), "%s: unit %r" % (n, c["unit"])
        assert positive(c["ours_mops"]), "%s: ours_mops %r" % (n, c["ours_mops"])
        ours = c["ours_reps"]
        assert isinstance(ours, list) and len(ours) == REPS and all(positive(v) for v in ours), \
            "%s: ours_reps %r" % (n, ours)
        assert close(c["ours_mops"], median(ours)), "%s: ours_mops is not the median of %r" % (n, ours)
        check_ref(c, "cds_lfht")
        if doc["dpdk"]:
            check_ref(c, "rte_hash")
        else:
            assert c["rte_hash_mops"] is None and c["ratio_rte_hash"] is None and c["rte_hash_reps"] is None \
                and c["ratio_rte_hash_p25"] is None and c["ratio_rte_hash_p75"] is None, \
                "%s: rte_hash figures without DPDK" % n


def machine_expected():
    """The machine as /proc/cpuinfo and sysfs describe it, read here apart
    from the tool: the first CPU's model name, family and model number,
    the online CPUs, CPU 0's unified L2 and L3 sizes."""
    want = {"cpu_model": None, "cpu_family": None, "cpu_model_number": None, "l2": None, "l3": None}
    with open("/proc/cpuinfo") as f:
        for line in f:
            if not line.strip():
                break
            k, _, v = line.partition(":")
            k, v = k.strip(), v.strip()
            if k == "model name":
                want["cpu_model"] = v
            elif k == "cpu family":
                want["cpu_family"] = int(v)
            elif k == "model":
                want["cpu_model_number"] = int(v)
    want["cpus"] = os.sysconf("SC_NPROCESSORS_ONLN")
    base = "/sys/devices/system/cpu/cpu0/cache"
    for idx in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        def rd(n):
            try:
                with open("%s/%s/%s" % (base, idx, n)) as f:
                    return f.read().strip()
            except OSError:
                return ""
        if rd("type") == "Unified" and rd("level") in ("2", "3"):
            want["l" + rd("level")] = rd("size")
    return want


@check("the run says which machine it measured (JSON 'machine', the table's 'machine:' line)")
def _():
    doc = json.loads(json_run()["out"])
    want = machine_expected()
    assert doc.get("machine") == want, "machine %r, /proc/cpuinfo and sysfs say %r" % (doc.get("machine"), want)
    r = small_run(as_json=False)
    assert r.returncode == 0, "exit %d, stderr:\n%s" % (r.returncode, r.stderr)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("machine: ")), None)
    assert line, "no 'machine:' line in:\n%s" % r.stdout
    for part in (want["cpu_model"], "%d CPUs" % want["cpus"], "L2 %s" % want["l2"], "L3 %s" % want["l3"]):
        if part and part != "None":
            assert part in line, "%r is not in %r" % (part, line)


@check("without DPDK the run says why")
def _():
    doc = json.loads(json_run()["out"])
    if doc["dpdk"]:
        return "SKIP DPDK is available: %s" % doc["dpdk_note"]
    assert doc["dpdk_note"], "dpdk is false but dpdk_note is empty"


def hugetlbfs_dirs():
    with open("/proc/mounts") as f:
        return [ln.split()[1] for ln in f if len(ln.split()) > 2 and ln.split()[2] == "hugetlbfs"]


@check("the run leaves no pool behind")
def _():
    r = json_run()
    left = [f for f in os.listdir("/dev/shm") if f.startswith("umbp.umbp-bench-index-%d-" % r["pid"])]
    for d in hugetlbfs_dirs():
        left += [d + "/" + f for f in os.listdir(d) if f.startswith("umbp-index.umbp-bench-index-%d-" % r["pid"])]
    assert not left, "pools left behind: %s" % left


@check("a run removes the pools of an earlier run that was killed (SIGKILL)")
def _():
    import signal
    import time
    p = subprocess.Popen([TOOL, "bench", "index", "--keys", str(KEYS), "--seconds", "5", "--reps", "100",
                          "--impls", "ours", "--lf", "0.5", "--filter", "hit-single-lf0.5-p1"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    name = "umbp-bench-index-%d-0" % p.pid
    deadline = time.monotonic() + 60
    try:
        while not os.path.exists("/dev/shm/umbp." + name):
            assert p.poll() is None, "the run to be killed exited (%s) before it made its pool" % p.returncode
            assert time.monotonic() < deadline, "the run made no pool in 60 s"
            time.sleep(0.05)
        time.sleep(0.3)
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    assert os.path.exists("/dev/shm/umbp." + name), "SIGKILL left no pool: nothing to test"
    r = small_run()
    assert r.returncode == 0, "exit %d, stderr:\n%s" % (r.returncode, r.stderr)
    left = [f for f in os.listdir("/dev/shm") if f == "umbp." + name]
    for d in hugetlbfs_dirs():
        left += [d + "/" + f for f in os.listdir(d) if f == "umbp-index." + name]
    assert not left, "the killed run's pool is still there: %s" % left
    assert "removed pool '%s'" % name in r.stderr and "process %d" % p.pid in r.stderr, \
        "the run did not say what it removed:\n%s" % r.stderr


@check("a run leaves alone a pool named like a killed run's that a live process holds")
def _():
    import signal
    import time
    # a PID that no process of this namespace has, as for a run in another
    # container that shares /dev/shm
    pid = 4194303
    while pid > 1 and os.path.exists("/proc/%d" % pid):
        pid -= 1
    name = "umbp-bench-index-%d-0" % pid
    log = tempfile.TemporaryFile(mode="w+")
    d = subprocess.Popen([TOOL, "daemon", name, "--capacity", "16MiB", "--slot-size", "64KiB", "--foreground"],
                         stdout=subprocess.DEVNULL, stderr=log, text=True)

    def daemon_log():
        log.seek(0)
        return log.read()
    try:
        # "ready": the daemon holds its pool (the file exists earlier, while
        # it is still being made; a run then took it for a leftover)
        deadline = time.monotonic() + 60
        while "ready: pool" not in daemon_log():
            assert d.poll() is None, "the daemon exited (%s): %s" % (d.returncode, daemon_log())
            assert time.monotonic() < deadline, "the daemon was not ready in 60 s: %s" % daemon_log()
            time.sleep(0.05)
        r = small_run()
        assert r.returncode == 0, "exit %d, stderr:\n%s" % (r.returncode, r.stderr)
        assert os.path.exists("/dev/shm/umbp." + name), "the run removed a pool that a live daemon holds"
        assert name not in r.stderr, "the run named the held pool:\n%s" % r.stderr
        # once no process holds it, the same name is a leftover: the next run
        # removes it (so the run above left it for the daemon, not for its name)
        d.send_signal(signal.SIGTERM)
        d.wait(timeout=30)
        assert os.path.exists("/dev/shm/umbp." + name), "the daemon removed its pool on SIGTERM"
        r = small_run()
        assert r.returncode == 0, "exit %d, stderr:\n%s" % (r.returncode, r.stderr)
        assert not os.path.exists("/dev/shm/umbp." + name), \
            "the pool is still there once its daemon stopped:\n%s" % r.stderr
        assert "removed pool '%s'" % name in r.stderr, "the run did not say what it removed:\n%s" % r.stderr
    finally:
        if d.poll() is None:
            d.send_signal(signal.SIGTERM)
            try:
                d.wait(timeout=30)
            except subprocess.TimeoutExpired:
                d.kill()
                d.wait()
        if os.path.exists("/dev/shm/umbp." + name):
            run(["pool", "destroy", "--force", name])
        log.close()


@check("the run says where our index is (--index-pages: try by default, small on 4 KiB pages)")
def _():
    doc = json.loads(json_run()["out"])
    assert doc["ours_index_pages"] in ("2MiB", "4KiB"), doc["ours_index_pages"]
    assert "--index-pages try" in doc["ours_note"], doc["ours_note"]
    assert ("on 2 MiB pages" in doc["ours_note"]) == (doc["ours_index_pages"] == "2MiB"), doc["ours_note"]
    r = run(["bench", "index", "--keys", "4096", "--seconds", "0.02", "--reps", "1", "--lf", "0.5",
             "--filter", "hit-single-lf0.5-p1", "--impls", "ours", "--index-pages", "small", "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ours_index_pages"] == "4KiB" and "--index-pages small" in doc["ours_note"], doc
    r = run(["bench", "index", "--keys", "4096", "--seconds", "0.02", "--reps", "1", "--lf", "0.5",
             "--filter", "hit-single-lf0.5-p1", "--impls", "ours", "--index-pages", "small"])
    assert r.returncode == 0 and "ours: index on 4 KiB pages (--index-pages small)" in r.stdout, r
    r = run(["bench", "index", "--keys", "4096", "--seconds", "0.02", "--reps", "1", "--lf", "0.5",
             "--filter", "hit-single-lf0.5-p1", "--impls", "cds_lfht", "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ours_index_pages"] is None and doc["ours_note"] is None, doc


@check("the run says what a cold line costs in our bucket array and in fresh 4 KiB pages, per load factor")
def _():
    doc = json.loads(json_run()["out"])
    mem = doc["memory_line_ns"]
    if platform.machine() not in ("x86_64", "AMD64"):
        assert mem == [], mem  # measured on x86 only (CLFLUSH)
        return
    assert [m["lf"] for m in mem] == ["lf0.5", "lf0.9"], mem
    for m in mem:
        for w in ("ours_buckets", "fresh_4k"):
            v = m[w]
            assert v["min"] <= v["median"] <= v["max"], m
            # a line evicted with CLFLUSH comes from DRAM: tens of ns at the least. A chain whose loads
            # did not wait for each other, or lines left in the cache, would read a few ns.
            assert 20 <= v["min"] and v["max"] < 100000, m
    r = small_run(as_json=False)
    assert r.returncode == 0, r.stderr
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("memory: ")), "")
    assert re.search(r" lf0\.5 our bucket array \d+ \(\d+-\d+\), fresh 4 KiB pages \d+ \(\d+-\d+\)$", line), r.stdout
    r = run(["bench", "index", "--keys", "4096", "--seconds", "0.02", "--reps", "1", "--lf", "0.5",
             "--filter", "hit-single-lf0.5-p1", "--impls", "cds_lfht", "--json"])
    assert r.returncode == 0 and json.loads(r.stdout)["memory_line_ns"] == [], r


@check("--no-dpdk gives null rte_hash figures and a reason; the table form has a row per case")
def _():
    r = run(["bench", "index", "--keys", "4096", "--seconds", "0.02", "--reps", "1", "--lf", "0.5",
             "--filter", "hit-single", "--no-dpdk", "--json"])
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["dpdk"] is False and doc["dpdk_note"], doc
    assert [c["name"] for c in doc["cases"]] == ["hit-single-lf0.5-p1", "hit-single-lf0.5-p2",
                                                 "pin-hit-single-lf0.5-p1", "pin-hit-single-lf0.5-p2"], doc
    assert all(c["rte_hash_mops"] is None for c in doc["cases"])
    r = run(["bench", "index", "--keys", "4096", "--seconds", "0.02", "--reps", "1", "--lf", "0.9",
             "--filter", "miss-bulk-lf0.9-p1", "--impls", "ours,cds_lfht"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert any(l.split()[:1] == ["case"] for l in lines), r.stdout
    rows = [l for l in lines if l.startswith("miss-bulk-lf0.9-p1") or l.startswith("pin-miss-bulk-lf0.9-p1")]
    assert len(rows) == 2, r.stdout
    for row in rows:
        f = row.split()
        assert len(f) == 7 and float(f[1]) > 0 and f[2] == "-" and float(f[3]) > 0 and f[5].endswith("x") \
            and f[6] == "-", row  # no rte_hash: no ratio to it, no spread


@check("the table's two last lines count lookup rows and pin/churn rows apart, naming those below 1.0x")
def _():
    r = run(["bench", "index", "--keys", "4096", "--seconds", "0.02", "--reps", "1", "--lf", "0.5",
             "--filter", "miss-bulk-lf0.5-p1,churn-lf0.5-p1", "--impls", "ours,rte_hash"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    if "rte_hash: DPDK" not in r.stdout:
        assert not any(l.startswith("target") for l in lines), r.stdout  # nothing compared
        return
    rows = {l.split()[0]: float(l.split()[4].rstrip("x")) for l in lines
            if l.split() and l.split()[0].endswith("-p1") and l.split()[4] != "-"}
    groups = ([n for n in rows if not n.startswith(("pin-", "churn"))],
              [n for n in rows if n.startswith(("pin-", "churn"))])
    assert sorted(groups[0]) == ["miss-bulk-lf0.5-p1"], rows
    assert sorted(groups[1]) == ["churn-lf0.5-p1", "churn-reader-lf0.5-p1", "pin-miss-bulk-lf0.5-p1"], rows
    for prefix, names in (("target ours >= 1.0x rte_hash (lookups", groups[0]),
                          ("pin and churn rows >= 1.0x rte_hash", groups[1])):
        line = [l for l in lines if l.startswith(prefix)]
        assert len(line) == 1, r.stdout
        # The table prints ratios to two decimals and the count uses the exact
        # ratio: a printed 1.00x may be 0.996 (below) or 1.004 (met).
        sure = [n for n in names if abs(rows[n] - 1.0) > 0.005]
        m = re.search(r"(\d+) of (\d+)", line[0])
        assert m and int(m.group(2)) == len(names), line[0]
        assert sum(rows[n] >= 1.0 for n in sure) <= int(m.group(1)) <= sum(rows[n] >= 0.995 for n in names), line[0]
        for n in sure:
            assert (n in line[0]) == (rows[n] < 1.0), line[0]


@check("the text table's last column is the spread of the ratios to rte_hash: their p25-p75 around the median")
def _():
    r = run(["bench", "index", "--keys", "4096", "--seconds", "0.01", "--reps", "5", "--lf", "0.5",
             "--filter", "miss-single-lf0.5-p1", "--impls", "ours,rte_hash"])
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    head = [l for l in lines if l.split()[:1] == ["case"]]
    assert len(head) == 1 and head[0].split()[-2:] == ["ours/rte", "p25-p75"], r.stdout
    rows = [l.split() for l in lines if l.startswith(("miss-single-lf0.5-p1", "pin-miss-single-lf0.5-p1"))]
    assert len(rows) == 2, r.stdout
    for f in rows:
        assert len(f) == 7, f
        if "rte_hash: DPDK" not in r.stdout:
            assert f[4] == "-" and f[6] == "-", f
            continue
        m = re.fullmatch(r"(\d+\.\d\d)-(\d+\.\d\d)", f[6])
        ratio = float(f[4].rstrip("x"))
        assert m and float(m.group(1)) - 0.005 <= ratio <= float(m.group(2)) + 0.005, f


@check("--warmup W runs each table W seconds, untimed, before each timed run, and says so")
def _():
    args = ["bench", "index", "--keys", "2000", "--seconds", "0.01", "--reps", "3", "--impls", "ours",
            "--lf", "0.5", "--filter", "hit-single-lf0.5-p1"]
    cold = run(args + ["--json"])
    assert cold.returncode == 0, "exit %d, stderr:\n%s" % (cold.returncode, cold.stderr)
    assert json.loads(cold.stdout)["warmup"] == 0, "default warmup is not 0"
    t0 = time.monotonic()
    warm = run(args + ["--warmup", "0.5", "--json"])
    t_warm = time.monotonic() - t0
    assert warm.returncode == 0, "exit %d, stderr:\n%s" % (warm.returncode, warm.stderr)
    doc = json.loads(warm.stdout)
    assert doc["warmup"] == 0.5, "warmup = %r" % doc["warmup"]
    names = [c["name"] for c in doc["cases"]]
    assert names == ["hit-single-lf0.5-p1", "pin-hit-single-lf0.5-p1"], names
    # two cases of one table, three repetitions each, each after 0.5 s of untimed lookups:
    # 3 s at least, however fast the machine (without the warm-up the run takes a fraction
    # of a second on an idle machine)
    assert t_warm >= 3, "with --warmup 0.5 and 2 x 3 repetitions the run took %.2f s (< 3 s)" % t_warm
    r = run(args + ["--warmup", "0.1"])
    assert r.returncode == 0 and "after 0.10 s of warm-up each" in r.stdout, r.stdout
    for bad in ("-1", "61", "x", ""):
        r = run(["bench", "index", "--warmup", bad])
        assert r.returncode == 2 and "--warmup" in r.stderr, "--warmup %r: exit %d, %s" % (bad, r.returncode,
                                                                                         r.stderr)


@check("--help exits 0 and documents every option; usage errors exit 2")
def _():
    r = run(["bench", "index", "--help"])
    assert r.returncode == 0 and r.stdout.startswith("Usage: umbp bench index"), r
    for opt in ("--keys", "--seconds", "--warmup", "--reps", "--lf", "--filter", "--impls", "--seed", "--no-dpdk",
                "--json", "--index-pages", "--rte-hugepages", "Exit status", "Example"):
        assert opt in r.stdout, "--help does not mention %s" % opt
    for bad in (["bench", "index", "--keys", "0"], ["bench", "index", "--seconds", "-1"],
                ["bench", "index", "--lf", "1.5"], ["bench", "index", "--impls", "nope"],
                ["bench", "index", "--bogus"], ["bench", "index", "--index-pages", "big"],
                ["bench", "nosuch"], ["bench"]):
        r = run(bad)
        assert r.returncode == 2, "%s: exit %d (want 2)" % (bad, r.returncode)
    r = run(["bench", "--help"])
    assert r.returncode == 0 and "index" in r.stdout, r


@check("an unknown option, a missing value or '=value' on a flag is a usage error that names the option")
def _():
    for args, want in ((["--bogus"], "unknown option '--bogus'"), (["-x"], "unknown option '-x'"),
                       (["--keys"], "option '--keys' needs a value"),
                       (["--filter"], "option '--filter' needs a value"),
                       (["--json=1"], "option '--json' takes no value"),
                       (["--i", "ours"], "option '--i' is ambiguous")):
        r = run(["bench", "index"] + args)
        assert r.returncode == 2 and want in r.stderr and not r.stdout, "%s: exit %d, stderr %r" % (
            args, r.returncode, r.stderr)


@check("--reps takes a whole number from 1 to 1000: one past 2^32 is not taken as 1")
def _():
    for bad in ("4294967297", "1.5", "0x5", "+5", "0", "1001", ""):
        r = run(["bench", "index", "--reps", bad, "--keys", "64", "--impls", "ours", "--filter", "hit-single-lf0.5-p1",
                 "--lf", "0.5", "--seconds", "0.001"])
        assert r.returncode == 2 and "--reps '%s'" % bad in r.stderr, "--reps %r: exit %d, %s" % (
            bad, r.returncode, r.stderr)


@check("--filter that matches no case and --impls that names no table are usage errors, before any table is made")
def _():
    base = ["bench", "index", "--keys", "2000", "--seconds", "0.001", "--reps", "1", "--lf", "0.5"]
    for extra, want in ((["--filter", "nosuch"], "--filter 'nosuch' matches no case"),
                        (["--filter", "hit-singel", "--json"], "--filter 'hit-singel' matches no case"),
                        (["--filter", ""], "--filter '' matches no case"),
                        (["--impls", ","], "--impls names no table"),
                        (["--impls", "rte_hash", "--no-dpdk"], "--impls rte_hash with --no-dpdk")):
        r = run(base + extra)
        assert r.returncode == 2 and want in r.stderr and not r.stdout, "%s: exit %d, stdout %r, stderr %r" % (
            extra, r.returncode, r.stdout[:200], r.stderr)
        if "--filter" in extra:
            assert "hit-single-lf0.5-pN" in r.stderr and "churn-reader-lf0.5-pN" in r.stderr, r.stderr
    # a filter that selects only churn-reader rows runs the churn pair (the progress count agrees)
    r = run(base + ["--impls", "ours", "--filter", "reader", "--json"])
    assert r.returncode == 0, r.stderr
    assert [c["name"] for c in json.loads(r.stdout)["cases"]] == [
        "churn-lf0.5-p1", "churn-reader-lf0.5-p1", "churn-lf0.5-p2", "churn-reader-lf0.5-p2"], r.stdout


@check("--lf with four load factors reports every case of each (80 rows, none dropped)")
def _():
    lfs = ("0.1", "0.2", "0.3", "0.4")
    r = run(["bench", "index", "--keys", "1000", "--seconds", "0.001", "--reps", "1", "--impls", "ours",
             "--lf", ",".join(lfs), "--json"])
    assert r.returncode == 0, "exit %d, stderr:\n%s" % (r.returncode, r.stderr)
    names = [c["name"] for c in json.loads(r.stdout)["cases"]]
    want = []
    for lf in lfs:
        want += [n.replace("lf0.5", "lf" + lf) for n in expected_names() if "lf0.5" in n]
    assert sorted(names) == sorted(want), "missing %s, unexpected %s" % (sorted(set(want) - set(names)),
                                                                       sorted(set(names) - set(want)))


@check("--keys beyond a pool's slots, /dev/shm or the memory fails at once, naming --keys and a value that fits")
def _():
    base = ["--seconds", "0.001", "--reps", "1", "--lf", "0.5", "--filter", "hit-single-lf0.5-p1"]
    for keys in ("16777216", "268435456"):
        r = run(["bench", "index", "--keys", keys] + base)
        assert r.returncode == 2 and "--keys %s" % keys in r.stderr and "give --keys 16777215 or less" in r.stderr \
            and not r.stdout, "--keys %s: exit %d, stderr %r" % (keys, r.returncode, r.stderr)
    # the references alone may have more keys than a pool has slots
    r = run(["bench", "index", "--keys", "16777216", "--impls", "cds_lfht", "--filter", "nosuch"])
    assert r.returncode == 2 and "--filter 'nosuch'" in r.stderr and "--keys" not in r.stderr, r.stderr
    # a pool of 16777215 slots of 4 KiB (64 GiB, counted whole by the library) is more than most test
    # machines' /dev/shm or memory: there it must fail before anything is made, with a --keys that fits
    st = os.statvfs("/dev/shm")
    avail = st.f_bavail * st.f_frsize
    with open("/proc/meminfo") as f:
        mem = [int(l.split()[1]) * 1024 for l in f if l.startswith("MemAvailable:")]
    if mem:
        avail = min(avail, mem[0])
    if avail > 80 << 30:
        return "SKIP /dev/shm and the memory hold a pool of 16777215 slots here"
    r, peak_kib = run_peak_rss(["bench", "index", "--keys", "16777215", "--impls", "ours"] + base + ["--json"])
    assert r.returncode == 1 and not r.stdout, "exit %d, stdout %r, stderr %r" % (r.returncode, r.stdout, r.stderr)
    m = re.search(r"--keys 16777215: our pool needs .* give --keys (\d+) or less", r.stderr)
    assert m and "--capacity" not in r.stderr, r.stderr
    fit = int(m.group(1))
    assert 64 <= fit < 16777215 and fit * 4096 < avail, "suggested --keys %d with %d bytes available" % (fit, avail)
    # "before anything is made", counted in memory touched, not in seconds (a 5 s bound is flaky on a
    # loaded machine): the refusal peaks at a few MiB; 16777215 keys alone are 512 MiB
    assert peak_kib < 128 << 10, "the refusal peaked at %d MiB of RSS (expected < 128 MiB: nothing made)" % (
        peak_kib >> 10)


@check("--lf that gives one load factor twice (or two with one case label) is a usage error")
def _():
    for lfs in ("0.5,0.5", "0.5,0.50", "0.1234561,0.1234562"):
        r = run(["bench", "index", "--keys", "1000", "--seconds", "0.001", "--reps", "1", "--impls", "ours",
                 "--filter", "hit-single", "--lf", lfs, "--json"])
        assert r.returncode == 2 and "--lf '%s'" % lfs in r.stderr and "give each load factor once" in r.stderr \
            and not r.stdout, "--lf %s: exit %d, stdout %r, stderr %r" % (lfs, r.returncode, r.stdout[:300], r.stderr)


@check("--impls rte_hash alone without a working EAL exits 1 with the cause (with --rte-hugepages: the pages)")
def _():
    # rte_hash's heap on 2 MiB pages for 16M entries: -m 5248 MiB, more than a test machine has free
    with open("/proc/meminfo") as f:
        info = {l.split(":")[0]: l.split()[1] for l in f}
    if int(info.get("HugePages_Free", 0)) * int(info.get("Hugepagesize", 0)) >= 5248 * 1024:
        return "SKIP this machine has 5248 MiB of free huge pages: EAL would start"
    r = run(["bench", "index", "--keys", "16M", "--impls", "rte_hash", "--rte-hugepages", "--lf", "0.5",
             "--filter", "hit-single-lf0.5-p1", "--reps", "1", "--seconds", "0.001", "--json"], timeout=120)
    assert r.returncode == 1 and not r.stdout, "exit %d, stdout %r, stderr %r" % (r.returncode, r.stdout[:300],
                                                                                 r.stderr)
    assert "--impls rte_hash: rte_hash not measured" in r.stderr and "nothing else to measure" in r.stderr, r.stderr
    if "built without DPDK" not in r.stderr:
        assert "--rte-hugepages" in r.stderr and "vm.nr_hugepages" in r.stderr, r.stderr


@check("on a 64 MiB /dev/shm (Docker's default) a small table runs, and a large one is refused with a --keys that runs")
def _():
    def small_shm(keys):
        # a private mount namespace whose /dev/shm is a 64 MiB tmpfs (needs root; skipped otherwise)
        return subprocess.run(["unshare", "-m", "sh", "-c", 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$0" "$@"',
                               TOOL, "bench", "index", "--keys", keys, "--impls", "ours", "--lf", "0.5",
                               "--filter", "hit-single-lf0.5-p1", "--reps", "1", "--seconds", "0.001",
                               "--index-pages", "small", "--json"], capture_output=True, text=True, timeout=120)
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=64m tmpfs /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        return "SKIP cannot mount a private /dev/shm here (unshare -m needs root): " + probe.stderr.strip()[:100]
    r = small_shm("8192")
    assert r.returncode == 0, "--keys 8192 on a 64 MiB /dev/shm: exit %d, %s" % (r.returncode, r.stderr)
    r = small_shm("1M")
    m = re.search(r"give --keys (\d+) or less", r.stderr)
    assert r.returncode == 1 and m, "--keys 1M on a 64 MiB /dev/shm: exit %d, %s" % (r.returncode, r.stderr)
    r = small_shm(m.group(1))
    assert r.returncode == 0, "--keys %s (the suggestion): exit %d, %s" % (m.group(1), r.returncode, r.stderr)


@check("SIGINT, SIGTERM or SIGHUP during a run removes its pool and ends its second process")
def _():
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        # p2 rows: the second process runs; SIG_DFL in the child for SIGINT and SIGHUP (a background job inherits SIGINT ignored, nohup SIGHUP)
        p = subprocess.Popen([TOOL, "bench", "index", "--keys", "20000", "--reps", "1000", "--seconds", "0.01",
                              "--lf", "0.5", "--filter", "p2", "--impls", "ours"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=taplib.foreground)
        name = "umbp-bench-index-%d-0" % p.pid
        kids = []
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and p.poll() is None and not kids:
                time.sleep(0.05)
                if os.path.exists("/dev/shm/umbp." + name):
                    kids = subprocess.run(["pgrep", "-P", str(p.pid)], capture_output=True,
                                          text=True).stdout.split()
            assert kids, "%s: no second process within 60 s (exit %r)" % (sig.name, p.poll())
            time.sleep(0.3)
            p.send_signal(sig)
            p.communicate(timeout=30)
        finally:
            if p.poll() is None:
                p.kill()
                p.communicate()
        assert p.returncode == -sig, "%s: exit %r" % (sig.name, p.returncode)
        left = [d for d in ("/dev/shm/umbp." + name, "/dev/hugepages/umbp-index." + name) if os.path.exists(d)]
        assert not left, "%s: the run left %s" % (sig.name, left)
        for k in kids:
            for _ in range(100):
                try:
                    with open("/proc/%s/stat" % k) as f:
                        state = f.read().rsplit(")", 1)[1].split()[0]
                except OSError:
                    break
                if state == "Z":
                    break  # killed, not yet reaped by init
                time.sleep(0.05)
            else:
                raise AssertionError("%s: the second process %s still runs" % (sig.name, k))


@check("run under nohup (SIGHUP ignored): a SIGHUP leaves it running; SIGTERM still removes its pool")
def _():
    def child():
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # what nohup(1) does
    p = subprocess.Popen([TOOL, "bench", "index", "--keys", "20000", "--reps", "1000", "--seconds", "0.01",
                          "--lf", "0.5", "--filter", "miss-single-lf0.5-p1", "--impls", "ours"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=child)
    name = "umbp-bench-index-%d-0" % p.pid
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and p.poll() is None and not os.path.exists("/dev/shm/umbp." + name):
            time.sleep(0.05)
        assert os.path.exists("/dev/shm/umbp." + name), "no pool within 60 s (exit %r)" % p.poll()
        p.send_signal(signal.SIGHUP)
        time.sleep(1)
        assert p.poll() is None, "SIGHUP ended a run that ignores it: exit %r" % p.returncode
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode == -signal.SIGTERM, "exit %r" % p.returncode
    left = [d for d in ("/dev/shm/umbp." + name, "/dev/hugepages/umbp-index." + name) if os.path.exists(d)]
    assert not left, "the run left %s" % left


@check("churn rows at a load factor that leaves our churn writer too few free slots are a usage error, not 0.00")
def _():
    base = ["bench", "index", "--impls", "ours", "--reps", "2", "--seconds", "0.01", "--json"]
    for keys, lf in (("4096", "0.99"), ("1000", "1"), ("64", "0.5")):
        r = run(base + ["--keys", keys, "--lf", lf, "--filter", "churn"])
        assert r.returncode == 2 and ("--lf %s at --keys %s leaves" % (lf, keys)) in r.stderr and not r.stdout, \
            "--keys %s --lf %s: exit %d, stdout %r, stderr %r" % (keys, lf, r.returncode, r.stdout[:200], r.stderr)
    # the load factor the message names works, and without churn rows any load factor does
    r = run(base + ["--keys", "4096", "--lf", "0.99", "--filter", "churn"])
    lf = re.search(r"give --lf ([0-9.]+) or lower", r.stderr).group(1)
    r = run(base + ["--keys", "4096", "--lf", lf, "--filter", "churn-lf%s-p1" % lf])
    assert r.returncode == 0, r.stderr
    assert all(positive(c["ours_mops"]) for c in json.loads(r.stdout)["cases"]), r.stdout
    r = run(base + ["--keys", "1000", "--lf", "1", "--filter", "hit-single-lf1-p1"])
    assert r.returncode == 0, r.stderr


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
