# SPDX-License-Identifier: Apache-2.0
"""ctypes declarations of libumbp's public API (include/umbp/*.h).

Every struct mirrors its C definition field by field; ctypes applies the
same alignment rules as the C compiler on this ABI.

Which libumbp is loaded (the first that exists wins; lib_path() tells which):

1. ``UMBP_LIB``: an explicit path, an override for tests and debugging (an
   error if it names no file, or a sanitizer build whose runtime this
   process has not preloaded; nothing else is tried then).
2. ``libumbp.so`` next to this module: the copy a wheel bundles
   (``pip install .`` from the repository root builds it with meson-python).
3. ``libumbp.so.0`` through the dynamic loader (``LD_LIBRARY_PATH``,
   ld.so.cache): a system install by ``meson install``.
4. ``build*/libumbp.so`` of the source tree this module sits in, the newest
   first: development with ``PYTHONPATH=python`` after ``ninja -C build``.
"""
from __future__ import annotations

import ctypes as C
import glob
import os
from pathlib import Path

UMBP_KEY_HASH_MAX = 32
UMBP_SIZE_MAX = (1 << 64) - 1
# The C CLI's size units (tools/cli_util.c cli_parse_size), matched without
# regard to case: K, KB and KiB are all 1024.
_SIZE_UNITS = {"": 1, "b": 1, **{u + tail: 1 << 10 * i for i, u in enumerate("kmgtp", 1) for tail in ("", "b", "ib")}}
SIZE_HINT = "use bytes, or a number with B, KiB, MiB, GiB, TiB (K/KB, M/MB... are binary too), e.g. 1GiB"


def parse_size(s) -> int:
    """Bytes from '1GiB', '512M', '1.5KiB', '4096' by the C CLI's rule
    (cli_parse_size): an unsigned decimal number and a binary unit, a whole
    number of bytes below 2^64. Raises ValueError naming the value and the
    fix (never OverflowError: 'infG' and '1e400G' are not sizes)."""
    import re
    from fractions import Fraction
    m = re.fullmatch(r"(\d+\.?\d*|\.\d+) *([A-Za-z]*)", str(s), re.ASCII)
    unit = _SIZE_UNITS.get(m.group(2).lower()) if m else None
    if unit is None:
        why = "a size cannot be negative" if str(s).strip().startswith("-") else "not a size"
        raise ValueError(f"'{s}': {why}: {SIZE_HINT}")
    v = Fraction(m.group(1)) * unit  # exact: no float rounding, no inf
    if v.denominator != 1:
        raise ValueError(f"'{s}' is {float(v):g} bytes, not a whole number: {SIZE_HINT}")
    if v > UMBP_SIZE_MAX:
        raise ValueError(f"'{s}' is too large: sizes are below 2^64 bytes (16EiB)")
    return int(v)


UMBP_MAX_PARTITIONS = 16
UMBP_NAME_MAX = 64           # pool names: [A-Za-z0-9._-]{1,64}
UMBP_MAX_PROCS = 64          # registry slots
UMBP_NO_SLOT = 0xFFFFFFFF
UMBP_DP_STORE_DEFER_PUBLISH = 1 << 1  # enum umbp_dp_store_flags


class UMBPError(RuntimeError):
    """A libumbp call failed; .code is the negative errno."""

    def __init__(self, code: int, what: str, detail: str):
        self.code, self.what, self.detail = code, what, detail
        super().__init__(f"{what}: {detail or os.strerror(-code)} ({os.strerror(-code)})")

    def __reduce__(self):
        # Exceptions are pickled as (class, self.args), and args holds only the
        # message: unpickling (an executor that returns a worker's exception
        # to the engine, the tests' worker processes) called __init__ with one
        # argument and raised TypeError instead of the error.
        return type(self), (self.code, self.what, self.detail)


