# SPDX-License-Identifier: Apache-2.0
"""Suite 'cluster': two "hosts" on this machine (two pools, two daemons, two
`umbp tier`s) and one real mooncake_master on 127.0.0.1, started here.

- blocks stored by host A's TP-2 workers are loaded byte-identically by host
  B's TP-2 workers after B's probe missed and its tier brought them in;
- a prefix that is nowhere is answered by the tier (0 blocks, remote misses
  counted), not by its deadline;
- the master killed and restarted (also while no call of the tier would
  notice: it is reported within seconds), a tier killed in the middle of a
  transfer, a transfer Mooncake gave up on (its late bytes land in the slots
  the tier holds, not in a reused one), a store that refuses puts: no worker
  fails, the pools pass `umbp inspect --check`, no block is published
  half-written, requests are never held past their deadline, the tiers
  reconnect by themselves;
- the tier's life as an operator meets it: signals (SIGTERM while a Mooncake
  call holds the GIL, SIGHUP), its pool destroyed under it, a second tier,
  a feed name taken, a setup that raises; `umbp bench tier` stopped by a
  signal, and killed (SIGKILL): its master and tiers die with it and `umbp
  pool gc` removes its pools.
"""
from __future__ import annotations

import errno
import os
import signal
import time

import pytest

from cluster_util import TOOL, Host, Master, Scheduler, dump_logs, free_port, json_status, wait_for

NS = "cluster-model-tp2"
TP = 2


@pytest.fixture
def cluster(tmp_path):
    master = Master(tmp_path)
    hosts = []

    def host(name, **kw):
        h = Host(name, tmp_path, **kw)
        hosts.append(h)
        return h
    try:
        yield master, host, tmp_path
    finally:
        for h in hosts:  # the tiers' Mooncake clients close in parallel (1 s each)
            if h.tier is not None and h.tier.poll() is None:
                h.tier.send_signal(signal.SIGTERM)
        try:
            for h in hosts:
                h.close()
        finally:
            master.kill()


def store_on(host: Host, ns: str, first: int, count: int) -> None:
    for r in range(TP):
        p = host.worker("store", ns, r, first, count)
        assert p.returncode == 0, p.stderr


def load_on(host: Host, ns: str, first: int, count: int) -> None:
    for r in range(TP):
        p = host.worker("load", ns, r, first, count)
        assert p.returncode == 0, f"rank {r}: {p.stderr}"


def probe(host: Host, ns: str, first: int, count: int) -> int:
    p = host.worker("probe", ns, TP, first, count)
    assert p.returncode == 0, p.stderr
    return int(p.stdout.strip())


def stopped(pid: int) -> bool:
    """Every thread of pid is in state T (a SIGSTOP takes effect per thread,
    as each is next scheduled)."""
    import glob
    for f in glob.glob(f"/proc/{pid}/task/*/stat"):
        try:
            if open(f).read().rsplit(")", 1)[1].split()[0] not in ("T", "t"):
                return False
        except OSError:
            pass
    return True


def written(host: Host) -> int:
    return host.status().get("stats", {}).get("wb_written", 0)


def test_two_hosts_tp2(cluster):
    master, host, work = cluster
    a, b = host("a"), host("b")
    a.start_tier(master)
    b.start_tier(master)
    a.wait_state("connected")
    b.wait_state("connected")
    try:
        store_on(a, NS, 0, 24)
        wait_for(lambda: written(a) >= 24 * TP, 30, "host A's write-back of 48 shards")
        assert probe(b, NS, 0, 24) == 0  # B's probe misses locally
        s = Scheduler(b)
        try:
            blocks, secs = s.fetch(NS, TP, 0, 24)
        finally:
            s.close()
        assert blocks == 24
        assert probe(b, NS, 0, 24) == 24
        load_on(b, NS, 0, 24)  # byte-identical on every rank
        st = json_status(b)  # the CLI's view
        assert st["tier"]["stats"]["blocks_fetched"] == 24
        assert st["tier"]["stats"]["keys_fetched"] == 48
        # blocks B brought in are not written back again (not B's own)
        time.sleep(0.3)
        assert b.status()["stats"]["wb_written"] == 0
        # a prefix partly remote: the answer stops at the first block missing on some rank
        store_on(a, NS, 100, 4)
        p = a.worker("store", NS, 0, 104, 2)  # block 104-105 on rank 0 only
        assert p.returncode == 0
        wait_for(lambda: written(a) >= 24 * TP + 4 * TP + 2, 30, "write-back")
        s = Scheduler(b)
        try:
            assert s.fetch(NS, TP, 100, 6)[0] == 4
        finally:
            s.close()
        for h in (a, b):
            c = h.check()
            assert c.returncode == 0, c.stdout + c.stderr
    except BaseException:
        print(dump_logs(work))
        raise


