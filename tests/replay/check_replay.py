#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs `umbp replay` end to end: a scheduler and N exec'd workers on a real
pool. Checks a small trace with a known hit pattern figure by figure, the
generator, capacity sweeps, a worker killed mid-replay, interruption by
SIGINT/SIGTERM, a scheduler killed by SIGKILL, and bad input.

Usage: check_replay.py [synthetic]   (synthetic: only the Mooncake trace check)
Environment (tests/meson.build): UMBP_TOOL = the umbp binary,
UMBP_SHARED_DATA = ../shared/data. Prints TAP.
"""
import csv
import glob
import json
import math
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import taplib  # noqa: E402  (tests/taplib.py)

TOOL = os.environ.get("UMBP_TOOL", "")
DATA = os.environ.get("UMBP_SHARED_DATA", "")
TMP = tempfile.mkdtemp(prefix="umbp-replay-test-")
results, check = taplib.registry()  # @check("name"): a check; it returns None, or "SKIP reason"


def run(*args, env=None, timeout=300):
    e = dict(os.environ)
    if env:
        e.update(env)
    p = subprocess.run([TOOL, "replay", *args], capture_output=True, text=True, timeout=timeout, env=e)
    return p.returncode, p.stdout, p.stderr


def run_json(*args, **kw):
    rc, out, err = run("--json", *args, **kw)
    assert rc == 0, f"exit {rc}: {err}"
    assert out.count("\n") == 1, f"JSON output is one line: {out!r}"
    return json.loads(out)


def segments(pid):
    return glob.glob(f"/dev/shm/umbp.replay-{pid}-*")


def wait_workers(p, tries):
    """The scheduler p's worker pids once its pool exists and both workers
    run `umbp replay --worker` (exec'd, not a fork between fork and exec:
    under ASan and load that window lasts long enough for a signal to land
    in it); polled every 50 ms, `tries` times; asserts there are two."""
    def execd(pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return b"--worker" in f.read()
        except OSError:
            return False
    workers = []
    for _ in range(tries):
        with open(f"/proc/{p.pid}/task/{p.pid}/children") as f:
            workers = [int(x) for x in f.read().split()]
        if len(workers) == 2 and segments(p.pid) and all(execd(w) for w in workers):
            break
        time.sleep(0.05)
    assert len(workers) == 2 and all(execd(w) for w in workers), workers
    return workers


def write(name, lines):
    path = os.path.join(TMP, name)
    with open(path, "w") as f:
        for l in lines:
            f.write((l if isinstance(l, str) else json.dumps(l)) + "\n")
    return path


def close(a, b, what, rel=1e-9):
    assert abs(a - b) <= rel * max(1.0, abs(b)), f"{what}: got {a}, expected {b}"


# Five requests, 512-token blocks, tp 2, 128 bytes/token (32 KiB per rank):
#   r1 [1 2 3 4]      2048 tokens: 4 whole, hit 0, store 4
#   r2 [1 2 3 4 5 6]  2660: 5 whole (6 is partial), hit 4, store 1
#   r3 [1 2 7]        1200: 2 whole, hit 2, store 0
#   r4 [1 2 6 8]      2048: 4 whole, hit 2 (6 was only ever partial), store 2
#   r5 [9]             100: 0 whole
SMALL = [
    {"timestamp": 0, "input_length": 2048, "output_length": 10, "hash_ids": [1, 2, 3, 4]},
    {"timestamp": 5, "input_length": 2660, "output_length": 20, "hash_ids": [1, 2, 3, 4, 5, 6],
     "extra": {"nested": [1, {"a": None}, "s\\u00e9"], "b": True}},
    {"hash_ids": [1, 2, 7], "output_length": 30, "input_length": 1200, "timestamp": 9.5},
    {"timestamp": 12, "input_length": 2048, "output_length": 40, "hash_ids": [1, 2, 6, 8], "x": -1.5e3},
    {"timestamp": 20, "input_length": 100, "output_length": 50, "hash_ids": [9]},
]


@check("small trace, tp 2: every figure")
def _():
    d = run_json(write("small.jsonl", SMALL), "--tp", "2")
    per_rank = 512 * 128 // 2
    assert d["tp"] == 2 and d["block_bytes_per_rank"] == per_rank and d["slot_size"] == per_rank
    assert d["requests"] == 5
    close(d["avg_input_tokens"], (2048 + 2660 + 1200 + 2048 + 100) / 5, "avg input", 1e-5)
    close(d["avg_output_tokens"], 30, "avg output")
    assert d["input_tokens"] == 8056 and d["output_tokens"] == 150
    assert d["blocks_total"] == 15, d["blocks_total"]
    assert d["blocks_hit"] == 8, d["blocks_hit"]
    close(d["cache_ratio"], 8 / 15, "cache ratio", 1e-5)
    close(d["token_ratio"], 8 * 512 / 8056, "token ratio", 1e-5)
    assert d["distinct_blocks"] == 7
    assert d["blocks_stored"] == 7 * 2, d["blocks_stored"]
    assert d["bytes_stored"] == 7 * 2 * per_rank
    assert d["blocks_loaded"] == 8 * 2
    assert d["bytes_loaded"] == 8 * 2 * per_rank
    assert d["evictions"] == 0 and d["verify_failures"] == 0 and d["unbounded"] is True
    assert d["lookup_keys"] > 0 and d["copy_bytes"] == (7 + 8) * 2 * per_rank
    assert 0 < d["pool_time_p50_ms"] <= d["pool_time_p99_ms"]


@check("small trace: tp 1 and tp 3 give the same ratios, shards scale")
def _():
    for tp in (1, 3):
        d = run_json(write("small.jsonl", SMALL), "--tp", str(tp))
        per_rank = (512 * 128 + tp - 1) // tp
        per_rank = (per_rank + 7) // 8 * 8
        assert d["blocks_hit"] == 8 and d["blocks_total"] == 15
        assert d["bytes_stored"] == 7 * tp * per_rank, (tp, d["bytes_stored"])
        assert d["bytes_loaded"] == 8 * tp * per_rank


@check("text summary names every figure")
def _():
    rc, out, err = run(write("small.jsonl", SMALL), "--tp", "2")
    assert rc == 0, err
    for w in ["requests", "average input", "average output", "cache ratio", "53.33%", "token ratio",
              "bytes stored", "bytes loaded", "evictions", "lookup throughput", "copy throughput",
              "p50", "p99"]:
        assert w in out, f"{w!r} missing from:\n{out}"
    assert err == "", f"no progress when stderr is not a terminal: {err!r}"


@check("generator: same seed gives the same file, another seed another")
def _():
    a, b, c = (os.path.join(TMP, n) for n in ("g1.jsonl", "g2.jsonl", "g3.jsonl"))
    for path, seed in ((a, "5"), (b, "5"), (c, "6")):
        rc, out, err = run("--generate", "chat", "--seed", seed, "--conversations", "60", "--output", path)
        assert rc == 0, err
    fa, fb, fc = (open(p, "rb").read() for p in (a, b, c))
    assert fa == fb, "same seed, different files"
    assert fa != fc, "different seeds, same file"
    lines = fa.decode().splitlines()
    assert len(lines) > 60
    for l in lines:
        r = json.loads(l)
        assert set(r) == {"timestamp", "input_length", "output_length", "hash_ids"}
        assert len(r["hash_ids"]) == -(-r["input_length"] // 512)
    ts = [json.loads(l)["timestamp"] for l in lines]
    assert ts == sorted(ts), "requests in time order"


@check("generator: --output that fails half-way (a full disk) leaves no partial trace; a failed generation no change")
def _():
    import resource
    path = os.path.join(TMP, "g-partial.jsonl")

    def small_fsize():
        # the file size limit stands in for a full disk: a write past 16 KiB fails with EFBIG
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
    p = subprocess.run([TOOL, "replay", "--generate", "chat", "--conversations", "60", "--output", path],
                       capture_output=True, text=True, timeout=300, preexec_fn=small_fsize)
    assert p.returncode == 1 and "cannot write the workload to '%s'" % path in p.stderr, (p.returncode, p.stderr)
    # it was left with its first 16 KiB: a trace that replays, silently shorter than the workload
    assert not os.path.exists(path), "a half-written trace of %d bytes was left" % os.path.getsize(path)
    # a path that cannot be written is named with the option
    rc, out, err = run("--generate", "chat", "--conversations", "60", "--output",
                       os.path.join(TMP, "no-such-dir", "g.jsonl"), timeout=60)
    assert rc == 1 and "--output %s: cannot write it" % os.path.join(TMP, "no-such-dir", "g.jsonl") in err, (rc, err)
    # a generation that fails leaves an existing file as it was
    with open(path, "w") as f:
        f.write("kept\n")
    rc, out, err = run("--generate", "chat", "--conversations", "1000000", "--turns", "1000", "--output", path,
                       timeout=120)
    assert rc == 2 and "more than" in err and open(path).read() == "kept\n", (rc, err)


@check("generator: a saved workload replays like the direct one, cache ratio > 0")
def _():
    path = os.path.join(TMP, "g1.jsonl")
    if not os.path.exists(path):
        run("--generate", "chat", "--seed", "5", "--conversations", "60", "--output", path)
    d1 = run_json(path, "--tp", "2")
    d2 = run_json("--generate", "chat", "--seed", "5", "--conversations", "60", "--tp", "2")
    assert d1["cache_ratio"] > 0.3, d1["cache_ratio"]
    for k in ("requests", "blocks_total", "blocks_hit", "bytes_stored", "bytes_loaded", "input_tokens"):
        assert d1[k] == d2[k], (k, d1[k], d2[k])


@check("generator: no system prompts and one turn gives no hits")
def _():
    d = run_json("--generate", "chat", "--conversations", "30", "--turns", "1", "--system-prompts", "0",
                 "--user-tokens", "2000")
    assert d["blocks_total"] > 0 and d["blocks_hit"] == 0, d


@check("capacity sweep of a trace with no hits names no capacity as reaching 95% of the unbounded ratio")
def _():
    # before: "95% of the unbounded cache ratio (0.00%) is reached at 1 MiB (0.00%)"
    args = ["--generate", "chat", "--conversations", "30", "--turns", "1", "--system-prompts", "0",
            "--user-tokens", "2000", "--capacity-sweep", "1MiB,unbounded"]
    rc, out, err = run(*args)
    assert rc == 0 and "is reached at" not in out and "no block of the trace is used twice" in out, out + err
    d = run_json(*args)
    assert d["unbounded_cache_ratio"] == 0 and d["capacity_for_95pct_bytes"] is None, d


@check("capacity sweep: small pools evict, the unbounded step matches a plain run")
def _():
    args = ["--generate", "chat", "--conversations", "80", "--tp", "2"]
    plain = run_json(*args)
    d = run_json(*args, "--capacity-sweep", "1MiB,4MiB,unbounded")
    s = d["sweep"]
    assert len(s) == 3
    assert s[0]["slots"] == 1024 * 1024 // d["slot_size"]
    assert s[0]["evictions"] > 0 and s[0]["cache_ratio"] < plain["cache_ratio"]
    assert s[0]["cache_ratio"] <= s[1]["cache_ratio"] <= s[2]["cache_ratio"]
    assert s[2]["evictions"] == 0 and s[2]["unbounded"]
    for k in ("blocks_hit", "blocks_total", "bytes_stored", "bytes_loaded"):
        assert s[2][k] == plain[k], k
    rc, out, err = run(*args, "--capacity-sweep", "1MiB,unbounded")
    assert rc == 0 and "cache ratio" in out and "evictions" in out and "(unbounded)" in out, out + err


@check("bounded capacity is deterministic")
def _():
    args = ["--generate", "chat", "--conversations", "80", "--tp", "2", "--capacity", "3MiB"]
    a, b = run_json(*args), run_json(*args)
    assert a["evictions"] > 0
    for k in ("blocks_hit", "evictions", "bytes_stored"):
        assert a[k] == b[k], (k, a[k], b[k])


@check("a worker killed mid-replay: rank named, exit 1, no segment left")
def _():
    p = subprocess.Popen([TOOL, "replay", "--generate", "chat", "--conversations", "40", "--tp", "2"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, UMBP_REPLAY_TEST_KILL="1:5"))
    out, err = p.communicate(timeout=120)
    assert p.returncode == 1, f"exit {p.returncode}: {err}"
    assert "worker rank 1" in err and "killed by signal 9" in err, err
    assert "removing pool" in err, err
    assert not segments(p.pid), segments(p.pid)


def start_slow():
    """A replay paced at real time (it sleeps between requests)."""
    p = subprocess.Popen([TOOL, "replay", "--generate", "chat", "--conversations", "40", "--tp", "2",
                          "--speed", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_workers(p, 400)  # a scheduler killed before its workers start leaves the pool to no one
    time.sleep(0.3)
    return p


@check("a SIGSTOPped worker: the rank, pid and state are printed, the replay fails after --reply-timeout")
def _():
    p = subprocess.Popen([TOOL, "replay", "--generate", "chat", "--conversations", "40", "--tp", "2",
                          "--speed", "1", "--reply-timeout", "7"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers = wait_workers(p, 400)
    os.kill(workers[1], signal.SIGSTOP)
    try:
        out, err = p.communicate(timeout=60)
    finally:
        for w in workers:
            try:
                os.kill(w, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert p.returncode == 1, f"exit {p.returncode}: {err}"
    assert f"waiting 5 s for worker rank 1 (pid {workers[1]}, state T, stopped" in err, err
    assert f"worker rank 1 (pid {workers[1]}, state T, stopped" in err and "sent no reply for 7 s" in err, err
    assert f"kill -CONT {workers[1]}" in err and "--reply-timeout" in err, err
    assert not segments(p.pid), segments(p.pid)


@check("a worker stopped before a request larger than its pipe: --reply-timeout and SIGINT still end the wait")
def _():
    # request 2 has 20000 ids (160 KB), more than a pipe holds: the scheduler's write of it to a stopped
    # worker blocked in write(), past --reply-timeout, SIGINT and SIGTERM
    n = 20000
    path = write("pipe-full.jsonl", [{"timestamp": 3000 * r, "input_length": n, "output_length": 1,
                                      "hash_ids": list(range(r * n, (r + 1) * n))} for r in range(3)])
    for how in ("timeout", "sigint"):
        args = [TOOL, "replay", path, "--block-tokens", "1", "--tp", "2", "--speed", "1"]
        if how == "timeout":
            args += ["--reply-timeout", "3"]
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        workers = []
        try:
            workers = wait_workers(p, 400)
            time.sleep(1.0)  # request 1 is done; request 2 starts 3 s after it
            os.kill(workers[1], signal.SIGSTOP)
            if how == "sigint":
                time.sleep(4.5)
                p.send_signal(signal.SIGINT)
            out, err = p.communicate(timeout=30)
        finally:
            p.kill()
            for w in workers:
                try:
                    os.kill(w, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        if how == "timeout":
            assert p.returncode == 1, f"exit {p.returncode}: {err}"
            assert f"worker rank 1 (pid {workers[1]}, state T, stopped" in err and "no reply for 3 s" in err, err
        else:
            assert p.returncode == 130 and "interrupted by SIGINT" in err, f"exit {p.returncode}: {err}"
        assert not segments(p.pid), segments(p.pid)
    os.unlink(path)


@check("--speed: a delay beyond 2^64 ns is waited for (clamped to 2^63 ns), and SIGINT ends it")
def _():
    r = {"input_length": 1024, "output_length": 1, "hash_ids": [1, 2]}
    for ts, speed in ((1e20, "1"), (10000, "1e-300")):
        path = write("late.jsonl", [dict(r, timestamp=0), dict(r, timestamp=ts)])
        p = subprocess.Popen([TOOL, "replay", path, "--speed", speed], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        time.sleep(2)
        assert p.poll() is None, f"--speed {speed}, timestamp {ts}: exited {p.returncode} without waiting"
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=30)
        assert p.returncode == 130 and "after 1 of 2 requests" in err, (ts, speed, p.returncode, err)
        assert not segments(p.pid), segments(p.pid)


@check("SIGINT/SIGTERM while the trace is read: no empty --plot or --csv file left")
def _():
    fifo = os.path.join(TMP, "slow.fifo")
    svg, csvp = os.path.join(TMP, "sig.svg"), os.path.join(TMP, "sig.csv")
    for sig in (signal.SIGINT, signal.SIGTERM):
        os.mkfifo(fifo)
        wfd = os.open(fifo, os.O_RDWR)  # a writer that keeps the trace open: the read waits for more
        try:
            os.write(wfd, (json.dumps(SMALL[0]) + "\n").encode())
            p = subprocess.Popen([TOOL, "replay", fifo, "--capacity-sweep", "1MiB,2MiB", "--plot", svg,
                                  "--csv", csvp], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(200):  # the outputs are open (written under temporary names beside them)
                if glob.glob(svg + ".umbp-tmp-*") and glob.glob(csvp + ".umbp-tmp-*"):
                    break
                time.sleep(0.05)
            time.sleep(0.3)
            assert p.poll() is None, f"exit {p.returncode}: {p.stderr.read()}"
            p.send_signal(sig)
            p.communicate(timeout=30)
        finally:
            os.close(wfd)
            os.unlink(fifo)
        assert p.returncode == -sig, (sig, p.returncode)
        assert not os.path.exists(svg) and not os.path.exists(csvp), (sig, "an empty output file is left")
        assert not glob.glob(os.path.join(TMP, "sig.*.umbp-tmp-*")), (sig, "a temporary file is left")


@check("stdout or stderr closed: the pool and the --plot file never become fd 1 or 2")
def _():
    # were fd 2 left closed, the pool's segment would be opened as fd 2 and a note on stderr would overwrite its header
    for fd in (1, 2):
        p = subprocess.Popen([TOOL, "replay", "--generate", "chat", "--conversations", "40", "--tp", "2",
                              "--speed", "1"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, preexec_fn=lambda fd=fd: os.close(fd))
        try:
            for _ in range(200):
                if segments(p.pid):
                    break
                time.sleep(0.05)
            seg = segments(p.pid)
            if fd == 1:  # a closed stdout fails after the setup line, before any run
                assert p.wait(timeout=30) == 1 and not seg, (p.returncode, seg)
                continue
            assert seg, "pool never appeared"
            target = os.readlink(f"/proc/{p.pid}/fd/{fd}")
            assert target == "/dev/null", f"fd {fd} of the scheduler is {target}"
            # both workers exec'd (a child between fork and exec, or one not yet
            # started, is not what this checks), then their fd as they run
            for w in wait_workers(p, 600):
                target = os.readlink(f"/proc/{w}/fd/{fd}")
                assert target == "/dev/null", f"fd {fd} of worker {w} is {target}"
            p.send_signal(signal.SIGTERM)
            assert p.wait(timeout=30) == 143, p.returncode
            assert not segments(p.pid), segments(p.pid)
        finally:
            p.kill()
            p.wait()
    svg = os.path.join(TMP, "closed.svg")
    p = subprocess.run([TOOL, "replay", write("small.jsonl", SMALL), "--capacity-sweep", "1MiB,2MiB", "--plot", svg],
                       stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=lambda: os.close(1),
                       timeout=120)
    assert p.returncode == 1, p.returncode
    if os.path.exists(svg):  # the summary written into the picture
        with open(svg, "rb") as f:
            assert f.read(5) == b"<?xml", "the text summary went into the --plot file"


@check("a worker stopped when the replay ends: named with its state, exit 1, no segment left")
def _():
    # request 2 has no whole block, so no worker hears of it: the next message is the goodbye
    path = write("ends.jsonl", [{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2]},
                                {"timestamp": 2000, "input_length": 10, "output_length": 1, "hash_ids": [3]}])
    p = subprocess.Popen([TOOL, "replay", path, "--tp", "2", "--speed", "1"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    workers = []
    try:
        workers = wait_workers(p, 200)
        time.sleep(0.8)
        os.kill(workers[1], signal.SIGSTOP)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
        for w in workers:
            try:
                os.kill(w, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert p.returncode == 1, f"exit {p.returncode}: {err}"
    assert f"worker rank 1 (pid {workers[1]}, state T, stopped" in err and "did not exit within 10 s" in err, err
    assert not segments(p.pid), segments(p.pid)


@check("SIGINT: exit 130, workers reaped, pool removed")
def _():
    p = start_slow()
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 130, f"exit {p.returncode}: {err}"
    assert "interrupted by SIGINT" in err, err
    assert not segments(p.pid)


@check("SIGTERM: exit 143, pool removed")
def _():
    p = start_slow()
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 143, f"exit {p.returncode}: {err}"
    assert not segments(p.pid)


def group_states(pgid):
    """Each process of group pgid: pid, state and wait channel, from /proc."""
    rows = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{d}/stat") as f:
                st = f.read().rsplit(")", 1)[1].split()
            if int(st[2]) != pgid:
                continue
            with open(f"{d}/wchan") as f:
                rows.append(f"pid {d[6:]} state {st[0]} wchan {f.read()}")
        except (OSError, IndexError, ValueError):
            pass
    return "; ".join(rows) or "none left"


@check("SIGHUP or SIGQUIT to the whole process group (a terminal hung up, Ctrl-\\): exit 129 / 131, no segment left")
def _():
    import resource
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # should the scheduler ever dump core: no file
    # early: as soon as the pool exists (workers starting, some between fork and exec);
    # steady: both workers exec'd and replaying
    for when in ("early", "steady"):
        for sig, rc in ((signal.SIGHUP, 129), (signal.SIGQUIT, 131)):
            p = subprocess.Popen([TOOL, "replay", "--generate", "chat", "--conversations", "40", "--tp", "2",
                                  "--speed", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 start_new_session=True,  # its own group, as a terminal's foreground job
                                 preexec_fn=taplib.foreground)
            if when == "early":
                for _ in range(2000):
                    if segments(p.pid):
                        break
                    time.sleep(0.005)
                assert segments(p.pid), "pool never appeared"
            else:
                wait_workers(p, 400)
            os.killpg(p.pid, sig)
            try:
                out, err = p.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                states = group_states(p.pid)
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                raise AssertionError(f"{when} {sig.name}: not ended 60 s after the signal: {states}")
            assert p.returncode == rc, f"{when} {sig.name}: exit {p.returncode}: {err}"
            assert f"interrupted by {sig.name}" in err and "removing pool" in err, (when, sig.name, err)
            assert not segments(p.pid), (when, sig.name, segments(p.pid))


@check("run under nohup (SIGHUP ignored): a SIGHUP leaves the replay running; SIGTERM still removes the pool")
def _():
    p = subprocess.Popen([TOOL, "replay", "--generate", "chat", "--conversations", "40", "--tp", "2",
                          "--speed", "1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    try:
        wait_workers(p, 400)
        os.killpg(p.pid, signal.SIGHUP)
        time.sleep(1)
        assert p.poll() is None, f"SIGHUP ended a replay that ignores it: exit {p.returncode}"
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert p.returncode == 143, f"exit {p.returncode}: {err}"
    assert not segments(p.pid), segments(p.pid)


@check("scheduler killed by SIGKILL: the workers remove the pool")
def _():
    p = start_slow()
    p.kill()
    p.communicate(timeout=30)
    # the workers notice within their poll period; a loaded 2-core machine
    # (CI runs two suites at once) can delay them by seconds
    end = time.monotonic() + 30
    while segments(p.pid) and time.monotonic() < end:
        time.sleep(0.05)
    assert not segments(p.pid), segments(p.pid)


BAD_FILES = [
    ("not JSON", ["{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}", "hello"], ":2: column 1"),
    ("missing hash_ids", ["{\"input_length\": 10, \"output_length\": 1}"], "no \"hash_ids\" field"),
    ("hash id negative", ["{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [-1]}"], "non-negative integer"),
    ("length a float", ["{\"input_length\": 1.5, \"output_length\": 1, \"hash_ids\": [1]}"], "input_length must be"),
    ("ids do not cover input", ["{\"input_length\": 5000, \"output_length\": 1, \"hash_ids\": [1]}"], "--block-tokens"),
    ("truncated", ["{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1,"], "column"),
    ("trailing text", ["{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]} x"], "after the object"),
    ("duplicate field", ["{\"input_length\": 10, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}"],
     "appears twice"),
    ("deep nesting", ["{\"a\": " + "[" * 100 + "]" * 100 + ", \"input_length\": 1, \"output_length\": 1, "
                      "\"hash_ids\": [1]}"], "nested deeper"),
    ("empty file", [], "no requests"),
    ("huge id", ["{\"input_length\": 10, \"output_length\": 1, \"hash_ids\": [99999999999999999999999]}"], "64 bits"),
]


GEN = ["--generate", "chat", "--conversations", "120"]


def svg_points(path):
    """The SVG's plotted points, marks and axis label, through an XML parser."""
    import xml.etree.ElementTree as ET
    ns = "{http://www.w3.org/2000/svg}"
    root = ET.parse(path).getroot()
    assert root.tag == ns + "svg", root.tag
    pts = {"blocks": [], "tokens": []}
    for c in root.iter(ns + "circle"):
        pts[c.get("class")].append((int(c.get("data-capacity")), float(c.get("data-ratio")),
                                    float(c.get("cx")), float(c.get("cy"))))
    lines = {l.get("class"): l for l in root.iter(ns + "line") if l.get("class")}
    texts = " ".join("".join(t.itertext()) for t in root.iter(ns + "text"))
    return pts, lines, texts