def _sanitized(path: str) -> bool:
    """A build linked against ASan or TSan, or instrumented for them: loading
    it needs the sanitizer's runtime preloaded, so it is never picked by
    default. clang's shared libraries name no runtime (the executable brings
    it), only the instrumentation's __tsan_/__asan_ symbols."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return True
    return any(m in data for m in (b"libasan.so", b"libtsan.so", b"__tsan_", b"__asan_"))


def _runtime_missing(path: str) -> str | None:
    """The sanitizer runtime (libasan.so, libtsan.so) that `path` is linked
    against and that this process has not loaded, or None. Loading such a
    library does not fail with an error: the runtime ends the process.
    Reads the first MiB of a regular file only (the dynamic section's names
    sit near the start; /dev/zero or a FIFO must not be read to the end)."""
    if not os.path.isfile(path):
        return None
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
        with open("/proc/self/maps") as f:
            maps = f.read()
    except OSError:
        return None
    for rt in ("libasan.so", "libtsan.so"):
        if rt.encode() in data and "/" + rt not in maps:
            return rt
    return None


SYSTEM_SONAME = "libumbp.so.0"


def _find_library() -> str:
    """What to load, in the module docstring's order: a path, or SYSTEM_SONAME
    for the dynamic loader's copy. Raises OSError naming every place tried."""
    env = os.environ.get("UMBP_LIB")
    if env:
        if not os.path.exists(env):
            raise OSError(f"UMBP_LIB={env} does not exist; point it at libumbp.so")
        if os.path.isdir(env):
            raise OSError(f"UMBP_LIB={env} is a directory; point it at the library in it, e.g. "
                          f"UMBP_LIB={os.path.join(env, 'libumbp.so')}")
        rt = _runtime_missing(env)
        if rt:
            raise OSError(f"UMBP_LIB={env} is a sanitizer build (linked against {rt}): loaded into this "
                          f"Python it would end the process; preload the runtime (LD_PRELOAD=$(gcc "
                          f"-print-file-name={rt})) or point UMBP_LIB at a build without sanitizers")
        # the file checked above, not a name: dlopen() searches the loader's
        # path for a name without '/' (UMBP_LIB=libumbp.so in build/ would
        # load another libumbp, or none), so pass it a path
        return os.path.abspath(env)
    here = Path(__file__).resolve().parent
    bundled = here / "libumbp.so"
    if bundled.exists():
        return str(bundled)
    try:
        C.CDLL(SYSTEM_SONAME)
        return SYSTEM_SONAME
    except OSError:
        pass
    root = here.parent.parent  # python/umbp -> repo root
    built = [p for p in glob.glob(str(root / "build*" / "libumbp.so")) if os.path.exists(p)]
    built = [p for p in built if not _sanitized(p)]  # needs a preloaded runtime
    built.sort(key=lambda p: -os.path.getmtime(p))
    if built:
        return built[0]
    raise OSError(f"libumbp not found: not in UMBP_LIB, not at {bundled} (a wheel bundles it there: "
                  f"'pip install .' from the umbp repository), not {SYSTEM_SONAME} through the "
                  f"dynamic loader ('meson install'), not in {root}/build*/ "
                  f"('meson setup build && ninja -C build')")


class _DlInfo(C.Structure):
    _fields_ = [("dli_fname", C.c_char_p), ("dli_fbase", C.c_void_p),
                ("dli_sname", C.c_char_p), ("dli_saddr", C.c_void_p)]


def lib_path() -> str:
    """The file the loaded libumbp came from (loads it if needed): the dynamic
    loader's answer for one of its symbols, so a SYSTEM_SONAME load shows its
    real path; the name passed to dlopen where glibc's dladdr is missing."""
    handle = lib()
    try:
        dladdr = C.CDLL(None).dladdr
        dladdr.argtypes = [C.c_void_p, C.POINTER(_DlInfo)]
        info = _DlInfo()
        if dladdr(C.cast(handle.umbp_strerror, C.c_void_p), C.byref(info)) and info.dli_fname:
            return os.path.realpath(info.dli_fname.decode())
    except (AttributeError, OSError):
        pass
    return handle._name


class Key(C.Structure):
    _fields_ = [("ns", C.c_uint32), ("tp_rank", C.c_uint16), ("pcp_rank", C.c_uint16),
                ("dcp_rank", C.c_uint16), ("pp_rank", C.c_uint16), ("group", C.c_uint16),
                ("hash_len", C.c_uint8), ("hash", C.c_uint8 * UMBP_KEY_HASH_MAX)]


PROGRESS_FN = C.CFUNCTYPE(None, C.c_void_p, C.c_char_p, C.c_uint64, C.c_uint64)