def test_nowhere_is_answered_by_the_tier(cluster):
    """Blocks on no host: the tier answers 0 blocks (not the request's
    deadline, -ETIMEDOUT) and counts each as a remote miss. How fast the
    answer comes is `umbp bench tier`'s to say."""
    master, host, work = cluster
    b = host("b")
    b.start_tier(master)
    b.wait_state("connected")
    s = Scheduler(b)
    try:
        times = []
        for i in range(5):
            blocks, secs = s.fetch("nowhere-model", TP, 1000 * i, 32)
            assert blocks == 0
            times.append(secs)
        times.sort()
        # each answer is the tier's (0 blocks), not its request's deadline
        # (-ETIMEDOUT), and each missing block counts as a remote miss; how
        # fast it comes is the benchmarks' business (a median bound of 0.1 s
        # was a speed check, flaky on a loaded machine)
        print(f"nowhere: answered in {times[0] * 1e3:.1f}-{times[-1] * 1e3:.1f} ms")
        assert b.status()["stats"]["remote_misses"] == 5 * 32
    except BaseException:
        print(dump_logs(work))
        raise
    finally:
        s.close()


def test_master_killed_and_restarted(cluster):
    master, host, work = cluster
    a, b = host("a"), host("b")
    a.start_tier(master)
    b.start_tier(master)
    a.wait_state("connected")
    b.wait_state("connected")
    s = Scheduler(b)
    try:
        master.kill()
        # the next request finds the master gone: answered within its deadline,
        # and the tier turns 'disconnected'
        keys_first = 500
        try:
            blocks, secs = s.fetch(NS, TP, keys_first, 4, timeout=15)
            assert blocks < 0 or blocks == 0
        except RuntimeError:
            pass  # refused at once: already disconnected
        b.wait_state("disconnected", 30)
        # refused at once: the request itself is refused (RuntimeError), not
        # answered later; and the call that refuses it does not wait out the
        # request's deadline (2 s by default): the bound is half of it, a
        # margin a loaded machine keeps (it was 0.05 s, a speed check)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="disconnected|not connected"):
            s.fetch(NS, TP, keys_first, 4)
        took = time.monotonic() - t0
        assert took < 1.0, f"refusing took {took:.2f} s: expected at once, not a wait for the 2 s deadline"
        # engines keep working at local speed, on both hosts
        store_on(b, NS, 600, 8)
        load_on(b, NS, 600, 8)
        store_on(a, NS, 700, 8)  # queued for write-back while the master is away
        master.start()
        a.wait_state("connected", 60)
        b.wait_state("connected", 60)
        wait_for(lambda: written(a) >= 8 * TP, 60, "A's queued write-back after the restart")
        assert probe(b, NS, 700, 8) == 0
        blocks, _ = s.fetch(NS, TP, 700, 8)
        assert blocks == 8
        load_on(b, NS, 700, 8)
        for h in (a, b):
            c = h.check()
            assert c.returncode == 0, c.stdout + c.stderr
    except BaseException:
        print(dump_logs(work))
        raise
    finally:
        s.close()


def written_on_a_paused_b(master, host, work, n):
    """Hosts a and b with tiers connected: n blocks stored on a and written
    back to the store, and b's tier started with the test hook that stops it
    after a transfer into its reserved slots, before it publishes them (while
    the returned path exists)."""
    a, b = host("a"), host("b")
    a.start_tier(master)
    a.wait_state("connected")
    store_on(a, NS, 0, n)
    wait_for(lambda: written(a) >= n * TP, 30, "write-back")
    pause = work / "paused"
    b.start_tier(master, env={"UMBP_TIER_TEST_PAUSE_BEFORE_PUBLISH": str(pause)})
    b.wait_state("connected")
    return a, b, pause


def test_tier_killed_mid_transfer(cluster):
    master, host, work = cluster
    a, b, pause = written_on_a_paused_b(master, host, work, 8)
    s = Scheduler(b)
    try:
        keys = s.keys(NS, TP, 0, 8)
        r = s.client.request(keys, 8, TP)
        assert r is not None, s.client.last
        ticket = r[0]
        wait_for(pause.exists, 30, "B's tier to hold the fetched shards unpublished")
        assert s.client.poll(ticket) is None  # in progress
        b.kill_tier()  # returns once the tier has exited: its table lock is gone
        # the first poll after the tier's death says so (its lock is gone), not
        # "in progress" (None) until the deadline: the answer, not its speed
        rc = s.client.poll(ticket)
        assert rc == -errno.ENOTCONN, f"first poll after the tier died: {rc!r}, expected -ENOTCONN"
        # nothing half-fetched is in the pool, and the reaper frees the slots
        assert probe(b, NS, 0, 8) == 0
        wait_for(lambda: b.check().returncode == 0, 20, "B's pool to pass its check after the reap")
        # a new tier adopts the table and serves
        pause.unlink()
        b.start_tier(master)
        b.wait_state("connected")
        s.client.close()
        blocks, _ = s.fetch(NS, TP, 0, 8)
        assert blocks == 8
        load_on(b, NS, 0, 8)
    except BaseException:
        print(dump_logs(work))
        raise
    finally:
        s.close()