@check("--plot and --csv: the SVG's points and the CSV equal the --json figures")
def _():
    svg, csv_path = os.path.join(TMP, "curve.svg"), os.path.join(TMP, "curve.csv")
    caps = "1MiB,2MiB,4MiB,8MiB,24MiB,32MiB,64MiB"  # 64x: a log axis; no 'unbounded': one is added
    d = run_json(*GEN, "--capacity-sweep", caps, "--plot", svg, "--csv", csv_path)
    sweep = d["sweep"]
    assert [r["unbounded"] for r in sweep] == [False] * 7 + [True], "an unbounded run is added last"
    bounded = [r for r in sweep if not r["unbounded"]]
    unb = sweep[-1]
    pts, lines, texts = svg_points(svg)
    for kind, key in (("blocks", "cache_ratio"), ("tokens", "token_ratio")):
        got = sorted((c, r) for c, r, _, _ in pts[kind])
        want = sorted((r["capacity_bytes"], r[key]) for r in bounded)
        assert got == want, (kind, got, want)
        by_cap = sorted(pts[kind])
        xs = [x for _, _, x, _ in by_cap]
        assert xs == sorted(xs) and len(set(xs)) == len(xs), "x grows with the capacity"
        # log axis: equal capacity ratios are equal distances
        c0, c1, c2 = by_cap[0][0], by_cap[1][0], by_cap[-1][0]
        close((xs[1] - xs[0]) / (xs[-1] - xs[0]), math.log(c1 / c0) / math.log(c2 / c0), "log x", rel=1e-3)
        # y: linear in the ratio, up is higher
        (ra, ya), (rb, yb) = min((r, y) for _, r, _, y in by_cap), max((r, y) for _, r, _, y in by_cap)
        if rb > ra:
            for _, r, _, y in by_cap:
                close((ya - y) / (ya - yb), (r - ra) / (rb - ra), "linear y", rel=1e-3)
    assert "log scale" in texts, texts
    assert float(lines["unbounded-blocks"].get("data-ratio")) == unb["cache_ratio"] == d["unbounded_cache_ratio"]
    assert float(lines["unbounded-tokens"].get("data-ratio")) == unb["token_ratio"]
    reach = [r["capacity_bytes"] for r in bounded if r["cache_ratio"] >= 0.95 * unb["cache_ratio"]]
    assert len(reach) >= 2, "two capacities or more reach 95% of unbounded (so the smallest is a choice)"
    assert d["capacity_for_95pct_bytes"] == min(reach)
    assert int(lines["knee"].get("data-capacity")) == min(reach)
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(sweep)
    for row, r in zip(rows, sweep):
        assert int(row["capacity_bytes"]) == r["capacity_bytes"] and int(row["slots"]) == r["slots"]
        assert row["unbounded"] == ("1" if r["unbounded"] else "0")
        assert float(row["cache_ratio"]) == r["cache_ratio"] and float(row["token_ratio"]) == r["token_ratio"]
        assert int(row["blocks_hit"]) == r["blocks_hit"] and int(row["blocks_total"]) == r["blocks_total"]
        assert int(row["evictions"]) == r["evictions"]
    # the text form says the 95% capacity in a line of its own
    rc, out, err = run(*GEN, "--capacity-sweep", caps + ",unbounded", "--plot", svg)
    assert rc == 0, err
    want = f"95% of the unbounded cache ratio ({100 * unb['cache_ratio']:.2f}%) is reached at "
    assert want in out, out
    assert f"curve drawn in {svg}" in out, out


