# SPDX-License-Identifier: Apache-2.0
"""A worker or scheduler of one "host" in the cluster tests, exec'd as its own
process (so that it maps the pool at its own address, as a real engine's
worker does).

  worker.py store POOL NS RANK FIRST COUNT    publish blocks FIRST.. of rank RANK
  worker.py load  POOL NS RANK FIRST COUNT    load and verify them; exit 3 on a mismatch,
                                              4 on a miss
  worker.py probe POOL NS RANKS FIRST COUNT   print how many leading blocks every rank has

A block's bytes are a function of (namespace, rank, block id), so a load on
another host can check every byte it got.
"""
import ctypes as C
import hashlib
import sys

from umbp import _lib as L
from umbp import tier as T


def block_bytes(ns: str, rank: int, bid: int, size: int) -> bytes:
    seed = hashlib.sha256(f"{ns}/{rank}/{bid}".encode()).digest()
    return (seed * (size // len(seed) + 1))[:size]


def key(ns_id: int, rank: int, bid: int) -> L.Key:
    k = L.Key()
    k.ns = ns_id
    k.tp_rank = rank
    h = hashlib.sha256(f"block-{bid}".encode()).digest()  # the same on every rank, as vLLM's
    k.hash_len = 32
    for i in range(32):
        k.hash[i] = h[i]
    return k


def attach(pool: str, role: int, rank: int):
    lib = T.lib()
    o = L.AttachOpts()
    lib.umbp_attach_opts_init(C.byref(o))
    o.role, o.rank = role, rank
    h = C.c_void_p()
    L.check(lib.umbp_pool_attach(pool.encode(), C.byref(o), C.byref(h)), "attach")
    _handles.append((lib, h))
    return lib, h


_handles = []


def main() -> int:
    try:
        return run()
    finally:
        for lib, h in _handles:
            lib.umbp_pool_detach(h)


def run() -> int:
    op, pool, ns = sys.argv[1], sys.argv[2], sys.argv[3]
    first, count = int(sys.argv[5]), int(sys.argv[6])
    if op == "probe":
        ranks = int(sys.argv[4])
        lib, h = attach(pool, 1, -1)
        nsid = C.c_uint32()
        if lib.umbp_ns_lookup(h, ns.encode(), C.byref(nsid)):
            print(0)
            return 0
        ks = (L.Key * (count * ranks))(*[key(nsid.value, r, first + b) for b in range(count) for r in range(ranks)])
        present = (C.c_uint8 * len(ks))()
        lib.umbp_contains_bulk(h, len(ks), ks, present)
        n = 0
        while n < count and all(present[n * ranks + r] for r in range(ranks)):
            n += 1
        print(n)
        return 0
    rank = int(sys.argv[4])
    lib, h = attach(pool, 2, rank)
    nsid = C.c_uint32()
    L.check(lib.umbp_ns_register(h, ns.encode(), C.byref(nsid)), "namespace")
    size = int(lib.umbp_slot_size(h))
    if op == "store":
        for b in range(count):
            s = C.c_uint32()
            L.check(lib.umbp_reserve_bulk(h, -1, nsid.value, 1, C.byref(s)), "reserve")
            C.memmove(lib.umbp_slot_ptr(h, s.value), block_bytes(ns, rank, first + b, size), size)
            k = key(nsid.value, rank, first + b)
            rc = C.c_int()
            lib.umbp_publish_bulk(h, 1, C.byref(s), C.byref(k), C.byref(rc))
            if rc.value not in (0, -17):
                print(f"publish: {rc.value}", file=sys.stderr)
                return 1
        print("stored", count)
        return 0
    if op == "load":
        ks = (L.Key * count)(*[key(nsid.value, rank, first + b) for b in range(count)])
        slots = (C.c_uint32 * count)()
        hits = lib.umbp_lookup_pin_bulk(h, count, ks, slots)
        try:
            for b in range(count):
                if slots[b] == L.UMBP_NO_SLOT:
                    print(f"miss: rank {rank} block {first + b} ({hits} of {count} hit)", file=sys.stderr)
                    return 4
                got = C.string_at(lib.umbp_slot_ptr(h, slots[b]), size)
                if got != block_bytes(ns, rank, first + b, size):
                    print(f"mismatch: rank {rank} block {first + b}", file=sys.stderr)
                    return 3
        finally:
            lib.umbp_unpin_bulk(h, count, slots)
        print("loaded", count)
        return 0
    print(f"unknown op {op}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