def test_master_killed_mid_transfer_reported(cluster):
    """A master that dies while the tier makes no store call (here: between
    a request's transfer and its publish; an idle tier is the same) turns the
    tier 'disconnected' within seconds, saying why, so that schedulers stop
    asking; it showed 'connected' until its next call failed. A restarted
    master makes it 'connected' again."""
    master, host, work = cluster
    a, b, pause = written_on_a_paused_b(master, host, work, 4)
    s = Scheduler(b)
    try:
        r = s.client.request(s.keys(NS, TP, 0, 4), 4, TP)
        assert r is not None, s.client.last
        wait_for(pause.exists, 30, "B's tier to hold the fetched shards unpublished")
        master.kill()
        t0 = time.monotonic()
        for h in (a, b):  # A idle, B inside its request
            st = h.wait_state("disconnected", 5)
            assert "refuses connections" in st["message"], st
        assert time.monotonic() - t0 < 5
        assert json_status(b)["tier"]["state"] == "disconnected"  # what `umbp tier --status` says
        with pytest.raises(RuntimeError, match="disconnected|not connected"):
            s.fetch(NS, TP, 100, 4)  # refused at once, not sent to a tier without a master
        master.start()
        a.wait_state("connected", 60)
    except BaseException:
        print(dump_logs(work))
        raise
    finally:
        s.close()
        b.kill_tier()  # paused for ever by the test hook


def test_transfer_mooncake_gave_up_on_keeps_its_slots(cluster):
    """Mooncake's batch_get_into stops waiting for a transfer after 60 s and
    answers TRANSFER_FAIL while its transfer engine goes on with it, so the
    bytes can land later (tier_server.py, MC_MAY_STILL_RUN). Here host A's
    tier, whose segment holds the objects, is stopped while B fetches, and
    B's TCP transport waits for A longer than Mooncake's 60 s (its deadlines
    for a status frame and for payload progress, 30 s each by default, at
    600 s: a transfer that still makes progress is never cut, so a slow one
    outlives the wait the same way); this test then takes every slot of B's
    pool it can get, and continues A. The late bytes must land in the slots
    B's tier holds (counted: held), never in a slot given to anyone else:
    aborted, they were this test's, and its pattern was overwritten."""
    import ctypes as C
    import sys

    from umbp import _lib as L
    from umbp import tier as T
    sys.path.insert(0, os.path.dirname(__file__))
    from worker import block_bytes
    master, host, work = cluster
    master.stop()  # A stays stopped past the master's client TTL (10 s): a longer one keeps its segment known
    master.extra = ["--client_ttl=600"]
    master.start()
    a = host("a")
    a.start_tier(master)
    a.wait_state("connected")
    store_on(a, NS, 0, 3)
    wait_for(lambda: written(a) >= 3 * TP, 30, "write-back")  # B lends no segment yet: all of it in A's
    b = host("b")
    b.start_tier(master, env={"MC_TCP_STATUS_TIMEOUT_SEC": "600", "MC_TCP_PROGRESS_TIMEOUT_SEC": "600"})
    b.wait_state("connected")
    s = Scheduler(b)
    lib, h, mine = T.lib(), C.c_void_p(), []
    try:
        assert s.fetch(NS, TP, 0, 1)[0] == 1  # B's transport has A's segment from here on
        a.tier.send_signal(signal.SIGSTOP)
        wait_for(lambda: stopped(a.tier.pid), 10, "A's tier to stop")
        assert s.client.request(s.keys(NS, TP, 1, 2), 2, TP) is not None, s.client.last
        wait_for(lambda: b.status()["stats"]["fetch_errors"] >= 2 * TP, 240,
                 "Mooncake to give up on B's transfers (after 60 s)")
        st = b.status()["stats"]
        assert st["held"] == 2 * TP and st["keys_fetched"] == TP, st
        assert "held until this tier exits" in b.tier_log.read_text()
        o = L.AttachOpts()
        lib.umbp_attach_opts_init(C.byref(o))
        L.check(lib.umbp_pool_attach(b.pool.encode(), C.byref(o), C.byref(h)), "attach")
        nsid = C.c_uint32()
        L.check(lib.umbp_ns_lookup(h, NS.encode(), C.byref(nsid)), "namespace")
        size, count = int(lib.umbp_slot_size(h)), int(lib.umbp_slot_count(h))
        buf = (C.c_uint32 * count)()
        while (got := lib.umbp_reserve_bulk(h, -1, nsid.value, count, buf)) > 0:
            mine += buf[:got]
        assert len(mine) == count - 2 * TP, (len(mine), count)
        for sl in mine:
            C.memset(lib.umbp_slot_ptr(h, sl), 0x5A, size)
        a.tier.send_signal(signal.SIGCONT)
        want = [block_bytes(NS, r, bid, size) for bid in (1, 2) for r in range(TP)]

        def landed():
            have = {C.string_at(lib.umbp_slot_ptr(h, sl), size) for sl in range(count)}
            return all(w in have for w in want)
        wait_for(landed, 60, "the transfers Mooncake gave up on to land once A continues", 0.2)
        hit = [sl for sl in mine if C.string_at(lib.umbp_slot_ptr(h, sl), size) != b"\x5a" * size]
        assert not hit, f"late bytes overwrote slots {hit}, given to this test after the tier let them go"
        b.kill_tier(signal.SIGTERM)
        assert f"leaving {2 * TP} held slots to the pool's reaper" in b.tier_log.read_text()
    except BaseException:
        print(dump_logs(work))
        raise
    finally:
        if a.tier is not None and a.tier.poll() is None:
            a.tier.send_signal(signal.SIGCONT)
        s.close()
        if h.value:
            lib.umbp_pool_detach(h)  # gives this test's reservations back
    wait_for(lambda: b.check().returncode == 0, 20, "B's pool to pass its check after the reap")