@check("--plot / --csv misuse: exit 2 naming the option; an unwritable file: exit 1 before any run")
def _():
    svg = os.path.join(TMP, "x.svg")
    for args, msg in ((["--plot", svg], "--plot draws the curve of a sweep"),
                      (["--csv", svg, "--capacity", "1MiB"], "--csv draws the curve of a sweep"),
                      (["--plot", svg, "--capacity-sweep", "1MiB,unbounded"], "--plot needs two capacities"),
                      (["--plot", "", "--capacity-sweep", "1MiB,2MiB"], "--plot needs a file name")):
        rc, out, err = run(*GEN, *args)
        assert rc == 2 and msg in err, (args, rc, err)
    rc, out, err = run(*GEN, "--capacity-sweep", "1MiB,2MiB", "--plot", "/nonexistent-dir/c.svg")
    assert rc == 1 and "--plot /nonexistent-dir/c.svg: cannot write it" in err, (rc, err)
    assert "requests" not in out, "no replay ran"


@check("bad trace files: file:line and the cause, exit 1")
def _():
    for i, (what, lines, expect) in enumerate(BAD_FILES):
        path = write(f"bad{i}.jsonl", lines)
        rc, out, err = run(path)
        assert rc == 1, f"{what}: exit {rc}: {err}"
        assert expect in err, f"{what}: {expect!r} not in {err!r}"
        assert err.startswith("umbp: replay: "), err


