# SPDX-License-Identifier: Apache-2.0
"""The pool as a host tier over Mooncake Store: bindings, store keys, client.

``umbp tier POOL`` (``python -m umbp.tier POOL``) runs one tier per host: it
writes blocks published in the host's pool to a Mooncake Store shared by
several hosts, and brings blocks other hosts wrote into the pool when a
scheduler's probe misses them (docs/cluster.md). This module holds what the
tier and its clients share, and imports nothing beyond ctypes:

- ctypes declarations of the published-key feed (include/umbp/feed.h) and the
  tier's request table (include/umbp/tier.h), checked against the library's
  struct sizes like umbp._lib's;
- :func:`store_key`, the store's name of a pool key: host-independent, since
  it names the namespace by its name (model, revision, layout, ranks), not by
  the pool's id for it;
- :class:`TierClient`, what a scheduler uses to ask for a missing prefix
  (``umbp.vllm`` does, with ``"tier": true`` in kv_connector_extra_config).

The tier process itself is :mod:`umbp.tier_server` (it imports Mooncake).
"""
from __future__ import annotations

import ctypes as C
import errno
import struct
import sys
import time

from . import _lib as L

FEED_NAME_MAX = 31
FEED_MAX_CONSUMERS = 16
EV_STORED, EV_REMOVED = 1, 2
FEED_RESUME, FEED_FROM_NOW, FEED_FROM_OLDEST = 0, 1, 2
STOPPED, CONNECTING, CONNECTED, DISCONNECTED = 0, 1, 2, 3
STATE_NAMES = {STOPPED: "stopped", CONNECTING: "connecting", CONNECTED: "connected",
               DISCONNECTED: "disconnected"}
# enum umbp_tier_stat, in order
STATS = ("requests", "blocks_fetched", "keys_fetched", "bytes_fetched", "remote_misses", "fetch_errors",
         "expired", "wb_queued", "wb_written", "wb_bytes", "wb_skipped", "wb_dropped", "wb_errors",
         "reconnects", "wb_refused", "held")
ST = {name: i for i, name in enumerate(STATS)}
STAT_COUNT = 16


class FeedOpts(C.Structure):
    _fields_ = [("capacity", C.c_uint32), ("start", C.c_int)]


class FeedEntry(C.Structure):
    _fields_ = [("pos", C.c_uint64), ("type", C.c_int), ("owner", C.c_uint16), ("key", L.Key)]


class FeedConsumerInfo(C.Structure):
    _fields_ = [("name", C.c_char * (FEED_NAME_MAX + 1)), ("pid", C.c_int), ("alive", C.c_bool),
                ("committed", C.c_uint64), ("read", C.c_uint64), ("lost", C.c_uint64),
                ("delivered", C.c_uint64), ("active_ns", C.c_uint64)]


class FeedInfo(C.Structure):
    _fields_ = [("capacity", C.c_uint32), ("generation", C.c_uint32), ("head", C.c_uint64),
                ("overtaken", C.c_uint64), ("n_consumers", C.c_uint),
                ("consumers", FeedConsumerInfo * FEED_MAX_CONSUMERS)]


class TierParams(C.Structure):
    _fields_ = [("records", C.c_uint32), ("keys_per_record", C.c_uint32), ("default_timeout_ms", C.c_uint32)]


class TierJob(C.Structure):
    _fields_ = [("ticket", C.c_uint64), ("n_blocks", C.c_uint), ("n_ranks", C.c_uint), ("client", C.c_uint16),
                ("deadline_ns", C.c_uint64), ("age_ns", C.c_uint64)]


class TierInfo(C.Structure):
    _fields_ = [("alive", C.c_bool), ("pid", C.c_int), ("state", C.c_int), ("message", C.c_char * 200),
                ("state_age_ns", C.c_uint64), ("heartbeat_age_ns", C.c_uint64), ("records", C.c_uint32),
                ("keys_per_record", C.c_uint32), ("default_timeout_ms", C.c_uint32), ("free_", C.c_uint32),
                ("ready", C.c_uint32), ("working", C.c_uint32), ("done", C.c_uint32),
                ("stats", C.c_uint64 * STAT_COUNT)]