def test_store_refuses_puts(cluster):
    master, host, work = cluster
    # a store of 2 x 16 MiB segments (Mooncake's smallest); host A publishes 40 MiB
    a = host("a", capacity="64MiB", slot_size="256KiB")
    b = host("b", capacity="64MiB", slot_size="256KiB")
    a.start_tier(master, "--global-segment-size", "16MiB")
    b.start_tier(master, "--global-segment-size", "16MiB")
    a.wait_state("connected")
    b.wait_state("connected")
    s = Scheduler(b)
    try:
        store_on(a, NS, 0, 80)
        wait_for(lambda: (lambda st: st["wb_written"] + st["wb_errors"] + st["wb_skipped"] >= 160)(
            a.status()["stats"]), 30, "every put answered")
        st = a.status()["stats"]
        # the store refused puts (it then evicts by itself, so retried ones may fit)
        assert st["wb_refused"] > 0, st
        load_on(a, NS, 0, 80)  # host A's engines never noticed
        blocks, _ = s.fetch(NS, TP, 0, 80)
        assert 0 <= blocks <= 80  # whatever the store kept, from the front
        if blocks:
            load_on(b, NS, 0, blocks)
        assert a.status()["state"] == "connected"
        for h in (a, b):
            c = h.check()
            assert c.returncode == 0, c.stdout + c.stderr
    except BaseException:
        print(dump_logs(work))
        raise
    finally:
        s.close()


def test_master_stopped_requests_bounded(cluster):
    """A master that stops answering (SIGSTOP: a slow one, at the limit) holds
    no request past its deadline; the pool serves locally meanwhile."""
    master, host, work = cluster
    a, b = host("a"), host("b")
    a.start_tier(master)
    b.start_tier(master)
    a.wait_state("connected")
    b.wait_state("connected")
    store_on(a, NS, 0, 4)
    wait_for(lambda: written(a) >= 4 * TP, 30, "write-back")
    s = Scheduler(b, timeout_ms=800)
    try:
        master.proc.send_signal(signal.SIGSTOP)
        wait_for(lambda: stopped(master.proc.pid), 10, "the master's threads to stop")
        t0 = time.monotonic()
        try:
            blocks, secs = s.fetch(NS, TP, 0, 4, timeout=10)
        except RuntimeError:
            blocks, secs = -errno.ENOTCONN, time.monotonic() - t0
        assert blocks in (-errno.ETIMEDOUT, -errno.ENOTCONN), blocks
        # the deadline (0.8 s), not the master (stopped until SIGCONT below),
        # bounds the wait: a liveness bound, with a margin a loaded 2-core
        # machine keeps (it was 0.2 s), far below the 10 s the fetch allows
        assert secs < 0.8 + 2.2, f"the request ended after {secs:.2f} s: expected its 0.8 s deadline to end it"
        store_on(b, NS, 50, 4)  # the local pool works meanwhile
        load_on(b, NS, 50, 4)
        master.proc.send_signal(signal.SIGCONT)
        def fetched():
            try:
                return s.fetch(NS, TP, 0, 4, timeout=10)[0] == 4
            except RuntimeError:
                return False
        wait_for(fetched, 60, "B to bring the prefix in once the master answers again", 0.2)
        load_on(b, NS, 0, 4)
        for h in (a, b):
            c = h.check()
            assert c.returncode == 0, c.stdout + c.stderr
    except BaseException:
        master.proc.send_signal(signal.SIGCONT)
        print(dump_logs(work))
        raise
    finally:
        s.close()