class PoolParams(C.Structure):
    _fields_ = [("capacity", C.c_uint64), ("slot_size", C.c_uint64),
                ("numa_nodes", C.c_int * UMBP_MAX_PARTITIONS), ("n_numa_nodes", C.c_uint),
                ("mempolicy", C.c_int), ("group_access", C.c_bool), ("group", C.c_uint32),
                ("hugepages", C.c_bool), ("hugetlbfs_dir", C.c_char_p),
                ("prefault_threads", C.c_uint), ("no_prefault", C.c_bool),
                ("event_capacity", C.c_uint32), ("progress", PROGRESS_FN),
                ("progress_arg", C.c_void_p), ("index_pages", C.c_int), ("no_reserve", C.c_bool)]


class AttachOpts(C.Structure):
    _fields_ = [("read_only", C.c_bool), ("role", C.c_int), ("rank", C.c_int),
                ("timeout_ms", C.c_uint)]


class PartitionInfo(C.Structure):
    _fields_ = [("numa_node", C.c_int), ("mempolicy", C.c_int), ("first_slot", C.c_uint32),
                ("slot_count", C.c_uint32), ("bytes", C.c_uint64), ("free_slots", C.c_uint64)]


class PoolInfo(C.Structure):
    _fields_ = [("name", C.c_char * (UMBP_NAME_MAX + 1)), ("path", C.c_char * 256),
                ("layout_major", C.c_uint16), ("layout_minor", C.c_uint16),
                ("compat_features", C.c_uint64), ("incompat_features", C.c_uint64),
                ("abi_fingerprint", C.c_uint64), ("total_size", C.c_uint64), ("slot_size", C.c_uint64),
                ("slot_count", C.c_uint32), ("n_partitions", C.c_uint32),
                ("partitions", PartitionInfo * UMBP_MAX_PARTITIONS), ("uuid", C.c_uint8 * 16),
                ("run_generation", C.c_uint64), ("created_ns", C.c_uint64), ("creator_pid", C.c_int),
                ("creator_uid", C.c_uint32), ("hugepages", C.c_bool), ("index_hugepages", C.c_bool),
                ("index_huge_bytes", C.c_uint64), ("max_procs", C.c_uint32), ("procs_live", C.c_uint32),
                ("procs_dead", C.c_uint32)]


class ProcInfo(C.Structure):
    _fields_ = [("slot", C.c_uint), ("pid", C.c_int), ("start_time", C.c_uint64), ("role", C.c_int),
                ("rank", C.c_int), ("attach_ns", C.c_uint64), ("heartbeat_ns", C.c_uint64),
                ("incarnation", C.c_uint64), ("alive", C.c_bool), ("self", C.c_bool),
                ("comm", C.c_char * 16)]


# enum umbp_role
ROLE_OTHER, ROLE_SCHEDULER, ROLE_WORKER, ROLE_DAEMON, ROLE_TOOL = 0, 1, 2, 3, 4


class KVRegion(C.Structure):
    _fields_ = [("base", C.c_void_p), ("block_bytes", C.c_uint64), ("stride", C.c_uint64),
                ("block_count", C.c_uint32), ("device", C.c_int), ("device_id", C.c_int),
                ("group", C.c_uint16), ("layer", C.c_uint32), ("kind", C.c_int)]


class DPOpts(C.Structure):
    _fields_ = [("threads", C.c_uint), ("cpus", C.POINTER(C.c_uint)), ("n_cpus", C.c_uint),
                ("cuda_streams", C.c_uint), ("cuda_register", C.c_bool),
                ("progress", PROGRESS_FN), ("progress_arg", C.c_void_p), ("cuda_copy", C.c_int),
                ("cuda_kernel_ctas", C.c_uint)]


class Event(C.Structure):
    _fields_ = [("type", C.c_int), ("key", Key)]


class ConnEvent(C.Structure):
    _fields_ = [("type", C.c_int), ("group", C.c_uint16), ("hash_len", C.c_uint8),
                ("hash", C.c_uint8 * UMBP_KEY_HASH_MAX), ("tag", C.c_uint64)]


