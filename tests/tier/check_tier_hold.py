#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`umbp tier` holds the slots of transfers Mooncake gave up on
(python/umbp/tier_server.py, MC_MAY_STILL_RUN): a get or put answered
TRANSFER_FAIL may still write into or read from its slot, so that slot is
neither aborted, unpinned nor published until the tier exits. The Tier runs
here on a real pool with a stand-in store that answers as Mooncake does;
suite 'cluster' provokes the late transfer itself against a real master
(test_transfer_mooncake_gave_up_on_keeps_its_slots). Each check looks at
which slots another handle can still take: a held slot is not among them."""
import contextlib
import ctypes as C
import io
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import taplib  # noqa: E402
from umbp import _lib as L  # noqa: E402
from umbp import tier as T  # noqa: E402
from umbp import tier_server as S  # noqa: E402

if os.environ.get("UMBP_SANITIZE", "none") not in ("none", ""):
    print("1..0 # SKIP a sanitizer build's libumbp cannot be loaded into Python")
    sys.exit(0)
TOOL = os.environ["UMBP_TOOL"]
NS = "hold-model"
SLOTS, SLOT = 16, 64 << 10
checks, check = taplib.registry()
_n = iter(range(1 << 30))


class Store:
    """Answers batch_get_into, batch_put_from and batch_is_exist with the
    codes given (a get's positive answer also writes the shard's bytes);
    raises when the answer is an exception."""

    def __init__(self, get=(), put=()):
        self.get, self.put = get, put if isinstance(put, Exception) else list(put)

    def close(self):
        pass

    def batch_is_exist(self, names):
        return [0] * len(names)

    def batch_get_into(self, names, ptrs, sizes):
        if isinstance(self.get, Exception):
            raise self.get
        for p, s, r in zip(ptrs, sizes, self.get):
            if r > 0:
                C.memset(p, 0x42, s)
        return self.get[:len(names)]

    def batch_put_from(self, names, ptrs, sizes):
        if isinstance(self.put, Exception):
            raise self.put
        return self.put[:len(names)]


def create_pool() -> str:
    name = f"hold-{os.getpid()}-{next(_n)}"
    r = subprocess.run([TOOL, "pool", "create", name, "--capacity", str(SLOTS * SLOT), "--slot-size",
                        str(SLOT), "--no-prefault", "--index-pages", "small", "--quiet"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return name


class Pool:
    """A fresh pool, a Tier serving it with a stand-in store, and a second
    handle that plays another process of the host."""

    def __init__(self, store, writeback="off", name=None):
        """name: serve that existing pool (made by create_pool()) instead of a fresh one."""
        self.name = name or create_pool()
        a = S.build_parser().parse_args([self.name, "--writeback", writeback, "--records", "4",
                                         "--keys-per-record", "16", "--feed-capacity", "64"])
        self.lib = T.lib()
        self.tier = S.Tier(a, S.Log(None, False))
        self.tier.store, self.tier.state = store, T.CONNECTED
        o = L.AttachOpts()
        self.lib.umbp_attach_opts_init(C.byref(o))
        self.h = C.c_void_p()
        L.check(self.lib.umbp_pool_attach(self.name.encode(), C.byref(o), C.byref(self.h)), "attach")
        nsid = C.c_uint32()
        L.check(self.lib.umbp_ns_register(self.h, NS.encode(), C.byref(nsid)), "namespace")
        self.ns = nsid.value

    def key(self, bid: int) -> L.Key:
        k = L.Key()
        k.ns, k.tp_rank, k.hash_len = self.ns, 0, 32
        for i in range(32):
            k.hash[i] = (bid * 7 + i) & 0xFF
        return k

    def fetch(self, n: int) -> int:
        """The tier's answer to a request for blocks 0..n of one rank."""
        for i in range(n):
            self.tier.keys[i] = self.key(i)
        job = T.TierJob()
        job.n_blocks, job.n_ranks = n, 1
        return self.tier.fetch(job)[0]

    def publish(self, n: int) -> None:
        sl = (C.c_uint32 * n)()
        assert self.lib.umbp_reserve_bulk(self.h, -1, self.ns, n, sl) == n, T.last_error()
        rc = (C.c_int * n)()
        self.lib.umbp_publish_bulk(self.h, n, sl, (L.Key * n)(*[self.key(i) for i in range(n)]), rc)
        assert list(rc) == [0] * n, list(rc)

    def takeable(self) -> int:
        """How many slots the other handle gets (evicting what it may)."""
        buf = (C.c_uint32 * SLOTS)()
        got = []
        while (k := self.lib.umbp_reserve_bulk(self.h, -1, self.ns, SLOTS, buf)) > 0:
            got += buf[:k]
        for sl in got:
            self.lib.umbp_abort(self.h, sl)
        return len(got)

    def stat(self, name: str) -> int:
        return T.tier_info(self.h)["stats"][name]

    def close(self) -> None:
        self.tier.close()
        self.lib.umbp_pool_detach(self.h)
        subprocess.run([TOOL, "pool", "destroy", self.name, "--force"], capture_output=True, timeout=60)