# Sizes of the two files in /dev/shm beside a pool, as the library makes them
# (src/tier/tierq.c tq_bytes, src/index/events.c feed_bytes), so that `umbp
# tier` can refuse a geometry that does not fit before it loads the library or
# creates anything. lib() checks them against umbp_tier_table_bytes() and
# umbp_feed_file_bytes().
TABLE_HDR_BYTES, RECORD_CTRL_BYTES, TABLE_MAX = 4096, 64, 65535
FEED_HDR_BYTES, FEED_CELL_BYTES, FEED_MIN_CAPACITY, FEED_MAX_CAPACITY = 4096, 64, 64, 1 << 24


def table_bytes(records: int, keys_per_record: int) -> int:
    """Bytes of a request table of this geometry (1 to 65535 each)."""
    record = (RECORD_CTRL_BYTES + keys_per_record * C.sizeof(L.Key) + 63) & ~63
    return TABLE_HDR_BYTES + records * record


def feed_bytes(capacity: int) -> int:
    """Bytes of a feed created for this capacity (1 to 2^24; rounded up to a
    power of two, at least 64 entries)."""
    cap = FEED_MIN_CAPACITY
    while cap < capacity:
        cap <<= 1
    return FEED_HDR_BYTES + cap * FEED_CELL_BYTES


# umbp_pool_info: one ctypes class for the whole package (umbp._lib, size-checked
# at load), since argtypes are set on the one shared library handle.
PartitionInfo = L.PartitionInfo
PoolInfo = L.PoolInfo


_P, _I, _U = C.c_void_p, C.c_int, C.c_uint
_SIGS = {
    "umbp_feed_opts_init": (None, [C.POINTER(FeedOpts)]),
    "umbp_feed_open": (_I, [_P, C.c_char_p, C.POINTER(FeedOpts), C.POINTER(_P)]),
    "umbp_feed_read": (_I, [_P, C.POINTER(FeedEntry), _U, C.POINTER(C.c_uint64)]),
    "umbp_feed_commit": (_I, [_P, C.c_uint64]),
    "umbp_feed_position": (_I, [_P, C.POINTER(C.c_uint64), C.POINTER(C.c_uint64), C.POINTER(C.c_uint64)]),
    "umbp_feed_close": (None, [_P]),
    "umbp_feed_info_get": (_I, [_P, C.POINTER(FeedInfo)]),
    "umbp_tier_attach": (_I, [_P, C.POINTER(_P)]),
    "umbp_tier_request": (_I, [_P, C.POINTER(L.Key), _U, _U, C.c_uint32, C.POINTER(C.c_uint64),
                               C.POINTER(_U)]),
    "umbp_tier_poll": (_I, [_P, C.c_uint64, C.POINTER(_U)]),
    "umbp_tier_cancel": (None, [_P, C.c_uint64]),
    "umbp_tier_max_blocks": (_U, [_P, _U]),
    "umbp_tier_close": (None, [_P]),
    "umbp_tier_params_init": (None, [C.POINTER(TierParams)]),
    "umbp_tier_table_bytes": (C.c_uint64, [C.POINTER(TierParams)]),
    "umbp_feed_file_bytes": (C.c_uint64, [C.c_uint32]),
    "umbp_tier_serve": (_I, [_P, C.POINTER(TierParams), C.POINTER(_P)]),
    "umbp_tier_take": (_I, [_P, C.POINTER(TierJob), C.POINTER(L.Key), _U]),
    "umbp_tier_complete": (_I, [_P, C.c_uint64, _I, C.c_char_p]),
    "umbp_tier_wait": (_I, [_P, C.c_uint32]),
    "umbp_tier_set_state": (_I, [_P, _I, C.c_char_p]),
    "umbp_tier_stat_add": (None, [_P, _U, C.c_uint64]),
    "umbp_tier_info_get": (_I, [_P, C.POINTER(TierInfo)]),
    "umbp_tier_state_name": (C.c_char_p, [_I]),
    "umbp_pool_get_info": (_I, [_P, C.POINTER(PoolInfo)]),
    "umbp_pool_proc_slot": (_I, [_P]),
    "umbp_pool_heartbeat": (None, [_P]),
    "umbp_pool_reap": (_I, [_P]),
    "umbp_ns_name": (_I, [_P, C.c_uint32, C.c_char_p, C.c_size_t]),
    "umbp_ns_lookup": (_I, [_P, C.c_char_p, C.POINTER(C.c_uint32)]),
    "umbp_slot_ptr": (_P, [_P, C.c_uint32]),
    "umbp_publish_bulk": (_I, [_P, _U, C.POINTER(C.c_uint32), C.POINTER(L.Key), C.POINTER(_I)]),
    "umbp_prefix_probe": (_I, [_P, _U, C.POINTER(L.Key)]),
    "umbp_reclaim": (_I, [_P]),
}
_C_NAMES = {FeedOpts: "umbp_feed_opts", FeedEntry: "umbp_feed_entry", FeedInfo: "umbp_feed_info",
            TierParams: "umbp_tier_params", TierJob: "umbp_tier_job", TierInfo: "umbp_tier_info",
            PoolInfo: "umbp_pool_info"}