@check("binary garbage and a missing file: exit 1, no crash")
def _():
    path = os.path.join(TMP, "garbage.jsonl")
    with open(path, "wb") as f:
        # a first byte that is not blank: a first line of blanks alone is skipped,
        # and the error would name line 2 (1 run in ~200 with random bytes alone)
        f.write(b"\xff" + os.urandom(1 << 16))
    rc, out, err = run(path)
    assert rc == 1 and "garbage.jsonl:1:" in err, (rc, err)
    rc, out, err = run(os.path.join(TMP, "no-such-file.jsonl"))
    assert rc == 1 and "cannot open trace" in err and "No such file" in err, (rc, err)


@check("a device, a directory, a line over 32 MiB: exit 1 at once; a pipe is read")
def _():
    # getline() grew one line of /dev/zero to 11 GB of RSS
    long = os.path.join(TMP, "long.jsonl")
    with open(long, "wb") as f:
        f.write(b'{"input_length": 0, "output_length": 0, "hash_ids": []}\n')
        f.write(b"x" * ((32 << 20) + 1))
    for path, cause in (("/dev/zero", "'/dev/zero' is a character device"), (TMP, "is a directory"),
                        (long, "line 2 is longer than 32 MiB: not a JSONL trace")):
        t0 = time.monotonic()
        rc, out, err = run(path, timeout=30)
        assert rc == 1 and cause in err and out == "", (path, rc, err)
        assert time.monotonic() - t0 < 20, (path, "fails fast")
    os.unlink(long)
    with open(write("pipe.jsonl", SMALL)) as f:  # stdin is a pipe through cat
        cat = subprocess.Popen(["cat"], stdin=f, stdout=subprocess.PIPE)
        p = subprocess.run([TOOL, "replay", "/dev/stdin", "--json"], stdin=cat.stdout, capture_output=True,
                           text=True, timeout=120)
        cat.wait()
    assert p.returncode == 0 and json.loads(p.stdout)["requests"] == len(SMALL), (p.returncode, p.stderr)