class StatsSnapshot(C.Structure):
    _fields_ = [("submitted", C.c_uint64 * 2), ("completed", C.c_uint64 * 2),
                ("failed", C.c_uint64 * 2), ("bytes", C.c_uint64 * 2)]


MAX_GROUPS = 32


class NsParams(C.Structure):
    _fields_ = [("key_namespace", C.c_char_p), ("model", C.c_char_p), ("revision", C.c_char_p),
                ("block_size", C.c_uint32), ("cache_layout", C.c_char_p),
                ("dtypes", C.c_char_p * MAX_GROUPS), ("n_groups", C.c_uint),
                ("tp_size", C.c_uint32), ("pp_size", C.c_uint32), ("pcp_size", C.c_uint32),
                ("dcp_size", C.c_uint32), ("draft_model", C.c_char_p)]


class SlotCensus(C.Structure):
    _fields_ = [("free_", C.c_uint64), ("reserved", C.c_uint64), ("published", C.c_uint64),
                ("evicting", C.c_uint64), ("retired", C.c_uint64), ("total", C.c_uint64),
                ("pinned", C.c_uint64), ("in_rings", C.c_uint64)]


class TopoPlanOpts(C.Structure):
    _fields_ = [("nranks", C.c_int), ("gpus", C.POINTER(C.c_int)), ("threads_per_rank", C.c_int),
                ("mempolicy", C.c_int)]


class TopoRankInfo(C.Structure):
    _fields_ = [("rank", C.c_int), ("gpu", C.c_int), ("numa_node", C.c_uint), ("gpu_local", C.c_bool),
                ("mempolicy", C.c_int), ("ncpus", C.c_int), ("shared_cpus", C.c_bool),
                ("nmem_nodes", C.c_int), ("nnotes", C.c_int)]


TOPO_LOAD_NO_CUDA = 1

