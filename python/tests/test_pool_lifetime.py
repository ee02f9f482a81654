# SPDX-License-Identifier: Apache-2.0
"""Embedded pools across engines, and names people can read (issue 28 §3).

Real processes on real /dev/shm segments: the scheduler-role connector runs
here, worker-role connectors in processes of their own (worker_proc.py), each
process with the VllmConfig of its engine (conftest.make_vllm_config: vLLM's
instance id says which engine a process belongs to). An engine killed with
SIGKILL is a worker process killed with SIGKILL; the umbp CLI and daemon are
the built ones."""
from __future__ import annotations

import ctypes as C
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager

import pytest

from conftest import make_kv_cache_config, make_vllm_config, sched_output, stop_daemon
from test_connector import Worker, _umbp_cli

from vllm.distributed.kv_events import BlockRemoved
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

import umbp.vllm as U
from umbp import _lib as L
from umbp import pool_notes
from umbp import tier as T

# make_vllm_config has no model: the label of its derived namespace
LABEL = "unknown tp1 float16 block16"


def sched(pool, engine, **extra):
    return KVConnectorFactory.create_connector(make_vllm_config(pool, engine=engine, **extra),
                                               KVConnectorRole.SCHEDULER, make_kv_cache_config())


def cli(*args, check=True):
    r = subprocess.run([_umbp_cli(), *args], capture_output=True, text=True, timeout=60)
    assert not check or r.returncode == 0, f"umbp {' '.join(args)}: exit {r.returncode}: {r.stdout}{r.stderr}"
    return r


def exists(pool):
    return os.path.exists(f"/dev/shm/umbp.{pool}")


def notes_exist(pool):
    return os.path.exists(pool_notes.path(pool))


def kill(w: Worker) -> None:
    """SIGKILL the worker's process: no shutdown, no atexit."""
    w.p.send_signal(signal.SIGKILL)
    w.p.wait(timeout=30)


@contextmanager
def umbp_log():
    """What the connector logs here (logger vllm.umbp: vLLM's logger tree does
    not propagate to the root, where caplog listens)."""
    lines: list[str] = []

    class H(logging.Handler):
        def emit(self, record):
            lines.append(f"{record.levelname}: {record.getMessage()}")

    h = H(logging.INFO)
    lg = logging.getLogger("vllm.umbp")
    old = lg.level
    lg.addHandler(h)
    lg.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        lg.removeHandler(h)
        lg.setLevel(old)


def ls_row(pool):
    rows = [r for r in json.loads(cli("pool", "ls", "--json").stdout) if r["name"] == pool]
    assert len(rows) == 1, rows
    return rows[0]


def test_a_killed_engines_embedded_pool_is_removed_by_the_next_engine(pool_name):
    """An engine SIGKILLed leaves its embedded pool with all its memory;
    `pool ls` and `pool info` say that `umbp pool gc` removes it (not reap);
    the next engine with that pool name removes it, says so, and makes its own."""
    w = Worker(pool_name, 1, 0, seed=1, test_engine="killed")
    uuid0 = json.loads(cli("pool", "info", pool_name, "--json").stdout)["uuid"]
    kill(w)
    assert exists(pool_name) and notes_exist(pool_name)
    row = ls_row(pool_name)
    assert row["embedded"] is True and "'umbp pool gc' removes it" in row["status"], row
    assert "reap" not in row["status"]
    text = cli("pool", "ls").stdout
    assert f"embedded pool of a vLLM engine that is gone: 'umbp pool gc' removes it" in text, text
    info = cli("pool", "info", pool_name).stdout
    assert "embedded in vLLM engine killed" in info and "its processes are gone: 'umbp pool gc' removes it" in info
    with umbp_log() as log:
        s = sched(pool_name, "next")
    try:
        assert s.pool.owner, "the next engine made the pool again"
        said = [x for x in log if "removing embedded pool" in x]
        assert len(said) == 1 and "vLLM instance killed" in said[0] and "are all dead" in said[0], log
        info = json.loads(cli("pool", "info", pool_name, "--json").stdout)
        assert info["uuid"] != uuid0 and info["embedded"]["instance"] == "next", info
    finally:
        s.shutdown()
    assert not exists(pool_name) and not notes_exist(pool_name), "an engine that exits removes its pool"