_ready = False


def lib():
    """umbp._lib's library with this module's prototypes declared as well
    (struct sizes checked against the library's, as umbp._lib does)."""
    global _ready
    h = L.lib()
    if not _ready:
        size = h.umbp_abi_struct_size
        for cls, name in _C_NAMES.items():
            if size(name.encode()) != C.sizeof(cls):
                raise ImportError(f"struct {name} is {size(name.encode())} bytes in {h._name} but "
                                  f"{C.sizeof(cls)} in {__file__}: the library and the Python package are of "
                                  "different versions; rebuild or reinstall both from one version")
        L.declare(h, _SIGS)
        for r, k in ((1, 1), (64, 1024), (TABLE_MAX, TABLE_MAX), (3, 1000)):
            c = h.umbp_tier_table_bytes(C.byref(TierParams(r, k, 0)))
            if c != table_bytes(r, k):
                raise ImportError(f"a request table of {r} x {k} keys is {c} bytes in {h._name} but "
                                  f"{table_bytes(r, k)} in {__file__}: rebuild or reinstall both from one version")
        for cap in (1, 64, 65, 65536, FEED_MAX_CAPACITY):
            if h.umbp_feed_file_bytes(cap) != feed_bytes(cap):
                raise ImportError(f"a feed of {cap} entries is {h.umbp_feed_file_bytes(cap)} bytes in {h._name} "
                                  f"but {feed_bytes(cap)} in {__file__}: rebuild or reinstall both from one version")
        _ready = True
    return h


def last_error() -> str:
    return L.lib().umbp_last_error().decode(errors="replace")


# ---- store keys ----------------------------------------------------------------

_SAFE = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:")


def _quote(s: bytes) -> str:
    return "".join(chr(c) if c in _SAFE else f"%{c:02x}" for c in s)


def store_key(prefix: str, ns_name: bytes | str, key: L.Key) -> str:
    """The store's name of a pool key: PREFIX/NAMESPACE/GROUP/TP.PCP.DCP.PP/HASH,
    the namespace by its (percent-escaped) name and the hash in hex, so that
    every host names a block alike whatever ids its own pool gave the
    namespace."""
    ns = ns_name.encode() if isinstance(ns_name, str) else ns_name
    h = bytes(key.hash[: key.hash_len]).hex()
    return (f"{prefix}/{_quote(ns)}/{key.group}/{key.tp_rank}.{key.pcp_rank}.{key.dcp_rank}."
            f"{key.pp_rank}/{h}")


class KeyNamer:
    """store_key() for many keys of a ctypes Key array at once: the part
    before the hash is cached per (namespace, ranks, group), the hash read
    with one string_at (store_key builds each name from scratch: 4x slower,
    which showed at 32 keys of 64 KiB a request)."""

    _HEAD = struct.Struct("<IHHHHHB")  # ns, tp, pcp, dcp, pp, group, hash_len: umbp_key's first 15 bytes

    def __init__(self, prefix: str, ns_names: "NsNames"):
        self.prefix, self.ns_names = prefix, ns_names
        self.heads: dict[bytes, str | None] = {}

    def __call__(self, keys, indices) -> list[str | None]:
        base, size, off = C.addressof(keys), C.sizeof(L.Key), L.Key.hash.offset
        out: list[str | None] = []
        for i in indices:
            a = base + i * size
            raw = C.string_at(a, off)
            head = self.heads.get(raw[:-1], False)
            if head is False:
                ns, tp, pcp, dcp, pp, group, _ = self._HEAD.unpack(raw)
                name = self.ns_names(ns)
                head = (None if name is None else
                        f"{self.prefix}/{_quote(name)}/{group}/{tp}.{pcp}.{dcp}.{pp}/")
                self.heads[raw[:-1]] = head
            out.append(None if head is None else head + C.string_at(a + off, min(raw[-1], 32)).hex())
        return out