_P = C.c_void_p
_I = C.c_int
_U = C.c_uint
_SIGS = {
    "umbp_last_error": (C.c_char_p, []),
    "umbp_strerror": (C.c_char_p, [_I]),
    "umbp_version": (C.c_char_p, []),
    "umbp_pool_params_init": (None, [C.POINTER(PoolParams)]),
    "umbp_attach_opts_init": (None, [C.POINTER(AttachOpts)]),
    "umbp_pool_create": (_I, [C.c_char_p, C.POINTER(PoolParams), C.POINTER(_P)]),
    "umbp_pool_attach": (_I, [C.c_char_p, C.POINTER(AttachOpts), C.POINTER(_P)]),
    "umbp_pool_detach": (None, [_P]),
    "umbp_pool_destroy": (_I, [C.c_char_p]),
    "umbp_pool_name_valid": (_I, [C.c_char_p]),
    "umbp_pool_get_info": (_I, [_P, C.POINTER(PoolInfo)]),
    "umbp_pool_list_procs": (_I, [_P, C.POINTER(ProcInfo), _U]),
    "umbp_ns_register": (_I, [_P, C.c_char_p, C.POINTER(C.c_uint32)]),
    "umbp_slot_size": (C.c_uint64, [_P]),
    "umbp_slot_count": (C.c_uint32, [_P]),
    "umbp_contains_bulk": (_I, [_P, _U, C.POINTER(Key), C.POINTER(C.c_uint8)]),
    "umbp_reserve_bulk": (_I, [_P, _I, C.c_uint32, _U, C.POINTER(C.c_uint32)]),
    "umbp_abort": (_I, [_P, C.c_uint32]),
    "umbp_lookup_pin_bulk": (_I, [_P, _U, C.POINTER(Key), C.POINTER(C.c_uint32)]),
    "umbp_unpin_bulk": (_I, [_P, _U, C.POINTER(C.c_uint32)]),
    "umbp_census": (_I, [_P, C.POINTER(SlotCensus)]),
    "umbp_remove": (_I, [_P, C.POINTER(Key)]),
    "umbp_clear_ns": (_I, [_P, C.c_uint32]),
    "umbp_events_drain": (_I, [_P, C.POINTER(Event), _U]),
    "umbp_events_enable_stored": (None, [_P, C.c_bool]),
    "umbp_dp_opts_init": (None, [C.POINTER(DPOpts)]),
    "umbp_dp_engine_create": (_I, [_P, C.POINTER(DPOpts), C.POINTER(_P)]),
    "umbp_dp_engine_destroy": (None, [_P]),
    "umbp_kv_layout_create": (_I, [_P, C.POINTER(KVRegion), _U, C.POINTER(_P)]),
    "umbp_kv_layout_free": (None, [_P]),
    "umbp_kv_layout_object_bytes": (C.c_uint64, [_P, C.c_uint16]),
    "umbp_dp_store": (_I, [_P, _P, C.c_uint16, _I, _U, C.POINTER(C.c_uint32), C.POINTER(Key),
                           _U, C.POINTER(_P)]),
    "umbp_dp_load": (_I, [_P, _P, C.c_uint16, _U, C.POINTER(Key), C.POINTER(C.c_uint32),
                          C.POINTER(_P)]),
    "umbp_dp_job_poll": (_I, [_P]),
    "umbp_dp_job_wait": (_I, [_P, C.c_uint32]),
    "umbp_dp_job_cancel": (_I, [_P]),
    "umbp_dp_job_results": (_I, [_P, C.POINTER(_I), _U]),
    "umbp_dp_job_failed_blocks": (_I, [_P, C.POINTER(C.c_uint32), _U]),
    "umbp_dp_job_release": (None, [_P]),
    "umbp_dp_job_publish": (_I, [_P, C.POINTER(_I), _U]),
    "umbp_dp_job_message": (C.c_char_p, [_P, _U]),
    "umbp_dp_job_count": (C.c_uint64, []),
    "umbp_conn_keys_build": (_I, [C.POINTER(Key), _U, C.c_char_p, C.c_size_t, C.POINTER(Key)]),
    "umbp_conn_ns_derive": (_I, [C.POINTER(NsParams), C.c_char_p, C.c_size_t]),
    "umbp_conn_matched_tokens": (C.c_int64, [C.POINTER(C.c_uint32), _U, C.c_uint32, C.c_uint64,
                                             C.c_uint64, C.POINTER(C.c_uint32)]),
    "umbp_conn_probe_matched": (C.c_int64, [_P, C.POINTER(Key), _U, C.c_char_p, C.c_size_t, _U,
                                            C.c_uint32, C.c_uint64, C.c_uint64,
                                            C.POINTER(C.c_uint32)]),
    "umbp_conn_events_create": (_I, [C.POINTER(_P)]),
    "umbp_conn_events_free": (None, [_P]),
    "umbp_conn_events_add": (_I, [_P, C.POINTER(ConnEvent), _U]),
    "umbp_conn_events_append": (_I, [_P, C.POINTER(ConnEvent), _U]),
    "umbp_conn_events_count": (_U, [_P]),
    "umbp_conn_events_get": (_U, [_P, C.POINTER(ConnEvent), _U]),
    "umbp_conn_events_pop_common": (_U, [_P, C.POINTER(ConnEvent), _U]),
    "umbp_conn_events_increment_workers": (_I, [_P, _I]),
    "umbp_conn_events_workers": (_U, [_P]),
    "umbp_conn_events_aggregate": (None, [_P]),
    "umbp_conn_events_clear": (None, [_P]),
    "umbp_conn_stats_create": (_I, [C.POINTER(_P)]),
    "umbp_conn_stats_free": (None, [_P]),
    "umbp_conn_stats_add": (_I, [_P, _I, C.c_uint64, C.c_uint64, C.c_uint64, C.c_uint64]),
    "umbp_conn_stats_read": (None, [_P, C.c_bool, C.POINTER(StatsSnapshot)]),
    "umbp_topo_load": (_I, [C.c_char_p, _U, C.POINTER(_P)]),
    "umbp_topo_free": (None, [_P]),
    "umbp_topo_gpu_count": (_I, [_P]),
    "umbp_topo_plan_make": (_I, [_P, C.POINTER(TopoPlanOpts), C.POINTER(_P)]),
    "umbp_topo_plan_free": (None, [_P]),
    "umbp_topo_plan_threads_per_rank": (_I, [_P]),
    "umbp_topo_plan_rank": (_I, [_P, _I, C.POINTER(TopoRankInfo)]),
    "umbp_topo_plan_rank_cpus": (_I, [_P, _I, C.POINTER(_U), _I]),
    "umbp_topo_plan_rank_note": (C.c_char_p, [_P, _I, _I]),
    "umbp_topo_plan_numa_nodes": (_I, [_P, C.POINTER(_U), _I]),
    "umbp_topo_plan_note_count": (_I, [_P]),
    "umbp_topo_plan_note": (C.c_char_p, [_P, _I]),
}