def test_pool_gc_removes_embedded_pools_whose_processes_are_all_dead(pool_name):
    """`umbp pool gc`: a dead engine's embedded pool goes; an embedded pool in
    use, a pool made by `umbp pool create` (even with dead processes: that one
    needs reap, and ls says so) and notes of live pools stay; notes left
    without their pool go."""
    dead, live, made = pool_name, pool_name + "-live", pool_name + "-cli"
    w = Worker(dead, 1, 0, seed=1, test_engine="gone")
    kill(w)
    s = sched(live, "alive")
    cli("pool", "create", made, "--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--quiet")
    v = Worker(made, 1, 0, seed=1, mode="standalone", key_namespace=None)   # writes a label: notes exist
    kill(v)
    orphan = pool_notes.path(pool_name + "-orphan")
    with open(orphan, "w") as f:
        f.write("umbp-notes\t1\t" + "0" * 32 + "\n")
    try:
        assert notes_exist(made)
        row = ls_row(made)
        assert row["embedded"] is False and row["status"] == "has dead processes (umbp pool reap)", row
        assert "leftover notes" in cli("pool", "ls").stdout
        # every pool on the host, without removing (other tests' killed engines may be looked at now)
        dry = cli("pool", "gc", "--dry-run").stdout
        assert f"would remove embedded pool {dead} " in dry and exists(dead), dry
        assert f"would remove {orphan} (notes left without their pool)" in dry, dry
        assert f"kept {live}: embedded pool in use by 1 live process (pid {os.getpid()})" in dry, dry
        assert made not in dry, dry
        out = cli("pool", "gc", dead, live, made, pool_name + "-orphan").stdout
        assert f"removed embedded pool {dead} (vLLM engine gone, created by pid {w.p.pid}" in out, out
        assert f"removed {orphan} (notes left without their pool)" in out, out
        assert f"kept {live}: embedded pool in use by 1 live process (pid {os.getpid()})" in out, out
        assert f"kept {made}: not an embedded pool of a vLLM engine (made by 'umbp pool create'" in out, out
        assert not exists(dead) and not notes_exist(dead) and not os.path.exists(orphan)
        assert exists(live) and exists(made) and notes_exist(made)
        out = cli("pool", "gc", dead).stdout
        assert f"no pool named {dead}" in out and "nothing to remove" in out, out
    finally:
        s.shutdown()
        cli("pool", "destroy", made, check=False)
        cli("pool", "destroy", dead, check=False)
    assert not exists(live) and not notes_exist(made), "destroy takes the notes with the pool"


def test_an_engine_whose_workers_are_killed_at_shutdown_still_removes_its_pool(pool_name):
    """A worker made the pool; the engine core's scheduler leaves first (vLLM
    shuts the core down, then kills workers that do not exit in time): the
    scheduler removes the pool, so the killed worker leaves nothing behind."""
    w = Worker(pool_name, 1, 0, seed=1, test_engine="eng-a")
    s = sched(pool_name, "eng-a")
    assert not s.pool.owner
    s.shutdown()
    assert not exists(pool_name) and not notes_exist(pool_name), "the engine core's exit is its engine's"
    kill(w)
    assert not exists(pool_name) and not notes_exist(pool_name)


def test_a_second_engine_of_the_same_namespace_joins_and_the_pool_stays(pool_name):
    """Engine A (scheduler here, one worker) makes the embedded pool; its
    processes attach quietly. Engine B of the same key namespace joins,
    knowingly: a warning says its capacity is not applied. A exits: the pool
    stays for B; B exits: the pool goes."""
    with umbp_log() as log:
        a = sched(pool_name, "eng-a")
    aw = Worker(pool_name, 1, 0, seed=1, test_engine="eng-a")
    bw = None
    try:
        assert a.pool.owner and not log, log
        said = [x for x in aw.call("logs") if not x.startswith("INFO: UMBP rank")]   # placement: see test_connector
        assert said == [], "a process of the same engine is not a second engine"
        bw = Worker(pool_name, 1, 0, seed=2, test_engine="eng-b", capacity_bytes="2MiB")
        said = bw.call("logs")
        assert any("is in use by another vLLM engine of the same key namespace test-ns" in x and "joins it" in x
                   and "capacity_bytes=2097152 is not applied" in x for x in said), said
        n = pool_notes.read(pool_name)
        assert sorted(i for i, _ in n.procs.values()) == ["eng-a", "eng-a", "eng-b"], n   # A: here and a worker
        aw.close()
        aw = None
        a.shutdown()
        assert exists(pool_name), "engine A removed the pool under engine B"
        bw.close()
        bw = None
        assert not exists(pool_name) and not notes_exist(pool_name), "the last engine to leave removes the pool"
    finally:
        for w in (aw, bw):
            if w:
                w.close()
        a.shutdown()