def test_writeback_evict_policy(cluster):
    """--writeback evict holds published blocks until the pool runs short of
    free slots, then writes the oldest first; B can then fetch them."""
    master, host, work = cluster
    a, b = host("a"), host("b")  # 256 slots each
    a.start_tier(master, "--writeback", "evict", "--evict-free-pct", "30")
    b.start_tier(master)
    a.wait_state("connected")
    b.wait_state("connected")
    try:
        store_on(a, NS, 0, 8)  # 16 of 256 slots: plenty free
        wait_for(lambda: a.status()["stats"]["wb_queued"] >= 16, 10, "A's tier to queue the blocks")
        time.sleep(0.5)
        assert written(a) == 0  # held back
        store_on(a, NS, 1000, 100)  # 216 of 256 slots used: fewer than 30% free
        wait_for(lambda: written(a) >= 16, 30, "A's tier to write under pressure")
        s = Scheduler(b)
        try:
            assert s.fetch(NS, TP, 0, 8)[0] == 8  # the oldest went first
        finally:
            s.close()
        load_on(b, NS, 0, 8)
    except BaseException:
        print(dump_logs(work))
        raise


def test_stop_bounded_while_mooncake_holds_the_tier(cluster):
    """SIGTERM stops a tier within its grace (5 s) even while a Mooncake call
    holds it: Mooncake's Python calls keep the GIL, so while its setup retries
    a master that is not there (about 85 s) no Python code of the tier runs,
    its signal handler included. A healthy tier still stops cleanly (exit 0)."""
    master, host, work = cluster
    a = host("a")
    a.start_tier(master, "--master", f"127.0.0.1:{free_port()}")  # nothing listens there
    try:
        a.wait_state("connecting")
        time.sleep(1)  # inside Mooncake's setup
        t0 = time.monotonic()
        a.tier.send_signal(signal.SIGTERM)
        rc = a.tier.wait(30)
        secs = time.monotonic() - t0
        # the grace (5 s) then SIGKILL bounds the stop: a liveness bound, with
        # a margin a loaded 2-core machine keeps (it was 3 s), far below the
        # ~85 s Mooncake's setup would hold an unbounded stop
        assert secs < 5 + 5, f"the tier stopped {secs:.1f} s after SIGTERM: expected its 5 s grace, then SIGKILL"
        assert rc == -signal.SIGKILL, rc
        assert "ending it with SIGKILL" in a.tier_log.read_text()
        wait_for(lambda: a.check().returncode == 0, 20, "A's pool to pass its check after the reap")
        a.start_tier(master)
        a.wait_state("connected")
        # a healthy tier stops by itself within its grace: exit 0, where one
        # still running after the 5 s grace is ended with SIGKILL (-9); the
        # exit status is the event (a "< 5 s" bound said the same, by clock)
        a.tier.send_signal(signal.SIGINT)
        rc = a.tier.wait(30)
        assert rc == 0, f"SIGINT: exit {rc}, expected 0 (stopped cleanly within its 5 s grace)"
        assert a.tier_log.read_text().rstrip().endswith("stopped")
    except BaseException:
        print(dump_logs(work))
        raise


def test_pool_destroyed_under_tier(cluster):
    """A tier whose pool is destroyed (`umbp pool destroy`) stops, exit 1,
    saying so, rather than keep the dead pool's memory mapped and its store
    segment lent while serving nobody."""
    master, host, work = cluster
    a = host("a")
    a.start_tier(master)
    try:
        a.wait_state("connected")
        a.close_daemon()  # stops the daemon and destroys the pool
        assert a.tier.wait(10) == 1
        assert "was destroyed" in a.tier_log.read_text()
    except BaseException:
        print(dump_logs(work))
        raise


def test_sighup_reopens_the_log(cluster):
    """SIGHUP opens --log FILE again (logrotate's rename, then a signal, as
    for umbp daemon); it neither stops nor kills the tier."""
    master, host, work = cluster
    a = host("a")
    log = work / "tier-a-own.log"
    a.start_tier(master, "--log", str(log))
    try:
        a.wait_state("connected")
        log.rename(work / "tier-a-own.log.1")
        a.tier.send_signal(signal.SIGHUP)
        wait_for(lambda: log.exists() and "opened again" in log.read_text(), 10, "the tier to open its log again")
        assert a.tier.poll() is None
        a.wait_state("connected")
        a.tier.send_signal(signal.SIGTERM)
        assert a.tier.wait(10) == 0
        assert log.read_text().rstrip().endswith("stopped")
    except BaseException:
        print(dump_logs(work))
        raise


def test_feed_name_taken(cluster):
    """A tier that cannot open the published-key feed (its consumer name
    'tier' held by another live process) exits 1 with the library's reason
    and what to do, not a traceback; a tier started once the name is free
    serves the pool."""
    import ctypes as C
    import subprocess
    import sys
    from umbp import tier as T
    master, host, work = cluster
    a = host("a")
    s = Scheduler(a)
    f = C.c_void_p()
    assert T.lib().umbp_feed_open(s.h, b"tier", None, C.byref(f)) == 0, T.last_error()
    try:
        r = subprocess.run([TOOL, "tier", a.pool, "--master", master.addr, "--global-segment-size", "16MiB"],
                           capture_output=True, text=True, timeout=60, env=dict(os.environ, UMBP_PYTHON=sys.executable))
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        assert f"held by pid {os.getpid()}" in r.stderr and "end it first" in r.stderr, r.stderr
    finally:
        T.lib().umbp_feed_close(f)
        s.close()
    a.start_tier(master)  # with the name free, a tier serves the pool
    a.wait_state("connected")