@check("a pool left under the replay's name (an earlier run killed, its PID reused) is kept, and the replay runs")
def _():
    # sh creates replay-PID-0 and then execs the replay under the same PID
    trace = write("small.jsonl", SMALL)
    p = subprocess.Popen(["sh", "-c", '"$0" pool create replay-$$-0 --capacity 4MiB >/dev/null && '
                          'exec "$0" replay "$1" --json', TOOL, trace], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=300)
    left = glob.glob("/dev/shm/umbp.replay-%d-*" % p.pid)
    try:
        # it failed: "a pool named 'replay-PID-0' already exists ... pick another name", which replay cannot
        assert p.returncode == 0, (p.returncode, err)
        assert json.loads(out)["requests"] == len(SMALL), out
        assert left == ["/dev/shm/umbp.replay-%d-0" % p.pid], "the other pool is kept, the replay's removed: %s" % left
    finally:
        subprocess.run([TOOL, "pool", "destroy", "replay-%d-0" % p.pid], capture_output=True)


@check("--csv or --plot naming the trace, or both naming one file, is a usage error that leaves the trace intact")
def _():
    trace = write("keep.jsonl", SMALL)
    before = open(trace, "rb").read()
    link = os.path.join(TMP, "keep-link.jsonl")
    if not os.path.lexists(link):
        os.symlink(trace, link)
    for args, want in ((["--csv", trace], "--csv %s is the trace file" % trace),
                       (["--plot", link], "--plot %s is the trace file" % link),
                       (["--csv", os.path.join(TMP, "both.out"), "--plot", os.path.join(TMP, "both.out")],
                        "--plot and --csv name the same file")):
        rc, out, err = run(trace, "--capacity-sweep", "4MiB,8MiB", *args)
        # the outputs were opened (truncated) first: the trace read as empty, and was then removed
        assert rc == 2 and want in err and "Try 'umbp replay --help'" in err, (args, rc, err)
        assert os.path.exists(trace) and open(trace, "rb").read() == before, "%s: the trace was changed" % args
    assert not os.path.exists(os.path.join(TMP, "both.out"))
    # one device for both is fine
    rc, out, err = run(trace, "--capacity-sweep", "4MiB,8MiB", "--csv", "/dev/null", "--plot", "/dev/null")
    assert rc == 0, (rc, err)