def test_a_second_engine_of_another_namespace_is_refused(pool_name):
    """Engine B of another key namespace (another model or KV layout) is
    refused with the fix; engine A and its pool go on."""
    a = sched(pool_name, "eng-a")
    try:
        with pytest.raises(ValueError) as e:
            Worker(pool_name, 1, 0, seed=2, test_engine="eng-b", key_namespace="other-ns")
        msg = str(e.value)
        assert f"embedded UMBP pool {pool_name!r} belongs to another running vLLM engine (pids {os.getpid()}, " \
               "key namespace test-ns)" in msg, msg
        assert "this engine's (other-ns)" in msg
        assert f'kv_connector_extra_config.pool, e.g. "{pool_name}-2"' in msg
        assert f"`umbp daemon {pool_name} --capacity SIZE` and \"mode\": \"standalone\"" in msg
        assert exists(pool_name) and "eng-b" not in {i for i, _ in pool_notes.read(pool_name).procs.values()}
        assert a.pool.ns("still-works") >= 0
    finally:
        a.shutdown()
    assert not exists(pool_name)


def test_a_pool_not_made_by_an_engine_is_attached_as_is(pool_name):
    """An embedded-mode engine whose pool name is a pool made by `umbp pool
    create` uses it as mode standalone would, says so, and never removes it."""
    cli("pool", "create", pool_name, "--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--quiet")
    with umbp_log() as log:
        s = sched(pool_name, "eng-a")
    s.shutdown()
    assert any("is not the embedded pool of a vLLM engine" in x and "never removes it" in x for x in log), log
    assert exists(pool_name)


def test_a_file_that_is_not_a_pool_is_refused_and_leaves_no_notes(pool_name):
    """A file of the pool's name that is not a umbp pool (garbage, another
    program's) is refused naming `umbp pool destroy`, and the refusal leaves
    no notes file of its own beside it: the file is not touched."""
    with open(f"/dev/shm/umbp.{pool_name}", "wb") as f:
        f.write(os.urandom(4096))
    try:
        with pytest.raises(Exception, match=rf"umbp pool destroy {pool_name}"):
            sched(pool_name, "eng-a")
        assert not notes_exist(pool_name)
        assert os.path.getsize(f"/dev/shm/umbp.{pool_name}") == 4096
    finally:
        os.unlink(f"/dev/shm/umbp.{pool_name}")


def _publish_and_remove(s, hashes, removed):
    """Publish blocks `hashes` in scheduler connector s's namespace (rank 0,
    group 0) through its pool handle, then remove the first `removed`."""
    lib = L.lib()
    lib.umbp_reserve.argtypes = [C.c_void_p, C.c_int, C.c_uint32, C.POINTER(C.c_uint32)]
    lib.umbp_publish.argtypes = [C.c_void_p, C.c_uint32, C.POINTER(L.Key)]
    keys = U._keys(s._tmpl(0, 0), hashes)
    for i in range(len(hashes)):
        slot = C.c_uint32()
        assert lib.umbp_reserve(s.pool.h, -1, s.ns_id, C.byref(slot)) == 0
        assert lib.umbp_publish(s.pool.h, slot, keys[i]) == 0
    for i in range(removed):
        assert lib.umbp_remove(s.pool.h, keys[i]) == 0


def _removed(s):
    return sorted(h for e in s.take_events() if isinstance(e, BlockRemoved) for h in e.block_hashes)