@check("fetch: a shard answered TRANSFER_FAIL keeps its slot reserved, the rest as before")
def fetch_transfer_fail():
    p = Pool(Store(get=[SLOT, S.MC_TRANSFER_FAIL, S.MC_OBJECT_NOT_FOUND]))
    try:
        assert p.fetch(3) == 1  # block 0 arrived and is published
        assert p.takeable() == SLOTS - 1  # block 0 evictable, the missing one's slot back, the held one not
        assert p.stat("held") == 1 and len(p.tier.held) == 1 and p.stat("fetch_errors") == 1
    finally:
        p.close()


@check("fetch: an RPC failure gives the slots back, except those answered TRANSFER_FAIL")
def fetch_rpc_fail():
    p = Pool(Store(get=[S.MC_RPC_FAIL, S.MC_TRANSFER_FAIL]))
    try:
        assert p.fetch(2) == -S.errno.ENOTCONN
        assert p.takeable() == SLOTS - 1 and p.stat("held") == 1
    finally:
        p.close()


@check("fetch: a batch_get_into that raises keeps every slot it was given")
def fetch_raises():
    p = Pool(Store(get=RuntimeError("std::bad_alloc")))
    try:
        try:
            p.fetch(2)
        except RuntimeError:
            pass
        else:
            raise AssertionError("the stand-in's exception did not propagate")
        assert p.takeable() == SLOTS - 2 and p.stat("held") == 2
    finally:
        p.close()


@check("a tier holding more than a quarter of the pool's slots stops (exit 1), saying why")
def held_over_quarter_stops():
    p = Pool(Store(get=[S.MC_TRANSFER_FAIL] * 8))
    lines = []
    p.tier.log = lambda msg, debug=False: lines.append(msg)
    try:
        p.fetch(4)  # 4 of 16 held: a quarter, still serving
        assert p.stat("held") == 4 and not p.tier.signalled and p.tier.exit_code == 0, lines
        p.fetch(1)  # one more slot reserved and answered TRANSFER_FAIL: 5 of 16 held
        assert p.stat("held") == 5, p.stat("held")
        assert p.tier.signalled and p.tier.exit_code == 1, lines
        assert any("holds 5 of the pool's 16 slots" in m and "stopping" in m for m in lines), lines
        p.tier.serve_loop()  # returns at once, as after SIGTERM
        assert p.takeable() == SLOTS - 5  # the held slots stay held until the process ends
    finally:
        p.close()


@check("write-back: a put answered TRANSFER_FAIL keeps its pin, the others are unpinned")
def put_transfer_fail():
    p = Pool(Store(put=[0, S.MC_TRANSFER_FAIL, S.MC_NO_AVAILABLE_HANDLE]), writeback="all")
    try:
        p.publish(3)
        for i in range(3):
            p.tier.q.append((i, p.key(i), 0))
        assert p.tier.write_batch(8) == 3
        assert p.takeable() == SLOTS - 1  # the held block stays pinned: not evictable
        assert p.stat("held") == 1 and p.stat("wb_written") == 1
    finally:
        p.close()


@check("write-back: a put tried again and answered TRANSFER_FAIL again holds one slot, counted once")
def put_transfer_fail_twice():
    p = Pool(Store(put=[S.MC_TRANSFER_FAIL]), writeback="all")
    try:
        p.publish(1)
        p.tier.q.append((0, p.key(0), 0))
        assert p.tier.write_batch(8) == 1 and len(p.tier.later) == 1  # tried again later (a refusal)
        p.tier.q.extend(it for _, it in p.tier.later)
        p.tier.later = []
        assert p.tier.write_batch(8) == 1  # the same slot, pinned again, answered TRANSFER_FAIL again
        assert p.takeable() == SLOTS - 1
        assert p.stat("held") == 1, p.stat("held")
    finally:
        p.close()