class NsNames:
    """Pool namespace id -> name, cached (ids are never reused in a pool)."""

    def __init__(self, pool_h):
        self.h = pool_h
        self.names: dict[int, bytes] = {}

    def __call__(self, ns: int) -> bytes | None:
        n = self.names.get(ns)
        if n is None:
            buf = C.create_string_buffer(136)
            if lib().umbp_ns_name(self.h, ns, buf, len(buf)) != 0:
                return None
            n = self.names[ns] = buf.value
        return n


# ---- the client ------------------------------------------------------------------

class TierClient:
    """A scheduler's side of the request table: ask for a prefix, poll for it.

    Never raises on the request path: a missing or stopped tier, a full table
    or a deadline all come back as "no blocks" (with the reason in .last).
    The table is opened lazily and re-opened when the tier restarts."""

    def __init__(self, pool_h, timeout_ms: int = 0):
        self.pool = pool_h
        self.timeout_ms = timeout_ms
        self.h = None
        self.last = ""
        self._retry_at = 0.0

    def _open(self) -> bool:
        if self.h is not None:
            return True
        now = time.monotonic()
        if now < self._retry_at:
            return False
        h = C.c_void_p()
        rc = lib().umbp_tier_attach(self.pool, C.byref(h))
        if rc:
            self.last = last_error()
            self._retry_at = now + 1.0  # no tier yet: look again in a second, not on every probe
            return False
        self.h = h
        return True

    def max_blocks(self, n_ranks: int) -> int:
        return int(lib().umbp_tier_max_blocks(self.h, n_ranks)) if self._open() else 0

    def request(self, keys, n_blocks: int, n_ranks: int) -> tuple[int, int] | None:
        """Ask for blocks [0, n_blocks) of keys (block-major, n_ranks shards a
        block): (ticket, blocks asked) or None (the reason in .last)."""
        if not self._open():
            return None
        t, nb = C.c_uint64(), C.c_uint()
        rc = lib().umbp_tier_request(self.h, keys, n_blocks, n_ranks, self.timeout_ms, C.byref(t), C.byref(nb))
        if rc == -errno.ENOTCONN:
            self.last = last_error()
            # the tier may have been restarted with a new table: re-open soon
            self.close()
            self._retry_at = time.monotonic() + 0.5
            return None
        if rc:
            self.last = last_error()
            return None
        return t.value, nb.value

    def poll(self, ticket: int) -> int | None:
        """Blocks now in the pool (>= 0), None while in progress, or -errno
        (the request ended without blocks: timeout, no tier, tier error)."""
        if self.h is None:
            return -errno.ENOTCONN
        n = C.c_uint()
        rc = lib().umbp_tier_poll(self.h, ticket, C.byref(n))
        if rc == -errno.EINPROGRESS:
            return None
        if rc:
            self.last = last_error()
            return rc
        return n.value

    def cancel(self, ticket: int) -> None:
        if self.h is not None:
            lib().umbp_tier_cancel(self.h, ticket)

    def close(self) -> None:
        if self.h is not None:
            lib().umbp_tier_close(self.h)
            self.h = None