def test_engines_sharing_a_pool_each_get_every_removal(pool_name):
    """Two engines of one model on one pool (the second joined the first's
    embedded pool): a block removed from the pool is a BlockRemoved event of
    each engine, where the pool's event ring gave each removal to whichever
    engine drained it first (one got 3 of 3, the other none). Each scheduler
    reads the pool's broadcast feed at its own cursor, also two engines of
    one pid (here one process; in life, containers of separate pid namespaces
    sharing /dev/shm), where the second found "vllm.PID" held and drained the
    event ring instead."""
    a, b = sched(pool_name, "eng-a"), sched(pool_name, "eng-b")
    try:
        pid = os.getpid()
        assert {c["name"]: c["alive"] for c in T.feed_info(a.pool.h)["consumers"]} == \
            {f"vllm.{pid}": True, f"vllm.{pid}.2": True}
        hashes = [bytes([i + 1]) * 32 for i in range(4)]
        _publish_and_remove(a, hashes, 3)
        assert _removed(a) == hashes[:3]
        assert _removed(b) == hashes[:3]
        assert _removed(a) == [] and _removed(b) == []   # each once
    finally:
        b.shutdown()
        a.shutdown()
    assert not exists(pool_name)


def test_without_the_feed_removals_come_from_the_event_ring(pool_name):
    """A pool whose feed has no room for another consumer (16 live ones): the
    engine says that its BlockRemoved events are incomplete beside other
    engines, and still reports the removals it drains from the event ring."""
    cli("pool", "create", pool_name, "--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--quiet")
    pool = C.c_void_p()
    assert L.lib().umbp_pool_attach(pool_name.encode(), None, C.byref(pool)) == 0
    held = []
    try:
        for i in range(16):
            f = C.c_void_p()
            assert T.lib().umbp_feed_open(pool, f"hold.{i}".encode(), None, C.byref(f)) == 0
            held.append(f)
        with umbp_log() as log:
            s = sched(pool_name, "eng-a")
        try:
            assert any("event ring" in x and "16 consumers" in x and "not complete" in x for x in log), log
            hashes = [bytes([i + 1]) * 32 for i in range(3)]
            _publish_and_remove(s, hashes, 2)
            assert _removed(s) == hashes[:2]
        finally:
            s.shutdown()
    finally:
        for f in held:
            T.lib().umbp_feed_close(f)
        L.lib().umbp_pool_detach(pool)
        cli("pool", "destroy", pool_name)


def test_derived_namespaces_have_a_label_in_inspect_and_pool_info(pool_name):
    """A worker that derives its namespace (vllm- + 32 hex digits) writes its
    label beside it; `umbp inspect` and `umbp pool info` show it. An explicit
    key_namespace is its own label."""
    cli("pool", "create", pool_name, "--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--quiet")
    w = Worker(pool_name, 1, 0, seed=1, mode="standalone", key_namespace=None)
    e = Worker(pool_name, 1, 0, seed=1, mode="standalone", key_namespace="chat")
    try:
        ns = w.call("info")["handshake"].namespace
        assert ns.startswith("vllm-") and len(ns) == 37
        assert pool_notes.read(pool_name).labels == {ns: LABEL}
        ins = {n["name"]: n for n in json.loads(cli("inspect", pool_name, "--json").stdout)["namespaces"]}
        assert ins[ns]["label"] == LABEL and ins["chat"]["label"] is None, ins
        text = cli("inspect", pool_name).stdout
        assert LABEL in text, text
        info = json.loads(cli("pool", "info", pool_name, "--json").stdout)
        got = {n["name"]: n["label"] for n in info["namespaces"]}
        assert got == {ns: LABEL, "chat": None}, info
        assert f"{ns}    {LABEL}" in cli("pool", "info", pool_name).stdout
    finally:
        w.close()
        e.close()