@check("--plot: a trace path that is not UTF-8, or cut in a character by the title's bound, gives well-formed XML")
def _():
    import xml.etree.ElementTree as ET
    tmp = TMP.encode()
    bad = os.path.join(tmp, b"dir-\xff\xfe", b"t.jsonl")
    # the title keeps 299 bytes of "PATH (tp ...)": a run of 2-byte characters that starts at an even
    # distance before byte 298 has a character cut in half there
    base = len(tmp) + 1
    a = next(a for a in range(1, 300) if (298 - (base + a + 1)) % 2 == 0 and 0 <= 298 - (base + a + 1) < 238)
    cut = os.path.join(tmp, b"x" * a, ("\u00e9" * 120).encode(), b"t.jsonl")
    assert cut[298:299] == b"\xc3", cut[290:300]
    for path in (bad, cut):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(write("small.jsonl", SMALL), "rb") as src, open(path, "wb") as dst:
            dst.write(src.read())
        svg = os.path.join(TMP, "name.svg")
        p = subprocess.run([TOOL, "replay", path, "--capacity-sweep", "1MiB,2MiB", "--plot", svg],
                           capture_output=True, timeout=120)
        assert p.returncode == 0, p.stderr
        root = ET.parse(svg).getroot()  # raises on bytes that are not UTF-8
        title = [t.text for t in root.iter("{http://www.w3.org/2000/svg}text") if "capacity:" in (t.text or "")]
        assert len(title) == 1 and ("dir-??" in title[0] if path is bad else "\u00e9\u00e9" in title[0]), title
        os.unlink(path)


@check("a failed write of --plot, --csv or stdout: exit 1, no success line, no device removed")
def _():
    sweep = [*GEN, "--capacity-sweep", "1MiB,2MiB"]
    for opt, path in (("--plot", "/dev/full"), ("--csv", "/dev/full"), ("--csv", "/proc/version")):
        rc, out, err = run(*sweep, opt, path)
        assert rc == 1 and f"{opt} {path}" in err, (opt, path, rc, err)
        assert "curve drawn" not in out and "curve written" not in out, (opt, path, out)
    with open("/dev/full", "w") as full:  # stdout full: --json, the text summary, a sweep's table
        for args in (["--json"], [], ["--capacity-sweep", "1MiB,2MiB"]):
            p = subprocess.run([TOOL, "replay", *GEN, *args], stdout=full, stderr=subprocess.PIPE, text=True,
                               timeout=300)
            assert p.returncode == 1 and "writing the output failed: No space left" in p.stderr, (args, p.stderr)
    # a run that fails removes a half-written regular file, never a device node (as root: /dev/null)
    dev = os.path.join(TMP, "null")
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except OSError as e:
        return f"SKIP cannot make a device node here ({e}): the unlink part is not checked"
    rc, out, err = run(os.path.join(TMP, "no-such.jsonl"), "--capacity-sweep", "1MiB,2MiB", "--plot", dev)
    assert rc == 1 and os.path.exists(dev) and stat.S_ISCHR(os.stat(dev).st_mode), (rc, err)
    svg = os.path.join(TMP, "dropped.svg")
    rc, out, err = run(os.path.join(TMP, "no-such.jsonl"), "--capacity-sweep", "1MiB,2MiB", "--plot", svg)
    assert rc == 1 and not os.path.exists(svg), (rc, err)
    os.unlink(dev)