def test_setup_raises(cluster):
    """A Mooncake setup that raises (std::bad_alloc for a --local-buffer-size
    this host cannot allocate) is a failed setup, said in the tier's state and
    log with the sizes to fix, and tried again; the connection thread does not
    die leaving the tier 'connecting' for ever."""
    master, host, work = cluster
    a = host("a")
    a.start_tier(master, "--local-buffer-size", "1TiB", "--global-segment-size", "16MiB")
    try:
        st = a.wait_state("disconnected", 20)
        assert "MemoryError" in st["message"] and "--local-buffer-size" in st["message"], st
        assert "Traceback" not in a.tier_log.read_text()
        a.tier.send_signal(signal.SIGTERM)
        assert a.tier.wait(10) == 0
    except BaseException:
        print(dump_logs(work))
        raise


def _foreground_but_nohup():
    """preexec_fn: SIGINT and SIGQUIT at their defaults, as in a shell's foreground, and SIGHUP
    ignored, as under nohup."""
    for s in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(s, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)


@pytest.mark.parametrize("sig,ignore_hup", [(signal.SIGTERM, False), (signal.SIGHUP, False), (signal.SIGINT, False),
                                            (signal.SIGQUIT, False), (signal.SIGTERM, True)])
def test_bench_stopped_by_signal(tmp_path, sig, ignore_hup):
    """`umbp bench tier` stopped by a signal (kill, a closed terminal, Ctrl-C,
    Ctrl-\\) stops the mooncake_master and the tiers it started and destroys
    its pools, then exits 128 + the signal with a sentence, not a traceback.
    Started with SIGHUP ignored (nohup), a SIGHUP does not stop it (it did: the
    bench installed its handler over the ignored disposition)."""
    import glob
    import subprocess
    import sys
    bench = subprocess.Popen([TOOL, "bench", "tier", "--sizes", "64KiB", "--prefix", "4", "--reps", "100000000",
                              "--engine", "off"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, UMBP_PYTHON=sys.executable),
                             # as from a shell's foreground, whatever ran this test (CI under nohup):
                             # SIGINT, SIGQUIT and SIGHUP not ignored unless the case is nohup's
                             preexec_fn=_foreground_but_nohup if ignore_hup else
                             lambda: [signal.signal(s, signal.SIG_DFL)
                                      for s in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)])

    def children():
        try:
            with open(f"/proc/{bench.pid}/task/{bench.pid}/children") as f:
                return [int(p) for p in f.read().split()]
        except OSError:
            return []
    try:
        # the master and both tiers are up, and the repetitions run
        kids = wait_for(lambda: len(children()) >= 3 and children(), 60, "the bench's master and tiers")
        time.sleep(2)
        if ignore_hup:
            bench.send_signal(signal.SIGHUP)
            time.sleep(2)
            assert bench.poll() is None, "a SIGHUP ignored at the start stopped the bench (exit %r)" % bench.returncode
        bench.send_signal(sig)
        _, err = bench.communicate(timeout=40)
        assert bench.returncode == 128 + sig, (bench.returncode, err[-2000:])
        assert f"stopped by {signal.Signals(sig).name}" in err and "Traceback" not in err, err[-2000:]
        for pid in kids:
            assert not os.path.exists(f"/proc/{pid}") or open(f"/proc/{pid}/stat").read().split()[2] == "Z", pid
        assert not glob.glob(f"/dev/shm/umbp.bench-tier-*-{bench.pid}-*"), glob.glob("/dev/shm/umbp.bench-tier-*")
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()