def _daemon(pool, *args):
    d = subprocess.Popen([_umbp_cli(), "daemon", pool, "--capacity", "1MiB", "--slot-size", "4KiB",
                          "--no-prefault", "--foreground", "--reap-interval", "100", *args],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    log: list[str] = []
    import threading
    threading.Thread(target=lambda: [log.append(x) for x in d.stderr], daemon=True).start()
    end = time.monotonic() + 30
    while not any("ready:" in x for x in log):
        assert d.poll() is None and time.monotonic() < end, log
        time.sleep(0.05)
    return d, log


def _quota(pool, ns):
    for n in json.loads(cli("inspect", pool, "--json", "--events", "0").stdout)["namespaces"]:
        if n["name"] == ns:
            return n["quota_bytes"]
    return None


def _wait(what, cond, timeout=10):
    end = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < end, what
        time.sleep(0.05)


def test_daemon_quota_file_names_namespaces_by_label_and_glob(pool_name, tmp_path):
    """--quota-file lines name namespaces by label ('label:PATTERN') or by a
    glob of names, applied as engines register them; the last matching line
    wins; a quota larger than the pool is a warning; SIGHUP re-reads them."""
    qf = tmp_path / "quotas"
    qf.write_text("# by label, by glob, too big\n"
                  "label:unknown tp1 float16* 64KiB\n"
                  "chat-* 8KiB\n"
                  "chat-b 16KiB\n"
                  "huge 1TiB\n")
    d, log = _daemon(pool_name, "--quota-file", str(qf))
    w = []
    try:
        assert any("quota of namespace 'huge' (1 TiB) is larger than the pool (1 MiB of slots)" in x for x in log), log
        w.append(Worker(pool_name, 1, 0, seed=1, mode="standalone", key_namespace=None))
        ns = w[0].call("info")["handshake"].namespace
        for name in ("chat-a", "chat-b"):
            w.append(Worker(pool_name, 1, 0, seed=1, mode="standalone", key_namespace=name))
        _wait("label quota", lambda: _quota(pool_name, ns) == 64 << 10)
        _wait("glob quota", lambda: _quota(pool_name, "chat-a") == 8 << 10)
        assert _quota(pool_name, "chat-b") == 16 << 10, "the last matching line wins"
        assert any(f"quota of namespace '{ns}' (id" in x and f"label '{LABEL}'): 64 KiB" in x for x in log), log
        qf.write_text("chat-* 4KiB\n")
        d.send_signal(signal.SIGHUP)
        _wait("SIGHUP", lambda: _quota(pool_name, ns) == 0 and _quota(pool_name, "chat-b") == 4 << 10)
        assert _quota(pool_name, "chat-a") == 4 << 10
    finally:
        for x in w:
            x.close()
        assert stop_daemon(d) == 0, log


def test_notes_lock_is_never_held_on_a_removed_file(pool_name):
    """A process that waited for the notes' lock while its holder removed the
    file (a pool removed by its last process, or by umbp pool gc) locks the
    file at the path, not the removed one: two lockers never both hold it."""
    import threading
    got = {}
    with pool_notes.Locked(pool_name) as first:
        def waiter():
            with pool_notes.Locked(pool_name, timeout_s=10) as second:
                got["same"] = os.fstat(second.fd).st_ino == os.stat(pool_notes.path(pool_name)).st_ino
        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.2)
        assert "same" not in got, "the lock was not exclusive"
        first.remove()
    t.join(10)
    assert got == {"same": True}, got


def test_a_pool_destroyed_under_a_running_engine_is_said(pool_name):
    """`umbp pool destroy --force` under a running engine (its daemon then
    stops) left the engine storing into a mapping no one else can attach to,
    and a daemon started again made another pool the engine never saw, without
    a word. Its scheduler now says so, once, with the fix."""
    cli("pool", "create", pool_name, "--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--quiet")
    s = sched(pool_name, "eng-a", mode="standalone")
    try:
        with umbp_log() as log:
            s.build_connector_meta(sched_output())
            assert not [x for x in log if "destroyed" in x], log
            cli("pool", "destroy", pool_name, "--force")
            cli("pool", "create", pool_name, "--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--quiet")
            s.pool._lost_checked = 0.0   # checked at most every 5 s
            s.build_connector_meta(sched_output())
            s.pool._lost_checked = 0.0
            s.build_connector_meta(sched_output())
        said = [x for x in log if "destroyed while this engine ran" in x]
        assert len(said) == 1 and said[0].startswith("ERROR") and "now names another pool" in said[0], log
        assert "Restart the engine" in said[0] and f"umbp daemon {pool_name}" in said[0], said
    finally:
        s.shutdown()