@check("a run or a write that fails, or a signal, leaves an existing --plot, --csv or --output file as it was")
def _():
    # the files were opened (truncated) before the run and removed when it failed: a mistyped trace
    # name cost the curve of the last good run
    svg, csvp, gen = (os.path.join(TMP, n) for n in ("prev.svg", "prev.csv", "prev.jsonl"))
    for f in (svg, csvp, gen):
        with open(f, "w") as fh:
            fh.write("previous\n")
    rc, out, err = run(os.path.join(TMP, "no-such.jsonl"), "--capacity-sweep", "1MiB,2MiB", "--plot", svg,
                       "--csv", csvp)
    assert rc == 1 and "cannot open trace" in err, (rc, err)
    import resource

    def small_fsize():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (16384, 16384))
    p = subprocess.run([TOOL, "replay", "--generate", "chat", "--conversations", "60", "--output", gen],
                       capture_output=True, text=True, timeout=300, preexec_fn=small_fsize)
    assert p.returncode == 1, (p.returncode, p.stderr)
    for f in (svg, csvp, gen):
        assert open(f).read() == "previous\n", f
    assert not glob.glob(os.path.join(TMP, "prev.*.umbp-tmp-*")), glob.glob(os.path.join(TMP, "prev.*"))
    # and a run that succeeds replaces them
    rc, out, err = run(write("small.jsonl", SMALL), "--capacity-sweep", "1MiB,2MiB", "--csv", csvp)
    assert rc == 0 and open(csvp).read().startswith("capacity_bytes,"), (rc, err)


BAD_ARGS = [
    (["--tp", "0"], "--tp '0'"),
    (["--tp", "x"], "--tp"),
    # strtoull alone takes a leading space or sign: a number is digits only
    (["--tp", " 2"], "--tp ' 2'"),
    (["--seed", "+5"], "--seed '+5'"),
    (["--capacity", "lots"], "--capacity 'lots'"),
    (["--capacity", "4KiB", "--tp", "2"], "a pool needs 2"),
    # a pool needs 2 slots: refused before the trace is read, naming the sweep's entry, not --capacity
    (["--capacity", "64KiB"], "--capacity: capacity 64 KiB holds 1 slots of 64 KiB, and a pool needs 2"),
    (["--capacity-sweep", "1MiB,64KiB"], "--capacity-sweep: capacity 64 KiB holds 1 slots of 64 KiB, and a pool needs 2"),
    (["--capacity", "1GiB", "--unbounded"], "exclude each other"),
    (["--capacity-sweep", "1GiB,"], "ends with a comma"),
    (["--capacity-sweep", "1GiB,,2GiB"], "--capacity-sweep"),
    (["--block-tokens", "0"], "--block-tokens"),
    (["--bytes-per-token", "0"], "--bytes-per-token"),
    (["--speed", "-1"], "--speed"),
    (["--speed", "0x10"], "--speed '0x10'"),
    (["--cap", "1MiB"], "'--cap' is ambiguous: it begins --capacity, --capacity-sweep"),
    (["--seed", "3"], "add --generate chat"),
    (["--generate", "poems"], "'chat'"),
    (["--frobnicate"], "unknown option"),
    # more slots than a pool can index: refused before the trace is read, naming replay's own options
    # (the library's message names --slot-size, which replay does not have)
    (["--capacity", "1000TiB"], "a pool has at most 16777215; use a capacity of at most 1023GiB"),
    (["--capacity-sweep", "1GiB,1000TiB"], "a pool has at most 16777215"),
    # a value given to an option that takes none is named as such, not as a missing value
    (["--json=1"], "option '--json' takes no value"),
    (["--unbounded=yes"], "option '--unbounded' takes no value"),
    ([], "no workload"),
    # issue 32, smaller defects: the option is named (not its value), an empty sweep is refused, sizes are decimal
    (["--generate", "chat", "--conversations", "-1"], "--conversations '-1' is out of range"),
    (["--generate", "chat", "--turns=0"], "--turns '0' is out of range"),
    (["--capacity-sweep", ""], "--capacity-sweep '' is empty"),
    (["--capacity", "0x40000000"], "--capacity '0x40000000'"),
    # an empty path is a usage error everywhere; --output ignores every replay option, so they are refused
    (["--generate", "chat", "--output", ""], "--output needs a file name"),
    (["--generate", "chat", "--csv", "", "--capacity-sweep", "1MiB,2MiB"], "--csv needs a file name"),
    (["--generate", "chat", "--output", "-", "--json"], "so --json would be ignored"),
    (["--generate", "chat", "--output", "-", "--capacity", "1GiB"], "so --capacity would be ignored"),
    (["--generate", "chat", "--output", "-", "--capacity-sweep", "1MiB,2MiB", "--plot", "x.svg"],
     "so --capacity-sweep would be ignored"),
]


@check("bad arguments: a message naming the fix, exit 2")
def _():
    small = write("small.jsonl", SMALL)
    for args, expect in BAD_ARGS:
        full = args if not args or args[0] in ("--seed", "--generate") else [small, *args]
        rc, out, err = run(*full)
        assert rc == 2, f"{args}: exit {rc}: {err}"
        assert expect in err and "Try 'umbp replay --help'" in err, f"{args}: {err!r}"
    rc, out, err = run(small, "--generate", "chat")
    assert rc == 2 and "not both" in err
    rc, out, err = run("")
    assert rc == 2 and "TRACE file name is empty" in err, (rc, err)
    # a write that fails names the file and the cause
    rc, out, err = run("--generate", "chat", "--conversations", "3", "--output", "/dev/full")
    assert rc == 1 and "'/dev/full'" in err and "No space left" in err, (rc, err)