def descendants(pid: int) -> list[int]:
    """pid's children, theirs, and so on (from /proc), at this moment."""
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/task/{p}/children") as f:
                kids = [int(k) for k in f.read().split()]
        except OSError:
            kids = []
        out += kids
        todo += kids
    return out


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_bench_killed(tmp_path):
    """`umbp bench tier` killed with SIGKILL (the OOM killer, a CI timeout):
    the mooncake_master and the tiers it started die with it, within seconds
    (they ran on before, the master holding its port and the tiers their
    pools), and `umbp pool gc` removes the pools it had made."""
    import glob
    import subprocess
    import sys
    bench = subprocess.Popen([TOOL, "bench", "tier", "--sizes", "64KiB", "--prefix", "4", "--reps", "100000000",
                              "--engine", "off"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env=dict(os.environ, UMBP_PYTHON=sys.executable))
    def pools() -> list[str]:  # the pools' names, without their .feed and .tier files
        return sorted(p.split("/umbp.", 1)[1] for p in glob.glob(f"/dev/shm/umbp.bench-tier-*-{bench.pid}-*")
                      if not p.endswith((".feed", ".tier")))
    kids: list[int] = []
    try:
        # the master and both tiers are up (with their watchdogs), and the repetitions run
        wait_for(lambda: len(descendants(bench.pid)) >= 5 and len(pools()) == 2, 60,
                 "the bench's master, tiers and pools")
        time.sleep(1)
        kids = descendants(bench.pid)
        names = pools()
        bench.kill()
        bench.wait()
        wait_for(lambda: all(gone(p) for p in kids), 10, "the bench's master and tiers to die with it")
        r = subprocess.run([TOOL, "pool", "gc", *names], capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        for n in names:
            assert f"removed embedded pool {n} (a umbp bench tier run, created by pid {bench.pid};" in r.stdout, \
                r.stdout
            assert not os.path.exists(f"/dev/shm/umbp.{n}") and not os.path.exists(f"/dev/shm/umbp-notes.{n}"), n
        assert not pools(), pools()
    finally:
        if bench.poll() is None:
            bench.kill()
            bench.wait()
        for p in kids:  # what the old code left running: only the processes this bench started
            if not gone(p):
                os.kill(p, signal.SIGKILL)
        for n in pools():
            subprocess.run([TOOL, "pool", "destroy", n, "--force"], capture_output=True)
            if os.path.exists(f"/dev/shm/umbp-notes.{n}"):
                os.unlink(f"/dev/shm/umbp-notes.{n}")


def test_second_tier_refused(cluster):
    """A second tier on a served pool, even one whose tier is stopped
    (SIGSTOP), exits 1 naming the serving pid and what to do; the first
    tier serves on."""
    import subprocess
    import sys
    master, host, work = cluster
    a = host("a")
    a.start_tier(master)
    a.wait_state("connected")
    for stop in (False, True):
        if stop:
            a.tier.send_signal(signal.SIGSTOP)
        try:
            r = subprocess.run([TOOL, "tier", a.pool, "--master", master.addr, "--global-segment-size", "16MiB"],
                               capture_output=True, text=True, timeout=60,
                               env=dict(os.environ, UMBP_PYTHON=sys.executable))
            # the --status the message points at says the tier is stopped, and how to continue it (it read
            # 'connected (pid N, alive)', as for a tier that serves)
            if stop:
                wait_for(lambda: stopped(a.tier.pid), 10, "the tier to stop")
            st = subprocess.run([TOOL, "tier", a.pool, "--status"], capture_output=True, text=True, timeout=60,
                                env=dict(os.environ, UMBP_PYTHON=sys.executable))
            js = json_status(a)
            want = f"kill -CONT {a.tier.pid}"
            if stop:
                assert "stopped (SIGSTOP" in st.stdout and want in st.stdout and ": stopped," in st.stdout, st.stdout
                assert js["tier"]["stopped"] and js["feed"]["consumers"][0]["stopped"], js
            else:
                assert "alive)" in st.stdout and "stopped" not in st.stdout, st.stdout
                assert not js["tier"]["stopped"] and not js["feed"]["consumers"][0]["stopped"], js
        finally:
            a.tier.send_signal(signal.SIGCONT)
        assert r.returncode == 1, r.stderr
        assert f"pid {a.tier.pid}" in r.stderr and "--status" in r.stderr and "SIGTERM" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr, r.stderr
    a.wait_state("connected")


def test_status_of_a_table_another_user_cannot_read(cluster):
    """--status by a user who may read the pool but not the tier's table
    (its files keep the mode they were made with when the pool's is changed)
    names the table and the permission, exit 1; it said 'no tier has served
    it (start: umbp tier POOL)', and that start is refused: a tier serves."""
    import shutil
    import subprocess
    if os.geteuid() != 0 or not shutil.which("setpriv") or not os.access("/usr/bin/python3", os.X_OK):
        pytest.skip("needs root, setpriv and /usr/bin/python3 to run --status as another user")
    master, host, work = cluster
    a = host("a")
    a.start_tier(master)
    a.wait_state("connected")
    os.chmod(f"/dev/shm/umbp.{a.pool}", 0o644)  # the pool readable by all; its .tier and .feed stay 0600
    r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", TOOL, "tier", a.pool,
                        "--status"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, UMBP_PYTHON="/usr/bin/python3"))
    assert r.returncode == 1 and "no tier has served" not in r.stdout + r.stderr, (r.returncode, r.stdout, r.stderr)
    assert "cannot open its tier table: Permission denied" in r.stderr and "tier's user" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr, r.stderr