class ReadThrough:
    """A scheduler's read-through for vLLM's asynchronous lookup
    (get_num_new_matched_tokens may answer "not yet": None).

    For each vLLM request whose probe missed part of its prompt, one request
    to the tier for the missing blocks (every rank's and group's shard of
    each); while it is pending the lookup answers "not yet" and vLLM asks
    again on a later step; once answered (or refused, timed out, failed) the
    request is probed again and never asked for again. The first answer is
    waited for up to wait_ms in the same call, so that a prefix that exists
    nowhere (one existence check at the tier) costs no extra step."""

    WAIT, DONE, FETCHED = 0, 1, 2

    def __init__(self, pool_h, timeout_ms: int, wait_ms: float):
        self.client = TierClient(pool_h, timeout_ms)
        self.wait_s = max(0.0, wait_ms) / 1000.0
        self.pending: dict[str, int] = {}   # vLLM request id -> ticket
        self.done: set[str] = set()
        self.stats = {"asked": 0, "fetched_blocks": 0, "unavailable": 0}

    def lookup(self, req_id: str, make_keys, in_pool: int, n_blocks: int, n_shards: int) -> int:
        """WAIT (answer vLLM "not yet"), DONE (nothing new: use the probe
        as it is) or FETCHED (blocks arrived: probe again). make_keys(first,
        count) builds the keys of blocks [first, first + count), block-major."""
        if req_id in self.done:
            return self.DONE
        t = self.pending.get(req_id)
        if t is None:
            if in_pool >= n_blocks:
                return self.DONE
            cap = self.client.max_blocks(n_shards)
            if cap <= 0:  # no tier, or a block has more shards than a record holds
                self.done.add(req_id)
                self.stats["unavailable"] += 1
                return self.DONE
            count = min(n_blocks - in_pool, cap)
            r = self.client.request(make_keys(in_pool, count), count, n_shards)
            if r is None:
                self.done.add(req_id)
                self.stats["unavailable"] += 1
                return self.DONE
            t = self.pending[req_id] = r[0]
            self.stats["asked"] += 1
            end = time.monotonic() + self.wait_s
            while True:
                v = self.client.poll(t)
                if v is not None or time.monotonic() >= end:
                    break
                time.sleep(0.0001)
        else:
            v = self.client.poll(t)
        if v is None:
            return self.WAIT
        del self.pending[req_id]
        self.done.add(req_id)
        if v > 0:
            self.stats["fetched_blocks"] += v
            return self.FETCHED
        return self.DONE

    def forget(self, req_id: str) -> None:
        t = self.pending.pop(req_id, None)
        if t is not None:
            self.client.cancel(t)
        self.done.discard(req_id)

    def close(self) -> None:
        for t in self.pending.values():
            self.client.cancel(t)
        self.pending.clear()
        self.client.close()


def proc_stopped(pid: int) -> bool:
    """Whether process PID is stopped (SIGSTOP, a debugger): state T or t in
    /proc/PID/stat, as umbp inspect reads it (this PID namespace's pids only;
    False when it cannot tell). A stopped tier keeps its lock on the table,
    so it reads as alive, while every request to it ends at its deadline."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def tier_info(pool_h) -> dict | None:
    """The tier table's state and counters (None: no tier ever served, or a
    table a starting tier is still making). Raises OSError (errno, the
    library's message) when the table exists but cannot be read (another
    user's, mode 0600; not a regular file): that is no answer to whether a
    tier serves, and was shown as 'no tier has served it'."""
    i = TierInfo()
    rc = lib().umbp_tier_info_get(pool_h, C.byref(i))
    if rc in (-errno.EACCES, -errno.EPERM, -errno.ENODEV):
        raise OSError(-rc, last_error())
    if rc:
        return None
    return {"alive": i.alive, "stopped": bool(i.alive) and proc_stopped(i.pid), "pid": i.pid,
            "state": STATE_NAMES.get(i.state, "unknown"),
            "message": i.message.decode(errors="replace"), "state_age_s": i.state_age_ns / 1e9,
            "heartbeat_age_s": i.heartbeat_age_ns / 1e9, "records": i.records,
            "keys_per_record": i.keys_per_record, "default_timeout_ms": i.default_timeout_ms,
            "requests_in_table": {"free": i.free_, "ready": i.ready, "working": i.working, "done": i.done},
            "stats": {name: int(i.stats[k]) for k, name in enumerate(STATS)}}


def feed_info(pool_h) -> dict | None:
    """The published-key feed's head and consumers (None: no feed, the pool
    destroyed, or a feed being made). Raises OSError, as tier_info, when the
    feed exists but this user may not read it."""
    i = FeedInfo()
    rc = lib().umbp_feed_info_get(pool_h, C.byref(i))
    if rc in (-errno.EACCES, -errno.EPERM):
        raise OSError(-rc, last_error())
    if rc:
        return None
    return {"capacity": i.capacity, "generation": i.generation, "head": i.head, "overtaken": i.overtaken,
            "consumers": [{"name": c.name.decode(), "pid": c.pid, "alive": c.alive,
                           "stopped": bool(c.alive) and proc_stopped(c.pid), "committed": c.committed,
                           "read": c.read, "behind": max(0, i.head - c.read), "lost": c.lost,
                           "delivered": c.delivered}
                          for c in i.consumers[: i.n_consumers]]}


def main(argv: list[str] | None = None) -> int:
    from .tier_server import main as server_main
    return server_main(argv)


if __name__ == "__main__":
    sys.exit(main())