def test_a_daemons_pool_with_small_slots_names_the_daemons_option(pool_name):
    """A pool made with smaller slots than the model's block object: the fix
    named is the daemon's --slot-size (kv_connector_extra_config.slot_size,
    which the old message named, changes nothing for a pool that is there);
    slot_size and capacity_bytes in mode standalone are said not to apply,
    and no longer refuse a pool whose slots fit the model."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    cli("pool", "create", pool_name, "--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--quiet")
    big = KVCacheConfig(num_blocks=32, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(
        ["a", "b"], FullAttentionSpec(block_size=16, num_kv_heads=8, head_size=16, dtype=torch.float16))])
    for mode in ("standalone", "embedded"):
        with pytest.raises(ValueError, match=rf"needs 16384: .*`umbp daemon {pool_name} --capacity SIZE "
                                             r"--slot-size 16KiB`"):
            KVConnectorFactory.create_connector(make_vllm_config(pool_name, mode=mode, slot_size="4KiB"),
                                                KVConnectorRole.SCHEDULER, big)
    with umbp_log() as log:
        s = sched(pool_name, "eng-a", mode="standalone", slot_size="8KiB", capacity_bytes="1GiB")
    s.shutdown()
    assert any("capacity_bytes, slot_size, no_prefault, which make an embedded pool, are not applied" in x
               and "256 slots of 4096 bytes" in x for x in log), log
    assert exists(pool_name)


def test_an_engine_joins_a_pool_larger_than_what_is_left_of_dev_shm(pool_name, monkeypatch):
    """The check that capacity_bytes fits /dev/shm ran in every process,
    also when the pool was there already: once the first process of an
    engine had made (and prefaulted) a pool of more than half of /dev/shm,
    the engine's other processes, and engines joining it, were refused
    ("does not fit /dev/shm"), so such an engine could not start. Here an
    engine whose capacity_bytes exceeds /dev/shm joins one that fits (it is
    said not to apply), and engine A's next process attaches while /dev/shm
    reports less free than A's capacity_bytes."""
    big = (shutil.disk_usage("/dev/shm").free >> 30) + 1 << 30
    if big > 60 << 30:
        pytest.skip("/dev/shm has more free than a pool of 4 KiB slots can hold")
    a = sched(pool_name, "eng-a")
    bw = None
    try:
        bw = Worker(pool_name, 1, 0, seed=1, test_engine="eng-b", capacity_bytes=big)
        said = bw.call("logs")
        assert any("joins it" in x and f"capacity_bytes={big} is not applied" in x for x in said), said
        with pytest.raises(ValueError, match="does not fit /dev/shm"):
            sched(pool_name + "-2", "eng-c", capacity_bytes=big)    # a pool to be made is still checked
        gone = shutil.disk_usage("/dev/shm")._replace(free=a.cfg.capacity - 1)
        monkeypatch.setattr(shutil, "disk_usage", lambda path: gone)
        a2 = sched(pool_name, "eng-a")    # not shut down: in this process it would remove A's pool
        assert not a2.pool.owner
        monkeypatch.undo()
    finally:
        if bw:
            bw.close()
        a.shutdown()


def test_standalone_refuses_another_engines_embedded_pool(pool_name):
    """mode standalone on the name of an engine's embedded pool attached to it
    as if a daemon owned it; the engine removed it at its exit (standalone
    processes are not recorded as its users) and took the other engine's
    blocks with it. It is refused, naming the daemon and mode embedded; the
    pool and its engine are left as they were."""
    aw = Worker(pool_name, 1, 0, seed=1, test_engine="eng-a")
    try:
        with pytest.raises(ValueError, match=r"'standalone' attaches to a daemon's pool, but UMBP pool .* is the "
                                             r"embedded pool of running vLLM engine eng-a .*`umbp daemon NAME"):
            sched(pool_name, "eng-b", mode="standalone")
        assert exists(pool_name) and ls_row(pool_name)["embedded"] is True
    finally:
        aw.close()
    assert not exists(pool_name)