def test_log_reader_gone(cluster):
    """The tier's stderr a pipe whose reader went away (a log collector
    restarted; or --log on a full disk): its log lines are lost, nothing else.
    The connection thread died on the first line it wrote (BrokenPipeError),
    and the tier read 'connected' to a master that had been killed, and after
    its restart, for good; SIGTERM then exited 1."""
    import subprocess
    import sys
    master, host, work = cluster
    a = host("a")
    a.tier = subprocess.Popen([TOOL, "tier", a.pool, "--master", master.addr, "--global-segment-size", "16MiB"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              env=dict(os.environ, UMBP_PYTHON=sys.executable))
    try:
        assert b"serving pool" in a.tier.stderr.readline()
        a.wait_state("connected")
        a.tier.stderr.close()  # the reader goes away
        master.kill()
        a.wait_state("disconnected", 30)
        master.start()
        a.wait_state("connected", 60)
        a.tier.send_signal(signal.SIGTERM)
        assert a.tier.wait(20) == 0
    except BaseException:
        print(dump_logs(work))
        raise


def test_signal_while_starting(cluster):
    """SIGINT (Ctrl-C) or SIGTERM at any moment of the tier's start ends it
    without a traceback: exit 0 from main() on, 130 for a SIGINT before (as a
    shell shows a C command's death by it), or death by the signal before
    Python set a handler. It was a KeyboardInterrupt traceback before run() set its
    handlers, and inside Mooncake's import "the Mooncake Store client is not
    importable ... pip install" (exit 1)."""
    import subprocess
    import sys
    master, host, work = cluster
    a = host("a")
    seen = set()
    for k in range(14):
        sig = signal.SIGINT if k % 2 == 0 else signal.SIGTERM
        p = subprocess.Popen([TOOL, "tier", a.pool, "--master", master.addr, "--global-segment-size", "16MiB"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             env=dict(os.environ, UMBP_PYTHON=sys.executable))
        time.sleep(0.03 * k)
        p.send_signal(sig)
        err = p.communicate(timeout=30)[1]
        # death by the signal itself: it came while the C umbp ran, before it exec'd Python
        ok = (0, 130, -signal.SIGINT) if sig == signal.SIGINT else (0, -signal.SIGTERM)
        assert p.returncode in ok and "Traceback" not in err and "not importable" not in err, \
            (0.03 * k, sig, p.returncode, err[-1500:])
        seen.add(p.returncode)
    print(f"exit statuses seen: {sorted(seen)}")


def test_pool_destroyed_while_a_request_waits_on_a_stopped_master(cluster):
    """The pool destroyed while the tier's main thread is inside a fetch's
    call to a stopped master: the tier still stops, exit 1, within seconds.
    It checked for the destroy only between requests, and stayed (25 s and
    more, as long as the master stayed stopped) holding the destroyed pool's
    memory; a second thread now makes the check and ends it."""
    master, host, work = cluster
    a = host("a")
    a.start_tier(master)
    try:
        a.wait_state("connected")
        s = Scheduler(a, timeout_ms=800)
        master.proc.send_signal(signal.SIGSTOP)  # the request below reaches the master before the tier's
        try:                                      # once-a-second health check marks it gone
            try:
                s.fetch(NS, TP, 0, 4, timeout=10)  # ends at its deadline; the tier's call does not
            except (RuntimeError, AssertionError):
                pass
            s.close()
            a.close_daemon()  # stops the daemon and destroys the pool
            t0 = time.monotonic()
            try:
                rc = a.tier.wait(30)
            except Exception:
                rc = "still running 30 s after the destroy"
            secs = time.monotonic() - t0
        finally:
            master.proc.send_signal(signal.SIGCONT)
        assert rc == 1, rc
        assert secs < 10, f"the tier stopped {secs:.1f} s after the destroy"  # 1.5 s nominal
        assert "was destroyed" in a.tier_log.read_text()
    except BaseException:
        print(dump_logs(work))
        raise


def test_pool_destroyed_while_master_stopped(cluster):
    """The pool destroyed under a tier whose write-back is inside a call to a
    stopped master: the tier still stops, exit 1, within its 10 s join of that
    thread, and never touches the handles it let go of. It waited in
    Mooncake's close for as long as the master stayed stopped, and once the
    master went on, the write-back thread unpinned through the detached pool:
    SIGSEGV."""
    master, host, work = cluster
    a = host("a")
    a.start_tier(master)
    try:
        a.wait_state("connected")
        master.proc.send_signal(signal.SIGSTOP)
        try:
            store_on(a, NS, 0, 8)  # write-back asks the stopped master, and waits
            time.sleep(1.5)
            a.close_daemon()  # stops the daemon and destroys the pool
            try:
                rc = a.tier.wait(30)
            except Exception:
                rc = "still running 30 s after the destroy"
        finally:
            master.proc.send_signal(signal.SIGCONT)
        if rc != 1:
            try:
                rc = f"{rc}; then {a.tier.wait(30)} once the master went on"
            except Exception:
                pass
        assert rc == 1, rc
        log = a.tier_log.read_text()
        assert "was destroyed" in log and "still inside a Mooncake call" in log, log[-2000:]
    except BaseException:
        print(dump_logs(work))
        raise