@check("an unbounded replay that cannot fit /dev/shm says how to sweep instead (no --capacity was given)")
def _():
    # 20 conversations, 512-token blocks of 2e6 bytes per token (a shard is at most 1 GiB): 84 distinct
    # blocks of 0.95 GiB = 80 GiB
    need = 84 * 512 * 2_000_000
    st = os.statvfs("/dev/shm")
    if st.f_bavail * st.f_frsize >= need:
        return f"SKIP /dev/shm has room for {need} bytes: this machine cannot show the refusal"
    rc, out, err = run("--generate", "chat", "--conversations", "20", "--bytes-per-token", "2000000")
    assert rc == 1, (rc, err)
    assert "No --capacity was given" in err and "--capacity-sweep " in err, err
    # the suggested sweep is one that parses (sizes without spaces)
    sweep = err.split("--capacity-sweep ")[1].split()[0]
    assert all(x.endswith(("MiB", "GiB")) and x[:-3].isdigit() for x in sweep.split(",")), sweep
    # with 32 ranks of 256 MiB shards a pool needs 8 GiB (a slot per rank): the suggested sweep
    # holds only capacities that the sweep accepts (it suggested 2GiB,4GiB,8GiB, a usage error),
    # or, when not even 8 GiB fits, says what to lower
    rc, out, err = run("--generate", "chat", "--conversations", "20", "--bytes-per-token", "16MiB", "--tp", "32")
    assert rc == 1 and "No --capacity was given" in err, (rc, err)
    if "--capacity-sweep " in err:
        sweep = err.split("--capacity-sweep ")[1].split()[0]
        units = {"MiB": 1 << 20, "GiB": 1 << 30}
        caps = [int(x[:-3]) * units[x[-3:]] for x in sweep.split(",")]
        assert caps and all(c >= 32 * (256 << 20) for c in caps), sweep
    else:
        assert "lower --bytes-per-token or --tp" in err, err


@check("an unbounded pool with more slots than a pool can index names --capacity and --tp, not --slot-size")
def _():
    # 600000 distinct 1-token blocks on 32 ranks: 19.2M slots, over the 16777215 a pool indexes
    n = 600000
    path = write("many-blocks.jsonl", [{"input_length": n, "output_length": 1, "hash_ids": list(range(n))}])
    rc, out, err = run(path, "--tp", "32", "--block-tokens", "1")
    assert rc == 1, (rc, err)
    assert "the unbounded pool needs 19200064 slots" in err and "--capacity-sweep of at most 63GiB" in err, err
    assert "fewer ranks (--tp)" in err and "--slot-size" not in err, err
    os.unlink(path)


@check("--help documents the options and the generator")
def _():
    rc, out, err = run("--help")
    assert rc == 0
    for w in ["--tp", "--capacity", "--unbounded", "--capacity-sweep", "--block-tokens", "--bytes-per-token",
              "--speed", "--json", "--generate chat", "--seed", "--conversations", "--turns",
              "--system-prompts", "--system-tokens", "--user-tokens", "--output-tokens", "--rate", "--think",
              "--output", "Exit status", "Example"]:
        assert w in out, w
    assert "--worker" not in out
    # docs/replay.md documents every option --help lists
    doc = open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "replay.md")).read()
    import re
    for opt in sorted(set(re.findall(r"^  (--[a-z-]+)", out, re.M))):
        assert f"`{opt}" in doc, f"{opt} is in --help but not in docs/replay.md"
    # and every exit status it lists ("Exit status: 0 done; 1 ...; 3 a SIGBUS ...; 130 / 143 ...")
    status = out.split("Exit status:")[1].split("\n\n")[0]
    for code in re.findall(r"(?:^ |; |\n)(\d+(?: / \d+)?) ", status):
        assert f"\n| {code} |" in doc, f"exit status {code} is in --help but not in docs/replay.md"


@check("synthetic Mooncake trace, unbounded: the paper's Table 2")
def synthetic():
    path = os.path.join(DATA, "traces", "synthetic_trace.jsonl")
    if not os.path.exists(path):
        return f"SKIP {path} not found (../shared/data is not beside the clone)"
    t0 = time.time()
    d = run_json(path, "--unbounded", timeout=900)
    wall = time.time() - t0
    assert d["requests"] == 3993, d["requests"]
    # exact averages from the sums (the JSON writer keeps 6 significant digits)
    avg_in, avg_out = d["input_tokens"] / d["requests"], d["output_tokens"] / d["requests"]
    assert round(avg_in) == 15325 and abs(d["avg_input_tokens"] - avg_in) < 0.1, (avg_in, d["avg_input_tokens"])
    assert round(avg_out) == 149 and abs(d["avg_output_tokens"] - avg_out) < 0.01, avg_out
    assert round(100 * d["cache_ratio"]) == 66, d["cache_ratio"]
    # the exact counts, from a plain-set computation of the same definition
    assert d["blocks_hit"] == 77740 and d["blocks_total"] == 117888, (d["blocks_hit"], d["blocks_total"])
    assert d["distinct_blocks"] == 40148 and d["evictions"] == 0 and d["verify_failures"] == 0
    assert d["pool_segment_bytes"] < 4 << 30, d["pool_segment_bytes"]
    print(f"# synthetic: {wall:.1f} s wall, pool segment {d['pool_segment_bytes'] / 2**30:.2f} GiB, "
          f"cache ratio {d['cache_ratio']:.4f}")


def main():
    if not TOOL or not os.access(TOOL, os.X_OK):
        print("1..0 # SKIP UMBP_TOOL is not set to the umbp binary")
        return 0
    todo = results
    if len(sys.argv) > 1 and sys.argv[1] == "synthetic":
        todo = [r for r in results if r[1] is synthetic]
    else:
        todo = [r for r in results if r[1] is not synthetic]
    try:
        return taplib.run(todo)
    finally:
        shutil.rmtree(TMP, ignore_errors=True)  # the traces, plots and FIFOs the checks wrote


if __name__ == "__main__":
    sys.exit(main())