@check("write-back: a batch_put_from that raises keeps its pins, and its keys are tried again, not the thread ended")
def put_raises():
    # before: the exception left write_batch() and ended the write-back thread
    p = Pool(Store(put=RuntimeError("std::bad_alloc")), writeback="all")
    try:
        p.publish(2)
        for i in range(2):
            p.tier.q.append((i, p.key(i), 0))
        assert p.tier.write_batch(8) == 2
        assert [it[2] for _, it in p.tier.later] == [1, 1]  # tried again later, a try counted
        assert p.takeable() == SLOTS - 2 and p.stat("held") == 2  # may still be read: pinned
        p.tier.q.extend(it for _, it in p.tier.later)
        p.tier.later = []
        p.tier.write_batch(8)
        p.tier.q.extend(it for _, it in p.tier.later)
        p.tier.later = []
        p.tier.write_batch(8)  # the third try: given up and counted
        assert p.tier.later == [] and p.stat("wb_errors") == 2 and p.stat("held") == 2
    finally:
        p.close()


@check("close: a tier holding slots leaves them to the reaper instead of detaching")
def close_leaves_held():
    p = Pool(Store(get=[S.MC_TRANSFER_FAIL]))
    try:
        p.fetch(1)
        p.tier.close()
        assert p.tier.pool is None and p.takeable() == SLOTS - 1  # still this process's reservation
        p.tier.close = lambda: None
    finally:
        p.close()


@check("restart: a tier that starts serving holds nothing, whatever the tier before it held")
def restart_held_zero():
    p = Pool(Store(get=[S.MC_TRANSFER_FAIL]))
    try:
        p.fetch(1)
        assert p.stat("held") == 1
        p.tier.close()  # its slot stays reserved by this process, as until a real tier's exit
        a = S.build_parser().parse_args([p.name, "--writeback", "off", "--records", "4", "--keys-per-record", "16"])
        t2 = S.Tier(a, S.Log(None, False))  # adopts the table (same geometry), counters and all
        try:
            assert p.stat("held") == 0, p.stat("held")
        finally:
            t2.close()
        p.tier.close = lambda: None
    finally:
        p.close()


@check("--status: a tier that is not running holds no slots, and says none")
def status_gone_tier_holds_none():
    p = Pool(Store(get=[S.MC_TRANSFER_FAIL]))
    try:
        p.fetch(1)
        a = S.build_parser().parse_args([p.name, "--status"])
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            S.status(a)
        assert "held:" in out.getvalue(), out.getvalue()  # while it serves
        p.tier.close()
        p.tier.close = lambda: None
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            S.status(a)
        assert "not running" in out.getvalue() and "held:" not in out.getvalue(), out.getvalue()
    finally:
        p.close()


def hold_and_exit(name: str) -> None:
    """The tier process of status_json_exited_tier: serves pool name, holds one
    slot (a get answered TRANSFER_FAIL) and exits without a word, as a killed
    or crashed tier does."""
    p = Pool(Store(get=[S.MC_TRANSFER_FAIL]), name=name)
    p.fetch(1)
    print(p.stat("held"), flush=True)
    os._exit(0)


@check("--status --json: a tier process that exited reads as not running and holding no slots")
def status_json_exited_tier():
    # before: its last 'held' count stayed in the table and read as slots held now
    name = create_pool()
    try:
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--hold-and-exit", name],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0 and r.stdout.strip() == "1", (r.returncode, r.stdout, r.stderr)
        r = subprocess.run([TOOL, "tier", name, "--status", "--json"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr
        ti = json.loads(r.stdout)["tier"]
        assert not ti["alive"] and ti["state"] == "stopped", ti
        assert ti["stats"]["held"] == 0, ti["stats"]
        r = subprocess.run([TOOL, "tier", name, "--status"], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0 and "not running" in r.stdout and "held:" not in r.stdout, (r.stdout, r.stderr)
    finally:
        subprocess.run([TOOL, "pool", "destroy", name, "--force"], capture_output=True, timeout=60)


if sys.argv[1:2] == ["--hold-and-exit"]:
    hold_and_exit(sys.argv[2])
rc = taplib.run(checks)
sys.exit(rc)