_lib = None


# The C name of every structure above: lib() compares each one's size with
# the library's (umbp_abi_struct_size), so a binding and a libumbp of
# different versions refuse each other instead of corrupting memory.
_C_NAMES = {Key: "umbp_key", PoolParams: "umbp_pool_params", AttachOpts: "umbp_attach_opts",
            KVRegion: "umbp_kv_region", DPOpts: "umbp_dp_opts", Event: "umbp_event",
            ConnEvent: "umbp_conn_event", StatsSnapshot: "umbp_conn_stats_snapshot",
            NsParams: "umbp_conn_ns_params", SlotCensus: "umbp_slot_census",
            TopoPlanOpts: "umbp_topo_plan_opts", TopoRankInfo: "umbp_topo_rank_info",
            PartitionInfo: "umbp_partition_info", PoolInfo: "umbp_pool_info", ProcInfo: "umbp_proc_info"}


def check_abi(handle) -> None:
    """Raise ImportError naming the first structure whose size differs between
    this module and the loaded library, or a library without the size table."""
    if not hasattr(handle, "umbp_abi_struct_size"):
        raise ImportError(f"{handle._name} has no umbp_abi_struct_size: it is older than this umbp "
                          "package; rebuild or reinstall libumbp and the package from one version")
    size = handle.umbp_abi_struct_size
    size.restype, size.argtypes = C.c_size_t, [C.c_char_p]
    for cls, name in _C_NAMES.items():
        theirs, ours = size(name.encode()), C.sizeof(cls)
        if theirs != ours:
            raise ImportError(f"struct {name} is {theirs} bytes in {handle._name} but {ours} in "
                              f"{__file__}: the library and the Python package are of different "
                              "versions; rebuild or reinstall both from one version (pip install .)")


def declare(handle, sigs: dict) -> None:
    """Set restype and argtypes of every function in `sigs` on `handle`.
    Raises ImportError naming the first one the library lacks (a libumbp of
    another version whose structures happen to have the same sizes)."""
    for name, (res, args) in sigs.items():
        try:
            fn = getattr(handle, name)
        except AttributeError:
            try:
                ver = handle.umbp_version
                ver.restype, ver.argtypes = C.c_char_p, []
                theirs = f"libumbp {ver().decode(errors='replace')}"
            except AttributeError:
                theirs = "a libumbp"
            raise ImportError(f"{handle._name} ({theirs}) has no function {name}, which {__file__} calls: the "
                              "library and the Python package are of different versions; rebuild or reinstall "
                              "both from one version (pip install .)") from None
        fn.restype, fn.argtypes = res, args


def lib():
    """The loaded library with every prototype declared (loaded on first use,
    its struct sizes checked against this module's: check_abi)."""
    global _lib
    if _lib is None:
        path = _find_library()
        try:
            handle = C.CDLL(path)
        except OSError as e:
            if os.environ.get("UMBP_LIB"):
                raise OSError(f"UMBP_LIB={path} cannot be loaded ({e}): point it at libumbp.so (the build's "
                              "build/libumbp.so, or the installed package's), or unset it") from e
            # a wheel built on another machine: it links the system's libraries
            raise OSError(f"{path} cannot be loaded ({e}): libumbp needs the run-time libraries it was built "
                          "with: liburcu, libnuma, hwloc (Debian 12: apt-get install liburcu8 libnuma1 libhwloc15), "
                          "and cudart where CUDA was found at build time; install them, or build umbp on this "
                          "machine (bash scripts/setup.sh, then pip install . in its repository)") from e
        check_abi(handle)
        declare(handle, _SIGS)
        _lib = handle
    return _lib


def check(rc: int, what: str) -> int:
    """Raise UMBPError for a negative return code, else return it."""
    if rc < 0:
        detail = lib().umbp_last_error().decode(errors="replace")
        raise UMBPError(rc, what, detail)
    return rc
