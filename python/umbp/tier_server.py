# SPDX-License-Identifier: Apache-2.0
"""``umbp tier``: the host's pool as a tier in front of a Mooncake Store.

One process per host, beside the pool's daemon. Three threads:

- the **request loop** (main thread) sleeps on the request table's doorbell
  (include/umbp/tier.h), takes a scheduler's request for a missing prefix,
  reserves pool slots for the shards the pool lacks and has the store write
  them straight into the slots (``batch_get_into`` into the registered pool
  arena: no staging copy; when the pool is short of free slots it first asks
  the store which exist, ``batch_is_exist``, so as to evict nothing for a
  prefix that is nowhere), publishes every shard of a block only once all of
  that block's shards arrived whole, and answers with the number of leading
  blocks now in the pool on every rank. A shard that fails or arrives short
  is never published; its slot goes back to the pool, except one whose
  transfer Mooncake gave up on and may still land (held until the tier
  exits: MC_MAY_STILL_RUN; past HELD_MAX_FRACTION of the pool's slots held,
  the tier stops, so that the kernel ends those transfers and the pool's
  reaper frees the slots).
- the **write-back thread** reads the pool's published-key feed (feed.h) as
  consumer "tier", queues keys published by other processes (bounded: the
  oldest are dropped and counted) and writes them in batches straight from
  their pinned slots into the store (``batch_put_from``), skipping keys the
  store already holds. Policy ``all`` writes every block; ``evict`` holds
  them until the pool's free slots fall below --evict-free-pct and then
  writes the oldest first (the ones CLOCK is about to evict); ``off`` writes
  nothing. Its feed cursor is committed only past written (or dropped) keys,
  so a restarted tier re-reads what it had not written yet.
- the **connection thread** sets the store client up (Mooncake's setup
  retries for about 85 s against an unreachable master, so it runs here),
  probes it every second while it is unhealthy, checks every second while it
  is healthy that the master's port still takes a TCP connection (a master
  that died is reported even while no store call would notice), and
  publishes the tier's state in the table. Schedulers only send requests while the state is
  ``connected``; a request that fails with an RPC error marks the tier
  ``disconnected`` at once, and the probe marks it ``connected`` again when
  the master answers (a restarted master re-learns this client's segment by
  itself). A client that stays unhealthy for --reconnect-after-s is replaced
  by a fresh one.

Nothing here can hold an engine: requests carry deadlines that the scheduler's
own poll enforces, and everything the tier holds in the pool (reservations,
pins) is released by the pool's reaper if the tier is killed.
"""
from __future__ import annotations

import argparse
import collections
import ctypes as C
import errno
import ipaddress
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from . import _lib as L
from . import tier as T
from ._lib import UMBP_NAME_MAX

# Mooncake's codes (mooncake-store/include/types.h)
MC_NO_AVAILABLE_HANDLE = -200  # the store has no room
MC_OBJECT_NOT_FOUND = -704
MC_OBJECT_ALREADY_EXISTS = -705
MC_LEASE_EXPIRED = -707
MC_TRANSFER_FAIL = -800
MC_RPC_FAIL = -900
_UNREACHABLE = {MC_RPC_FAIL}
# A get or put that Mooncake answers TRANSFER_FAIL may still be running, and
# writing into (get) or reading from (put) the slot it was given: Mooncake
# stops waiting for a transfer after 60 s, or when it cannot read a task's
# status (mooncake-store/src/transfer_task.cpp,
# TransferEngineOperationState::wait_for_completion and check_task_status),
# and returns while the transfer engine goes on with the batch
# (Transport::freeBatchID refuses to free a batch whose tasks are not done).
# The TCP transport only cuts a transfer that makes no progress for 30 s
# (MC_TCP_PROGRESS_TIMEOUT_SEC; older ones never), so a slow one goes on and
# moves its bytes after the call returned, at any time while this process
# lives. Such slots are held (hold()) until the tier exits, never
# aborted, unpinned or published. Every other result is given only before the
# transfer was submitted or once it finished (Client::BatchGet and
# Client::WaitForTransfers wait on every submitted transfer's future).
MC_MAY_STILL_RUN = MC_TRANSFER_FAIL
# A tier holding more than this share of the pool's slots stops (exit 1): held
# slots are capacity no engine can use until the tier exits, and a peer that
# keeps stalling would otherwise take the pool a batch at a time.
HELD_MAX_FRACTION = 0.25
PUT_TRIES = 3  # a put the store refuses is tried again 1 s and 2 s later, then counted in wb_errors
# Test hook (tests/cluster): after the transfer into reserved slots and before
# publishing them, create this file and stop, so that a test can kill the tier
# "mid-transfer" at a known point.
_PAUSE_BEFORE_PUBLISH = os.environ.get("UMBP_TIER_TEST_PAUSE_BEFORE_PUBLISH")

# Seconds a SIGTERM or SIGINT gives the tier to stop cleanly before it is ended
# with SIGKILL. Mooncake's Python calls hold the GIL for their whole length
# (its setup retries an unreachable master for about 85 s, an RPC to a stopped
# master waits 30 s), and while they do no Python code runs in any thread of
# the tier, its signal handler included. So the bound is kept by a watchdog
# process that needs no GIL: Python's C-level handler writes each signal's
# number to a pipe (signal.set_wakeup_fd) whose read end the watchdog holds;
# after SIGTERM or SIGINT it waits this long for the pipe's write end to close
# (the tier exited), else it logs why and sends SIGKILL. A killed tier is a
# case the design covers: the pool's reaper frees its reservations and pins.
STOP_GRACE_S = 5.0
_WATCHDOG = r'''
import os, select, signal, sys, time
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)  # Ctrl-C reaches the process group: the watchdog outlives it
pid, grace, log = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
while True:
    b = os.read(0, 64)
    if not b:
        sys.exit(0)  # the tier exited
    if signal.SIGTERM in b or signal.SIGINT in b:
        break
end = time.monotonic() + grace
while True:
    left = end - time.monotonic()
    if left <= 0:
        break
    if select.select([0], [], [], left)[0] and not os.read(0, 64):
        sys.exit(0)  # the tier exited within its grace
msg = (time.strftime("%Y-%m-%d %H:%M:%S ") + f"umbp tier[{pid}]: still inside a Mooncake call {grace:g} s after "
       "the signal (an unreachable or stopped master holds it, and with it the whole tier): ending it with SIGKILL; "
       "the pool's reaper frees the slots it held\n")
try:
    f = open(log, "a") if log else sys.stderr
    f.write(msg)
    f.flush()
except OSError:
    pass
try:
    os.kill(pid, signal.SIGKILL)
except OSError:
    pass
'''

DESCRIPTION = """\
Keep this host's umbp pool in front of a Mooncake Store shared by several
hosts, so that a prefix computed on one host is a hit on another.

Blocks published in the pool are written to the store (write-back), keyed by
their pool key with the namespace named by its name, which every host derives
alike from model, revision, layout and ranks. When a scheduler's probe
misses part of a prompt, the connector (kv_connector_extra_config
{"tier": true}) asks this tier through a request table in shared memory
beside the pool (/dev/shm/umbp.POOL.tier; no RPC from the scheduler); the
tier brings every rank's shard of the blocks the store holds into the pool as
ordinary published blocks, straight from the store into the pool's slots,
and answers. Requests are bounded by a deadline (--timeout-ms) that the
scheduler enforces itself: a stopped, slow or killed tier, or an unreachable
master, never holds an engine longer than that, and the pool keeps working at
local speed.

The tier lends --global-segment-size bytes of this host's memory to the
store (Mooncake keeps objects in the segments its clients lend). Every host
that shares a store must use the same --key-prefix and pools of the same slot
size. Run one tier per pool, beside its daemon (umbp daemon POOL)."""

EPILOG = """\
faults:
  master unreachable, restarted or slow
                   state 'disconnected' within one failed call, or within
                   about a second of a master whose port refuses connections
                   (it died; an idle tier notices too); schedulers stop
                   asking (their probes answer from the local pool alone);
                   write-back keeps queueing (bounded) and resumes when a probe
                   succeeds. Objects a restarted master forgot are simply misses.
  tier killed      schedulers' pending requests end at once (-ENOTCONN) or at
                   their deadline; the pool's reaper frees the slots the tier
                   had reserved or pinned: no half-fetched block is ever
                   published. A restarted tier adopts the request table and
                   resumes the feed at its last committed position.
  store full       a put the store refuses (NO_AVAILABLE_HANDLE) is tried again 1 s
                   and 2 s later, then counted (wb_errors) and dropped; nothing
                   else changes.

files:
  /dev/shm/umbp.POOL.tier   request table (created by the tier, kept for its successor)
  /dev/shm/umbp.POOL.feed   published-key feed (created by the first consumer)
  both are removed by 'umbp pool destroy POOL'.

signals:
  SIGTERM, SIGINT stop the tier (exit status below); SIGHUP opens --log FILE
  again (after logrotate renamed it), as umbp daemon does.

exit status:
  0 stopped by SIGTERM or SIGINT (within 5 s; a tier still inside a Mooncake
  call then, held by an unreachable or stopped master, is ended with SIGKILL
  and says so in its log: 137 in a shell, the pool's reaper frees what it
  held); 1 runtime error (no such pool, the pool destroyed under the running
  tier, more than a quarter of the pool's slots held for transfers Mooncake
  gave up on, a tier already serves it, Mooncake not installed, a --log file that
  cannot be opened, a bad --config file, a --global-segment-size larger than
  this host's memory); 2 usage error (a bad option or value, an empty value,
  a --master that is neither HOST:PORT nor an HA master's etcd://,
  redis:// or k8s:// URL, a pool name outside
  [A-Za-z0-9._-]{1,64} or starting with '-', --json without --status, a
  request table, --records x --keys-per-record keys of 48 bytes, and a feed,
  --feed-capacity entries of 64, that /dev/shm has no room for); 130 a
  Ctrl-C before the tier's Python is running.

sizes:
  whole bytes, or a number with B, KiB, MiB, GiB, TiB (K/KB, M/MB, G/GB, T/TB
  are binary too): 1GiB, 1.5MiB, 4096. Never negative.

examples:
  mooncake_master --rpc_port 50051 &                      # once, on any host
  umbp daemon kv --capacity 64GiB &
  umbp tier kv --master 10.0.0.5:50051 --local-hostname 10.0.0.7
  umbp tier kv --config mooncake.json                     # Mooncake's JSON (MOONCAKE_CONFIG_PATH)
  umbp tier kv --status                                   # state, counters, feed lag
  umbp tier kv --writeback evict --evict-free-pct 10      # write only blocks about to go

See docs/cluster.md for the deployment picture and when to use it."""


_U32_MAX = (1 << 32) - 1


def parse_size(s: str) -> int:
    """Bytes by the C CLI's rule (_lib.parse_size), as argparse wants a
    refusal: argparse.ArgumentTypeError with the value and the fix."""
    try:
        return L.parse_size(s)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def segment_size(s: str) -> int:
    v = parse_size(s)
    if 0 < v < 16 << 20:
        raise argparse.ArgumentTypeError(f"'{s}' is {v} bytes: Mooncake lends segments of 16MiB or more; "
                                         "use 0 (lend none) or at least 16MiB")
    return v


def positive(s: str) -> int:
    """A whole number from 1 to 2^32-1: --records, --keys-per-record,
    --timeout-ms and --feed-capacity go into uint32 fields, where ctypes
    would wrap a larger value silently; the other counts share the bound."""
    try:
        v = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{s}' is not a whole number: use 1 to {_U32_MAX}") from None
    if not 0 < v <= _U32_MAX:
        raise argparse.ArgumentTypeError(f"'{s}' is out of range: use 1 to {_U32_MAX}")
    return v


def at_most(hi: int, why: str):
    """positive(), bounded by what the library takes (its own refusal would
    come only after the tier attached the pool and imported Mooncake, as a
    runtime error)."""
    def check(s: str) -> int:
        v = positive(s)
        if v > hi:
            raise argparse.ArgumentTypeError(f"'{s}' is out of range: use 1 to {hi} ({why})")
        return v
    return check


def percent(s: str) -> float:
    """A share of the pool's slots: above 0 (0 would never write) and at most 100."""
    try:
        v = float(s)
    except ValueError:
        v = math.nan
    if not (math.isfinite(v) and 0 < v <= 100):
        raise argparse.ArgumentTypeError(f"'{s}' is not a percentage: use a number above 0 and at most 100, "
                                         "e.g. 15")
    return v


# The URL forms Mooncake's client takes for a master (an HA master found
# through its backend: Client::ConnectToMaster, ParseHABackendSpec); whether a
# build has the backend is Mooncake's to say (PyPI's wheel has etcd).
MASTER_URL_SCHEMES = ("etcd", "redis", "k8s")


def master_error(addr: str) -> str | None:
    """Why ADDR cannot be a master's address, or None. HOST:PORT, port 1 to
    65535, or an HA URL, SCHEME://... with a scheme of MASTER_URL_SCHEMES,
    which passes to Mooncake as it is: a typo such as a missing port, or a
    URL of another scheme (http://HOST:PORT, which Mooncake calls an
    'Invalid HA backend entry'), otherwise reached Mooncake, whose setup then
    failed again and again, for ever, saying only its code."""
    if "://" in addr:
        scheme, _, rest = addr.partition("://")
        if scheme in MASTER_URL_SCHEMES and rest.strip():
            return None
        return (f"'{addr}' is not HOST:PORT, nor a URL of an HA master ("
                + ", ".join(f"{s}://..." for s in MASTER_URL_SCHEMES) + "): give the master's address and its "
                "--rpc_port without a scheme, e.g. 10.0.0.5:50051")
    if any(c.isspace() for c in addr):  # passed to Mooncake as written, blanks and all
        return (f"'{addr}' has a blank in it: give the master's HOST:PORT without blanks, e.g. 10.0.0.5:50051")
    host, colon, port = addr.rpartition(":")
    # ASCII digits only: '²' passes isdigit() and then failed int() with a traceback, and other scripts'
    # digits reached Mooncake as they were
    if (not colon or not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536):
        return (f"'{addr}' is not HOST:PORT with a port from 1 to 65535: give the master's address and its "
                "--rpc_port, e.g. 10.0.0.5:50051")
    # a host with a blank, or a ':' that is not an IPv6 address's ('10.0.0.5:50051:1'), is a typo that
    # Mooncake's setup tried for about 85 s at a time, for ever, holding the tier (and its SIGTERM) meanwhile
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    v6 = True
    try:
        ipaddress.IPv6Address(bare)
    except ValueError:
        v6 = False
    if (":" in bare and not v6) or (bare != host and not v6):
        return (f"'{addr}' is not HOST:PORT: '{host}' is not a host name or an address (an IPv6 one is written "
                "in brackets, [::1]:50051): give the master's address and its --rpc_port, e.g. 10.0.0.5:50051")
    return None


def pool_name_error(name: str) -> str | None:
    """Why NAME cannot name a pool, or None: the C library's rule
    (src/shm/segment.c umbp_pool_name_valid), checked here so that a bad
    name is a usage error before anything attaches or imports Mooncake. A
    leading '-' is refused too (it reads as an option; the library refuses it
    as well)."""
    if not name:
        return f"the pool name is empty: use 1 to {UMBP_NAME_MAX} characters from [A-Za-z0-9._-]"
    if len(name) > UMBP_NAME_MAX:
        return f"the pool name is {len(name)} characters long: use at most {UMBP_NAME_MAX} from [A-Za-z0-9._-]"
    for i, c in enumerate(name, 1):
        if not (c.isascii() and (c.isalnum() or c in "._-")):
            shown = c if " " <= c <= "~" else "?"
            return f"the pool name '{name}' has '{shown}' at position {i}: use only [A-Za-z0-9._-]"
    if name in (".", ".."):
        return f"the pool name '{name}' is reserved: choose another"
    if name.startswith("-"):
        return f"the pool name '{name}' starts with '-': begin it with a letter, a digit, '.' or '_'"
    return None


class UsageError(Exception):
    """A usage error: main prints it in the C commands' form and exits 2."""


def usage_error(prog: str, msg: str) -> int:
    """Print a usage error as the C commands do (tools/cli_util.c
    cli_usage_error): 'umbp: MSG' and 'Try 'PROG --help'.'; returns 2."""
    print(f"umbp: {msg}\nTry '{prog} --help'.", file=sys.stderr)
    return 2


class Parser(argparse.ArgumentParser):
    """argparse whose own errors (unknown option, missing value, a type
    function's refusal) read like the C commands' usage errors, not
    argparse's 'usage: ... error: argument ...'."""

    def print_help(self, file=None):
        # argparse's own print_help swallows a failed write (OSError), and
        # `umbp tier --help > /dev/full` exited 0 with nothing written
        (file or sys.stdout).write(self.format_help())

    def error(self, message: str):
        m = re.fullmatch(r"argument ([^:]+): (.*)", message, re.S)
        if m:
            opt, why = m.group(1).split("/")[-1], m.group(2)
            c = re.fullmatch(r"invalid choice: (.*) \(choose from (.*)\)", why, re.S)
            if c:
                message = f"{opt} {c.group(1)}: use one of {c.group(2)}"
            elif why.startswith("expected "):
                message = (f"{opt} needs a value: {opt} VALUE (a word that starts with '-' reads as an option; "
                           "no value here is negative)")
            elif why.startswith("ignored explicit argument"):
                message = f"{opt} takes no value: write {opt} alone"
            elif why.startswith("'"):
                message = f"{opt} {why}"
            else:
                message = f"{opt}: {why}"
        elif message.startswith("the following arguments are required"):
            message = f"missing the pool NAME: '{self.prog} POOL [options]'"
        elif message.startswith("unrecognized arguments: "):
            extra = message.split(": ", 1)[1]
            message = (f"unknown option '{extra}'" if extra.startswith("-") else
                       f"unexpected argument '{extra}' after the pool name: one pool per tier")
        sys.exit(usage_error(self.prog, message))


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="umbp tier", description=DESCRIPTION, epilog=EPILOG,
               formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("pool", help="the pool to serve (it must exist: umbp daemon POOL or umbp pool create)")
    p.add_argument("--status", action="store_true",
                   help="print the running tier's state, counters and feed lag, then exit")
    p.add_argument("--json", action="store_true", help="with --status: one JSON object (only with --status)")
    m = p.add_argument_group("Mooncake Store (the names in parentheses are Mooncake's own)")
    m.add_argument("--config", metavar="FILE", default=os.environ.get("MOONCAKE_CONFIG_PATH") or None,
                   help="Mooncake client JSON (as MOONCAKE_CONFIG_PATH, the default); the options below "
                        "override its keys")
    m.add_argument("--master", metavar="HOST:PORT",
                   help="master's RPC address (master_server_address); default 127.0.0.1:50051")
    m.add_argument("--metadata", metavar="URL",
                   help="metadata service (metadata_server): P2PHANDSHAKE, etcd://..., http://...; "
                        "default P2PHANDSHAKE")
    m.add_argument("--protocol", choices=("tcp", "rdma"), help="transfer protocol (protocol); default tcp")
    m.add_argument("--local-hostname", metavar="HOST",
                   help="address other hosts reach this one at (local_hostname); default 127.0.0.1, "
                        "for a trial on one machine")
    m.add_argument("--device-name", metavar="DEVS", help="RDMA devices (device_name); default none")
    m.add_argument("--global-segment-size", metavar="SIZE", type=segment_size,
                   help="memory this host lends the store (global_segment_size): 0, or 16MiB and more; "
                        "default 1GiB")
    m.add_argument("--local-buffer-size", metavar="SIZE", type=parse_size,
                   help="client staging buffer (local_buffer_size; transfers to and from the pool "
                        "bypass it); default 16MiB")
    w = p.add_argument_group("write-back")
    w.add_argument("--writeback", choices=("all", "evict", "off"), default="all",
                   help="which published blocks go to the store: all (default), evict (only once the "
                        "pool runs short of free slots, oldest first), off")
    w.add_argument("--evict-free-pct", type=percent, default=15.0, metavar="PCT",
                   help="with --writeback evict: write while fewer than PCT%% of slots are free, "
                        "above 0 and at most 100 (default 15; the daemon evicts below 5)")
    w.add_argument("--queue", type=positive, default=65536, metavar="N",
                   help="keys waiting for write-back at most; the oldest are dropped (default 65536)")
    w.add_argument("--batch", type=positive, default=32, metavar="N", help="keys per put (default 32)")
    w.add_argument("--feed-capacity", type=at_most(1 << 24, "the feed holds at most 2^24 entries"), default=65536,
                   metavar="N",
                   help="entries of the published-key feed, if this tier creates it: at most 16777216 "
                        "(default 65536)")
    r = p.add_argument_group("read-through")
    r.add_argument("--timeout-ms", type=positive, default=2000, metavar="MS",
                   help="deadline of a request that gives none (default 2000)")
    r.add_argument("--records", type=at_most(65535, "the request table's limit"), default=64,
                   metavar="N",
                   help="request records in the table, at most 65535 (default 64)")
    r.add_argument("--keys-per-record", type=at_most(65535, "the request table's limit"), default=1024,
                   metavar="N",
                   help="keys one request can carry: blocks x ranks, at most 65535 (default 1024)")
    o = p.add_argument_group("other")
    o.add_argument("--key-prefix", default="umbp", metavar="STR",
                   help="first component of every store key (default umbp); hosts sharing a store and "
                        "its blocks use the same")
    o.add_argument("--reconnect-after-s", type=positive, default=30, metavar="S",
                   help="replace a store client that has been unhealthy this long (default 30)")
    o.add_argument("--log", metavar="FILE", help="append the log here instead of stderr; SIGHUP opens FILE "
                   "again (after logrotate renamed it)")
    o.add_argument("-v", "--verbose", action="store_true", help="log every request; keep Mooncake's own log")
    return p


def mooncake_config(a) -> dict:
    cfg = {}
    if a.config:
        try:
            with open(a.config) as f:
                cfg = json.load(f)
        except (OSError, ValueError) as e:
            raise SystemExit(f"umbp tier: cannot read Mooncake config {a.config}: {e}")
        if not isinstance(cfg, dict):
            kind = {list: "an array", str: "a string", bool: "true or false",
                    type(None): "null"}.get(type(cfg), "a number")
            raise SystemExit(f"umbp tier: Mooncake config {a.config} is {kind}, not a JSON object: "
                             "write one object of Mooncake's keys, e.g. {\"master_server_address\": "
                             "\"10.0.0.5:50051\"}")
        for key in ("local_hostname", "metadata_server", "protocol", "device_name", "master_server_address"):
            if key in cfg and not isinstance(cfg[key], str):
                raise SystemExit(f"umbp tier: Mooncake config {a.config}: {key} {cfg[key]!r} is not a string: "
                                 "write it in double quotes")
        why = master_error(cfg["master_server_address"]) if cfg.get("master_server_address") else None
        if why and not a.master:
            raise SystemExit(f"umbp tier: Mooncake config {a.config}: master_server_address {why}")
    def size(key, default):
        v = cfg.get(key)
        if v is None:
            return default
        if isinstance(v, str):
            try:
                return parse_size(v)
            except argparse.ArgumentTypeError as e:
                raise SystemExit(f"umbp tier: Mooncake config {a.config}: {key} {e}") from None
        if isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= L.UMBP_SIZE_MAX:
            return v
        raise SystemExit(f"umbp tier: Mooncake config {a.config}: {key} {v!r} is not a size: write whole bytes "
                         "(a number) or a string such as \"1GiB\"")
    out = {
        "local_hostname": a.local_hostname or cfg.get("local_hostname") or "127.0.0.1",
        "metadata_server": a.metadata or cfg.get("metadata_server") or "P2PHANDSHAKE",
        "protocol": a.protocol or cfg.get("protocol") or "tcp",
        "rdma_devices": a.device_name if a.device_name is not None else cfg.get("device_name", ""),
        "master_server_addr": a.master or cfg.get("master_server_address") or "127.0.0.1:50051",
        "global_segment_size": a.global_segment_size if a.global_segment_size is not None
        else size("global_segment_size", 1 << 30),
        "local_buffer_size": a.local_buffer_size if a.local_buffer_size is not None
        else size("local_buffer_size", 16 << 20),
    }
    return out


def memory_error(mc: dict) -> str | None:
    """Why this host cannot lend the store the segment asked for, or None.
    Mooncake allocates the segment in its setup; more than the host's memory
    failed there as 'setup failed (-600)', retried for ever, the cause only in
    Mooncake's own log. (A --local-buffer-size too large makes the setup
    raise MemoryError, which the connection thread reports with both sizes.)"""
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError):
        return None
    seg = mc["global_segment_size"]
    if total <= 0 or seg <= total:
        return None
    return (f"--global-segment-size {seg} bytes (or the --config key global_segment_size) is more than this host's "
            f"memory ({total} bytes): lend the store less")


SHM_DIR = "/dev/shm"


def _human(n: int) -> str:
    for unit, v in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= v:
            return f"{n / v:.1f} {unit}"
    return f"{n} B"


def shm_room_error(a) -> str | None:
    """Why the files this tier would create in /dev/shm do not fit there, or
    None. The request table takes --records x --keys-per-record keys of 48
    bytes (at most about 192 GiB) and the feed --feed-capacity entries of 64
    (at most 1 GiB), and both go to the tmpfs, whose size is half the memory
    by default. Too large a geometry failed only after the tier had attached
    the pool and imported Mooncake, as a runtime error naming neither option
    (and left a table file of the size asked behind); this is the usage error
    instead, found before anything is created. A table of the same size that
    a previous tier left is adopted (no new room), one of another size is
    replaced (its room comes back first); an existing feed is used whatever
    its capacity."""
    def blocks(path: str) -> tuple[int, int] | None:
        """(apparent size, bytes allocated) of a file, or None."""
        try:
            st = os.stat(path)
        except OSError:
            return None
        return st.st_size, st.st_blocks * 512
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return None  # no /dev/shm to measure: the library says what fails
    room = st.f_bavail * st.f_frsize
    table = T.table_bytes(a.records, a.keys_per_record)
    old = blocks(f"{SHM_DIR}/umbp.{a.pool}.tier")
    if old is not None and old[0] == table:
        table = 0  # adopted
    elif old is not None:
        room += old[1]  # unlinked before the new one is made
    feed = 0
    if a.writeback != "off" and not os.path.exists(f"{SHM_DIR}/umbp.{a.pool}.feed"):
        feed = T.feed_bytes(a.feed_capacity)
    if table + feed <= room:
        return None
    have = f"and {SHM_DIR} has {room} bytes ({_human(room)}) free"
    geo = f"--records {a.records} x --keys-per-record {a.keys_per_record}"
    dflt = f"the defaults, 64 x 1024, take {_human(T.table_bytes(64, 1024))}"
    if feed > room:
        return (f"--feed-capacity {a.feed_capacity}: the published-key feed takes {feed} bytes ({_human(feed)}) of "
                f"{SHM_DIR}, {have}: lower --feed-capacity (the default, 65536, takes {_human(T.feed_bytes(65536))}),"
                f" or free room in {SHM_DIR} (umbp pool ls)")
    if table > room:
        return (f"{geo}: the request table takes {table} bytes ({_human(table)}) of {SHM_DIR}, {have}: lower "
                f"--records or --keys-per-record ({dflt}), or free room in {SHM_DIR} (umbp pool ls)")
    return (f"{geo} (a request table of {table} bytes) and --feed-capacity {a.feed_capacity} (a feed of {feed} "
            f"bytes) take {table + feed} bytes ({_human(table + feed)}) of {SHM_DIR}, {have}: lower "
            f"--feed-capacity, --records or --keys-per-record, or free room in {SHM_DIR} (umbp pool ls)")


class Log:
    def __init__(self, path: str | None, verbose: bool):
        """Raises OSError when PATH cannot be opened for appending."""
        self.path = path
        self.f = open(path, "a", buffering=1) if path else sys.stderr
        self.verbose = verbose
        self.lock = threading.Lock()  # the three threads log; reopen() closes the file they write to

    def reopen(self) -> None:
        """SIGHUP, as umbp daemon does: open --log FILE again, so that a log
        rotated by renaming it (logrotate) goes on in a new file; on failure
        the old file stays in use, and says so."""
        if not self.path:
            self("SIGHUP: no --log file to open again; logging on to stderr")
            return
        try:
            f = open(self.path, "a", buffering=1)
        except OSError as e:
            self(f"error: SIGHUP: cannot open the log file {self.path} again: {e.strerror or e}; logging on to "
                 "the file opened before")
            return
        with self.lock:
            old, self.f = self.f, f
            old.close()
        self(f"SIGHUP: log file {self.path} opened again")

    def __call__(self, msg: str, debug: bool = False) -> None:
        if debug and not self.verbose:
            return
        line = time.strftime("%Y-%m-%d %H:%M:%S ") + f"umbp tier[{os.getpid()}]: {msg}\n"
        with self.lock:
            try:
                self.f.write(line)
                self.f.flush()
            except (OSError, ValueError):
                # The log cannot take it: stderr a pipe whose reader went away (a log collector restarted),
                # or --log on a full disk. The line is lost; the thread that wrote it must not be: the
                # connection thread died on it, and the tier then read 'connected' to a master that was
                # gone, for good, and never reconnected (SIGHUP opens --log again once there is room)
                pass


class Tier:
    def __init__(self, a, log: Log, mc: dict | None = None):
        self.a, self.log = a, log
        self.lib = T.lib()
        self.mc = mc if mc is not None else mooncake_config(a)
        o = L.AttachOpts()
        self.lib.umbp_attach_opts_init(C.byref(o))
        h = C.c_void_p()
        if self.lib.umbp_pool_attach(a.pool.encode(), C.byref(o), C.byref(h)):
            raise RuntimeError(T.last_error())
        self.pool = h
        self.me = self.lib.umbp_pool_proc_slot(h) + 1
        self.slot_size = int(self.lib.umbp_slot_size(h))
        self.slot_count = int(self.lib.umbp_slot_count(h))
        self.base = int(self.lib.umbp_slot_ptr(h, 0))
        self.span = int(self.lib.umbp_slot_ptr(h, self.slot_count - 1)) + self.slot_size - self.base
        self.names = T.NsNames(h)
        self.namer = T.KeyNamer(a.key_prefix, self.names)
        tp = T.TierParams(a.records, a.keys_per_record, a.timeout_ms)
        t = C.c_void_p()
        rc = self.lib.umbp_tier_serve(h, C.byref(tp), C.byref(t))
        if rc:
            err = T.last_error()
            if rc == -errno.EBUSY:
                err += (f": one tier serves a pool; see it with 'umbp tier {a.pool} --status', and end it (SIGTERM) "
                        "before starting another (a stopped one keeps the pool until it is continued or killed)")
            self.lib.umbp_pool_detach(h)
            raise RuntimeError(err)
        self.t = t
        self.held: list[int] = []  # slots Mooncake may still write or read (MC_MAY_STILL_RUN); close() reads it
        self.feed = None
        self.store = None  # before anything that can fail: close() reads it
        if a.writeback != "off":
            fo = T.FeedOpts()
            self.lib.umbp_feed_opts_init(C.byref(fo))
            fo.capacity = a.feed_capacity
            f = C.c_void_p()
            rc = self.lib.umbp_feed_open(h, b"tier", C.byref(fo), C.byref(f))
            if rc:
                err = T.last_error()
                if rc == -errno.EBUSY:
                    err += (": the feed's consumer 'tier' is this pool's write-back, and that process reads it "
                            "(an earlier umbp tier, perhaps stopped); end it first, or run this one with "
                            "--writeback off")
                self.close()
                raise RuntimeError(err)
            self.feed = f
        self.state = T.CONNECTING
        self.unhealthy_since: float | None = None
        self.stop = threading.Event()
        self.q: collections.deque = collections.deque()    # (feed position, key, tries) to write
        self.later: list = []  # (when, item): puts the store refused, tried again (store full, or a
                               # restarted master that has not re-learnt the segments yet)
        self.q_lock = threading.Lock()
        self.keys = (L.Key * a.keys_per_record)()
        self.first_connect = True
        self.signalled = False
        self.reopen_log = False
        self.exit_code = 0
        self.feed_info = T.FeedInfo()

    # ---- state ----
    def set_state(self, state: int, msg: str) -> None:
        if state != self.state:
            self.log(f"{T.STATE_NAMES[state]}: {msg}")
        self.state = state
        self.lib.umbp_tier_set_state(self.t, state, msg.encode()[:199])

    def stat(self, name: str, n: int = 1) -> None:
        """Count; returns None, so that it can sit in a condition."""
        if n:
            self.lib.umbp_tier_stat_add(self.t, T.ST[name], n)

    def rpc_failed(self, code: int, why: str | None = None) -> None:
        """A call said the master is unreachable (or master_gone() did): stop
        taking requests now."""
        if self.unhealthy_since is None:
            self.unhealthy_since = time.monotonic()
        if self.state == T.CONNECTED:
            self.set_state(T.DISCONNECTED, f"master {self.mc['master_server_addr']} "
                                           f"{why or f'unreachable (Mooncake {code})'}; probing every second")

    def master_gone(self) -> str | None:
        """Why the master is certainly gone, or None: its port refuses a TCP
        connection (the process died, or its port closed) or its host is
        unreachable. Without it a tier whose master died showed 'connected'
        until its next store call failed, which an idle tier, or one between
        the transfer and the publish of a request, does not make; schedulers
        kept sending requests meanwhile. The connect runs outside any
        Mooncake call and lets go of the GIL; a master that accepts and does
        not answer (stopped, overloaded) passes, and is bounded by the
        requests' deadlines instead. Only a HOST:PORT master is checked, not
        a URL (an HA master behind etcd)."""
        addr = self.mc["master_server_addr"]
        if "://" in addr:
            return None
        host, _, port = addr.strip().rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=0.5).close()
        except ConnectionRefusedError:
            return "refuses connections (its process is gone, or its port closed)"
        except OSError as e:
            if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH):
                return f"is unreachable ({e.strerror})"
        except ValueError:
            pass
        return None

    # ---- connection thread ----
    def connect_loop(self) -> None:
        from mooncake.store import MooncakeDistributedStore
        backoff = 1.0
        while not self.stop.is_set():
            st = self.store
            if st is None:
                self.set_state(T.CONNECTING if self.first_connect else T.DISCONNECTED,
                               f"setting up a Mooncake client of master {self.mc['master_server_addr']}")
                st = MooncakeDistributedStore()
                try:
                    rc, why = st.setup(self.mc), ""
                except Exception as e:  # std::bad_alloc (MemoryError) for sizes this host cannot allocate
                    rc, why = -1, (f": {type(e).__name__}: {e} (--local-buffer-size "
                                   f"{self.mc['local_buffer_size']} and --global-segment-size "
                                   f"{self.mc['global_segment_size']} bytes must fit in this host's memory)")
                if self.stop.is_set():
                    break
                if rc != 0:
                    self.set_state(T.DISCONNECTED, f"Mooncake setup failed ({rc}) against master "
                                                   f"{self.mc['master_server_addr']}{why}; retrying in "
                                                   f"{backoff:.0f} s")
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                rc = st.register_buffer(self.base, self.span)
                if rc != 0:
                    self.set_state(T.DISCONNECTED, f"registering the pool's {self.span} bytes with Mooncake "
                                                   f"failed ({rc}); retrying in {backoff:.0f} s")
                    self.stop.wait(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                backoff = 1.0
                if not self.first_connect:
                    self.stat("reconnects")
                self.first_connect = False
                self.store = st
                self.unhealthy_since = None
                self.set_state(T.CONNECTED, f"master {self.mc['master_server_addr']}, "
                                            f"{self.mc['global_segment_size'] >> 20} MiB lent to the store")
                continue
            self.stop.wait(1.0)
            if self.stop.is_set():
                break
            if self.state == T.CONNECTED and self.unhealthy_since is None:
                why = self.master_gone()  # about 0.1 ms on loopback, once a second
                if why:
                    self.rpc_failed(MC_RPC_FAIL, why)
                continue
            r = st.batch_is_exist([f"{self.a.key_prefix}/.probe"])
            if r and r[0] >= 0:
                self.unhealthy_since = None
                self.set_state(T.CONNECTED, f"master {self.mc['master_server_addr']} answers again")
                continue
            self.rpc_failed(r[0] if r else MC_RPC_FAIL)
            if time.monotonic() - (self.unhealthy_since or time.monotonic()) > self.a.reconnect_after_s:
                self.log(f"replacing the Mooncake client, unhealthy for {self.a.reconnect_after_s} s")
                self.store = None  # in-flight calls keep their reference; it is freed after them

    # ---- read-through (main thread) ----
    def serve_loop(self) -> None:
        job = T.TierJob()
        last_beat = 0.0
        while not self.signalled:
            self.lib.umbp_tier_wait(self.t, 100)
            if self.reopen_log:
                self.reopen_log = False
                self.log.reopen()
            now = time.monotonic()
            if now - last_beat > 0.5:
                last_beat = now
                if self.pool_destroyed():
                    self.log(f"pool {self.a.pool} was destroyed (umbp pool destroy) under this tier: stopping, "
                             "so as not to hold its memory and serve nobody; start umbp tier again once the "
                             "pool is re-created")
                    self.exit_code = 1
                    return
                self.lib.umbp_pool_heartbeat(self.pool)
                self.lib.umbp_tier_set_state(self.t, self.state, None)
            while not self.signalled:
                n = self.lib.umbp_tier_take(self.t, C.byref(job), self.keys, len(self.keys))
                if n <= 0:
                    break
                self.stat("requests")
                try:
                    result, msg = self.fetch(job)
                except Exception as e:  # never leave a client waiting for its deadline
                    result, msg = -errno.EIO, f"tier error: {e!r}"
                self.lib.umbp_tier_complete(self.t, job.ticket, result, msg.encode()[:199] if msg else None)
                self.log(f"request {job.n_blocks}x{job.n_ranks} from {job.client}: {result}"
                         f"{' (' + msg + ')' if msg else ''} in {(time.monotonic() - now) * 1e3:.1f} ms",
                         debug=True)

    def pool_destroyed(self) -> bool:
        """Whether the pool was destroyed while this tier stayed attached (its
        name unlinked: the feed's check, -EIDRM, made whether or not a feed
        exists). Such a tier would keep the whole pool's memory mapped and its
        store segment lent, while the schedulers of a re-created pool of that
        name see no tier at all."""
        return self.lib.umbp_feed_info_get(self.pool, C.byref(self.feed_info)) == -errno.EIDRM

    def destroyed_watch(self) -> None:
        """The main thread checks pool_destroyed() between requests, and a
        request inside a Mooncake call that a stopped or unreachable master
        holds held that check too: the tier served a destroyed pool, its
        memory kept, for as long as the master stayed so. This thread makes
        the same check twice a second and, when the main thread has not
        stopped 1 s after the destroy, ends the tier as a killed tier ends
        (exit 1): the kernel drops the table's and feed's locks, and the
        reserved slots went with the pool."""
        info = T.FeedInfo()
        while not self.stop.wait(0.5):
            if self.lib.umbp_feed_info_get(self.pool, C.byref(info)) != -errno.EIDRM:
                continue
            if self.stop.wait(1.0):   # the main thread saw it and is stopping
                return
            self.log(f"pool {self.a.pool} was destroyed (umbp pool destroy) under this tier while a request is "
                     "inside a Mooncake call that does not return (the master does not answer): exiting without "
                     "waiting for it; start umbp tier again once the pool is re-created")
            os._exit(1)

    def fetch(self, job) -> tuple[int, str | None]:
        """Bring the missing shards of the request's blocks into the pool; the
        number of leading blocks now in the pool on every rank, and a message
        when some that the store held could not be brought in.

        With enough free slots (twice the missing shards: reserving them then
        evicts nothing) the shards are fetched at once into reserved slots:
        one master round trip, and a shard the store lacks just fails its get
        (OBJECT_NOT_FOUND). Otherwise the store is asked first which exist
        (batch_is_exist), and only the blocks of the remote prefix get slots,
        so that a prefix that is nowhere evicts nothing."""
        nb, nr = job.n_blocks, job.n_ranks
        n = nb * nr
        st = self.store
        if st is None or self.state != T.CONNECTED:
            return -errno.ENOTCONN, "the tier is not connected to its store"
        keys = self.keys
        present = (C.c_uint8 * n)()
        if self.lib.umbp_contains_bulk(self.pool, n, keys, present) < 0:
            return -errno.EIO, T.last_error()
        missing = [i for i in range(n) if not present[i]]
        names = dict(zip(missing, self.namer(keys, missing)))
        need = [i for i in missing if names[i] is not None]
        slots: dict[int, int] = {}
        landing: set[int] = set()
        try:
            return self._fetch_into(job, st, present, names, need, slots, landing)
        except BaseException:
            # a Mooncake call that raised (or anything after the reservation):
            # the slots go back now, not when the tier dies; those of a
            # batch_get_into that raised are held (its transfers may run on)
            self.give_back(slots, list(slots), landing, "a batch_get_into that raised")
            raise

    def give_back(self, slots: dict[int, int], idx: list[int], landing: set[int], why: str) -> None:
        """Take the reserved slots of shards idx out of `slots` (shard -> slot)
        and abort them, except those of the shards in `landing`, into which
        Mooncake may still write: held."""
        gone = {i: slots.pop(i) for i in idx}
        self.hold([sl for i, sl in gone.items() if i in landing], why)
        for i, sl in gone.items():
            if i not in landing:
                self.lib.umbp_abort(self.pool, sl)

    def hold(self, held: list[int], why: str) -> None:
        """Keep these slots (reserved or pinned) until the tier exits: a
        transfer Mooncake gave up on may still write into or read from them
        (MC_MAY_STILL_RUN). Aborted, or unpinned, they could be handed to
        another block whose bytes that transfer would then overwrite (or send
        to the store). The kernel ends the transfers with the process, and the
        pool's reaper then frees the slots (close() leaves them to it)."""
        if not held:
            return
        # a put refused this way is tried again (write_batch()) from the same
        # slot, pinned again: self.held keeps every pin, 'held' counts slots
        fresh = len(set(held) - set(self.held))
        self.held.extend(held)
        self.stat("held", fresh)
        n = len(set(self.held))
        self.log(f"Mooncake gave up on {len(held)} transfer(s) ({why}, TRANSFER_FAIL) that may still run: their "
                 f"slots are held until this tier exits ({n} of {self.slot_count} held now; "
                 "restarting the tier frees them)")
        if n > max(1, int(self.slot_count * HELD_MAX_FRACTION)) and not self.signalled:
            self.log(f"error: this tier holds {n} of the pool's {self.slot_count} slots (over "
                     f"{HELD_MAX_FRACTION:.0%}) for transfers Mooncake gave up on: stopping, so that the kernel "
                     "ends those transfers and the pool's reaper frees the slots; look at the store's peers "
                     "(a slow or stalled one), then start umbp tier again (systemd's Restart= does)")
            self.exit_code = 1
            self.signalled = True  # serve_loop() ends as on SIGTERM

    def _fetch_into(self, job, st, present, names, need, slots, landing) -> tuple[int, str | None]:
        """fetch() from the reservation on; every slot it reserves in `slots`
        is published, aborted or held before it returns (fetch() gives them
        back if it raises). `landing` holds the shards whose slots Mooncake
        may still write into."""
        nb, nr = job.n_blocks, job.n_ranks
        n = nb * nr
        keys = self.keys
        if need and self.free_slots() >= 2 * len(need):
            go = self.reserve(need, slots)
        else:
            avail = [bool(present[i]) for i in range(n)]
            if need:
                ex = st.batch_is_exist([names[i] for i in need])
                if any(e in _UNREACHABLE or e == -1 for e in ex):
                    self.rpc_failed(MC_RPC_FAIL)
                    return -errno.ENOTCONN, "the store's master did not answer"
                for i, e in zip(need, ex):
                    avail[i] = e == 1
            lead = 0
            while lead < nb and all(avail[lead * nr + r] for r in range(nr)):
                lead += 1
            go = self.reserve([i for i in need if i < lead * nr], slots)
        ok: set[int] = set()
        if go:
            landing.update(go)
            res = st.batch_get_into([names[i] for i in go],
                                    [int(self.lib.umbp_slot_ptr(self.pool, slots[i])) for i in go],
                                    [self.slot_size] * len(go))
            landing.clear()
            landing.update(i for i, r in zip(go, res) if r == MC_MAY_STILL_RUN)
            if any(r in _UNREACHABLE for r in res):
                self.rpc_failed(MC_RPC_FAIL)
                self.give_back(slots, list(slots), landing, "a batch_get_into")
                return -errno.ENOTCONN, "the store's master did not answer"
            ok = {i for i, r in zip(go, res) if r == self.slot_size}
            # a shard the store does not hold is a miss; anything else (short,
            # too long for a slot, transfer failed) a failed transfer
            self.stat("fetch_errors", sum(1 for r in res if r != self.slot_size and r != MC_OBJECT_NOT_FOUND))
        if _PAUSE_BEFORE_PUBLISH and go:
            open(_PAUSE_BEFORE_PUBLISH, "w").close()
            while True:
                time.sleep(1)
        # publish the shards of every block that is now whole; a block with a
        # shard missing publishes none of them
        whole = [all(present[b * nr + r] or (b * nr + r) in ok for r in range(nr)) for b in range(nb)]
        pub = [i for i in sorted(ok) if whole[i // nr]]
        self.give_back(slots, [i for i in slots if i not in ok or not whole[i // nr]], landing, "a batch_get_into")
        if pub:
            ps = (C.c_uint32 * len(pub))(*[slots[i] for i in pub])
            pk = (L.Key * len(pub))(*[keys[i] for i in pub])
            rc = (C.c_int * len(pub))()
            self.lib.umbp_publish_bulk(self.pool, len(pub), ps, pk, rc)
            for j in range(len(pub)):
                if rc[j] not in (0, -errno.EEXIST):  # the pool refused (a full bucket neighbourhood)
                    whole[pub[j] // nr] = False
            fetched = sum(1 for j in range(len(pub)) if rc[j] == 0)
            self.stat("keys_fetched", fetched)
            self.stat("bytes_fetched", fetched * self.slot_size)
        done = 0
        while done < nb and whole[done]:
            done += 1
        self.stat("remote_misses", nb - done)
        self.stat("blocks_fetched", sum(1 for b in range(done) if not all(present[b * nr + r] for r in range(nr))))
        msg = None
        if go and len(ok) < len(go) and done < nb:
            msg = f"{len(go) - len(ok)} of {len(go)} shards could not be brought in (not in the store, or failed)"
        return done, msg

    def reserve(self, idx: list[int], slots: dict[int, int]) -> list[int]:
        """A slot per shard (in its namespace) into slots; the shards that got one."""
        by_ns: dict[int, list[int]] = collections.defaultdict(list)
        for i in idx:
            by_ns[self.keys[i].ns].append(i)
        for ns, ii in by_ns.items():
            buf = (C.c_uint32 * len(ii))()
            got = self.lib.umbp_reserve_bulk(self.pool, -1, ns, len(ii), buf)
            for j in range(max(0, got)):
                slots[ii[j]] = buf[j]
        return [i for i in idx if i in slots]

    def free_slots(self) -> int:
        info = T.PoolInfo()
        if self.lib.umbp_pool_get_info(self.pool, C.byref(info)):
            return 0
        return sum(info.partitions[i].free_slots for i in range(info.n_partitions))

    # ---- write-back thread ----
    def pressure(self) -> bool:
        if self.a.writeback != "evict":
            return True
        return self.free_slots() * 100.0 < self.a.evict_free_pct * max(1, self.slot_count)

    def writeback_loop(self) -> None:
        entries = (T.FeedEntry * 1024)()
        lost = C.c_uint64()
        batch = self.a.batch
        last_pressure, under = 0.0, True
        while not self.stop.is_set():
            n = self.lib.umbp_feed_read(self.feed, entries, len(entries), C.byref(lost))
            if n == -errno.ESTALE:  # the feed was re-created: open it again
                self.log("the published-key feed was re-created; re-opening it")
                self.lib.umbp_feed_close(self.feed)
                f = C.c_void_p()
                if self.lib.umbp_feed_open(self.pool, b"tier", None, C.byref(f)):
                    self.log(f"cannot re-open the feed: {T.last_error()}; write-back stops")
                    self.feed = None
                    return
                self.feed = f
                continue
            if lost.value:
                self.stat("wb_dropped", lost.value)
            with self.q_lock:
                for e in entries[: max(0, n)]:
                    if e.type != T.EV_STORED or e.owner == self.me:
                        continue  # removals, and blocks this tier itself brought from the store
                    k = L.Key()
                    C.pointer(k)[0] = e.key
                    self.q.append((e.pos, k, 0))
                    self.stat("wb_queued")
                over = len(self.q) - self.a.queue
                for _ in range(max(0, over)):
                    self.q.popleft()
                self.stat("wb_dropped", max(0, over))
            now = time.monotonic()
            if self.later and self.later[0][0] <= now:
                with self.q_lock:
                    due = [it for when, it in self.later if when <= now]
                    self.later = [x for x in self.later if x[0] > now]
                    self.q.extendleft(reversed(due))
            if now - last_pressure > 0.1:
                last_pressure, under = now, self.pressure()
            wrote = 0
            if self.q and under and self.state == T.CONNECTED and self.store is not None:
                wrote = self.write_batch(batch)
            self.commit()
            if n <= 0 and not wrote:
                self.stop.wait(0.005 if self.q and under and self.state == T.CONNECTED else 0.02)

    def commit(self) -> None:
        with self.q_lock:
            pending = ([self.q[0][0]] if self.q else []) + [it[0] for _, it in self.later]
            head = min(pending) if pending else None
        if head is None:
            cur = C.c_uint64()
            self.lib.umbp_feed_position(self.feed, C.byref(cur), None, None)
            head = cur.value
        self.lib.umbp_feed_commit(self.feed, head)

    def write_batch(self, batch: int) -> int:
        st = self.store
        with self.q_lock:
            items = [self.q.popleft() for _ in range(min(batch, len(self.q)))]
        if not items:
            return 0
        k = len(items)
        keys = (L.Key * k)(*[it[1] for it in items])
        slots = (C.c_uint32 * k)()
        if self.lib.umbp_lookup_pin_bulk(self.pool, k, keys, slots) < 0:
            self.log(f"write-back lookup failed: {T.last_error()}")
            self.stat("wb_errors", k)
            return k
        hit = [i for i in range(k) if slots[i] != L.UMBP_NO_SLOT]  # others: evicted or removed meanwhile
        live = [(i, nm) for i, nm in zip(hit, self.namer(keys, hit)) if nm is not None]
        self.stat("wb_skipped", k - len(live))
        retry, later = [], []
        putting: list[int] = []  # entries whose slots a batch_put_from may still read
        try:
            if live:
                ex = st.batch_is_exist([nm for _, nm in live])
                if any(e in _UNREACHABLE or e == -1 for e in ex):
                    self.rpc_failed(MC_RPC_FAIL)
                    retry = [items[i] for i, _ in live]
                    live = []
                else:
                    self.stat("wb_skipped", sum(1 for e in ex if e == 1))
                    live = [x for x, e in zip(live, ex) if e != 1]
            if live:
                putting = [i for i, _ in live]
                res = st.batch_put_from([nm for _, nm in live],
                                        [int(self.lib.umbp_slot_ptr(self.pool, slots[i])) for i, _ in live],
                                        [self.slot_size] * len(live))
                putting = [i for (i, _), r in zip(live, res) if r == MC_MAY_STILL_RUN]
                for (i, _), r in zip(live, res):
                    if r == 0:
                        self.stat("wb_written")
                        self.stat("wb_bytes", self.slot_size)
                    elif r == MC_OBJECT_ALREADY_EXISTS:
                        self.stat("wb_skipped")
                    elif r in _UNREACHABLE:
                        retry.append(items[i])
                    elif self.stat("wb_refused") or items[i][2] < PUT_TRIES - 1:  # refused: again later
                        pos, key, tries = items[i]
                        later.append((time.monotonic() + tries + 1.0, (pos, key, tries + 1)))
                    else:  # refused PUT_TRIES times: counted, dropped
                        self.stat("wb_errors")
                if any(r in _UNREACHABLE for r in res):
                    self.rpc_failed(MC_RPC_FAIL)
        except Exception as e:
            # a Mooncake call that raised (the binding's C++ exceptions) would
            # end the write-back thread and with it every later write-back:
            # the batch's keys are tried again later, PUT_TRIES times in all,
            # and its puts' slots stay held (putting), as they may still be read
            self.log(f"write-back: a Mooncake call raised {e!r}; its {len(live)} keys are tried again later")
            retry = []
            for i, _ in live:
                pos, key, tries = items[i]
                if tries < PUT_TRIES - 1:
                    later.append((time.monotonic() + tries + 1.0, (pos, key, tries + 1)))
                else:
                    self.stat("wb_errors")
        finally:
            # the pins of puts that may still read their slots stay held
            self.hold([slots[i] for i in putting], "a batch_put_from")
            for i in putting:
                slots[i] = L.UMBP_NO_SLOT
            self.lib.umbp_unpin_bulk(self.pool, k, slots)
        with self.q_lock:
            if retry:  # back at the front, for after the reconnection
                self.q.extendleft(reversed(retry))
            if later:
                self.later = sorted(self.later + later, key=lambda x: x[0])
        return k

    # ---- life ----
    def run(self, early: list[int] | None = None) -> int:
        """Serve until SIGTERM or SIGINT; EARLY holds those that came before
        (main() noted them): then it stops at once."""
        # The handler only sets a flag: Event.set() takes a lock, and a second
        # signal arriving inside the first one's set() would deadlock on it
        def on_signal(*_):
            self.signalled = True

        def on_hup(*_):
            self.reopen_log = True
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, on_signal)
        if early:
            self.signalled = True
        signal.signal(signal.SIGHUP, on_hup)
        self.start_watchdog()
        self.log(f"serving pool {self.a.pool} ({self.slot_count} slots of {self.slot_size} B), master "
                 f"{self.mc['master_server_addr']}, write-back {self.a.writeback}")
        threads = [threading.Thread(target=self.connect_loop, name="tier-connect", daemon=True),
                   # joined at the stop, before close() detaches the pool it looks at
                   threading.Thread(target=self.destroyed_watch, name="tier-watch", daemon=True)]
        if self.feed is not None:
            threads.append(threading.Thread(target=self.writeback_loop, name="tier-writeback", daemon=True))
        for th in threads:
            th.start()
        try:
            self.serve_loop()
        finally:
            self.stop.set()
            for th in threads[1:]:
                th.join(10)
            if any(th.is_alive() for th in threads[1:]):
                # The write-back thread is still inside a Mooncake call (a stopped master holds it; after a
                # pool destroyed under the tier no watchdog bounds the stop). Closing the feed and detaching
                # the pool under it made it touch freed handles when the call returned: the tier died of
                # SIGSEGV, and waited for that, with no bound, in Mooncake's close. Ended here instead, as a
                # killed tier ends: the kernel drops the table's and feed's locks, the pool's reaper its pins.
                self.log("the write-back thread is still inside a Mooncake call 10 s after the stop (the master "
                         "does not answer): exiting without waiting for it; the pool's reaper frees what it held")
                self.log("stopped")
                os._exit(self.exit_code)
            self.close()
        self.log("stopped")
        return self.exit_code

    def start_watchdog(self) -> None:
        """The process that bounds a stop by STOP_GRACE_S (see there). It ends
        by itself when the tier does: the pipe's write end closes."""
        r, w = os.pipe()
        os.set_blocking(w, False)  # a full pipe must never block a signal handler
        try:
            subprocess.Popen([sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(STOP_GRACE_S),
                              os.path.abspath(self.a.log) if self.a.log else ""],
                             stdin=r, stdout=subprocess.DEVNULL, close_fds=True)
        except OSError as e:
            self.log(f"cannot start the stop watchdog ({e}): a signal that arrives while a Mooncake call holds "
                     "the tier waits for that call")
            os.close(w)
            return
        finally:
            os.close(r)
        signal.set_wakeup_fd(w, warn_on_full_buffer=False)

    def close(self) -> None:
        if self.feed is not None:
            self.lib.umbp_feed_close(self.feed)
            self.feed = None
        if self.t is not None:
            self.lib.umbp_tier_close(self.t)
            self.t = None
        # the connection thread may still be inside Mooncake's setup: the
        # process exits without waiting for it (daemon thread). A connected
        # client is closed here: it unmounts the segment this host lent, so
        # the master forgets it now rather than after its client TTL (1 s,
        # where leaving it to the destructor at exit takes 2)
        st, self.store = self.store, None
        if st is not None:
            try:
                st.close()
            except Exception as e:
                self.log(f"closing the Mooncake client: {e!r}")
        if self.pool is not None and self.held:
            # a detach would free the held slots while this process, and with
            # it the transfers that may still use them, lives on a moment: the
            # pool's reaper frees them once the process is gone
            self.log(f"leaving {len(set(self.held))} held slots to the pool's reaper (Mooncake may still use them "
                     "until this process exits)")
            self.pool = None
        if self.pool is not None:
            self.lib.umbp_pool_detach(self.pool)
            self.pool = None


def status(a) -> int:
    lib = T.lib()
    o = L.AttachOpts()
    lib.umbp_attach_opts_init(C.byref(o))
    o.read_only = True
    h = C.c_void_p()
    if lib.umbp_pool_attach(a.pool.encode(), C.byref(o), C.byref(h)):
        print(f"umbp tier: {T.last_error()}", file=sys.stderr)
        return 1
    try:
        ti, fi = T.tier_info(h), T.feed_info(h)
    except OSError as e:
        fix = (": run --status as the tier's user, or give the pool's files in /dev/shm (umbp." + a.pool +
               ".tier and .feed) the pool file's mode and group" if e.errno in (errno.EACCES, errno.EPERM) else "")
        print(f"umbp tier: {e.strerror}{fix}", file=sys.stderr)
        return 1
    finally:
        lib.umbp_pool_detach(h)
    if a.json:
        print(json.dumps({"pool": a.pool, "tier": ti, "feed": fi}, indent=1))
        return 0 if ti else 1
    if ti is None:
        print(f"pool {a.pool}: no tier has served it (start: umbp tier {a.pool})")
        return 1
    s = ti["stats"]
    # a stopped tier still holds the table and reads as alive and in its last state, while every request
    # to it ends at its deadline: said, with how to continue it
    run = (f"stopped (SIGSTOP or a debugger): requests to it end at their deadline until it is continued, "
           f"kill -CONT {ti['pid']}" if ti["stopped"] else "alive" if ti["alive"] else "not running")
    print(f"pool {a.pool}: tier {ti['state']} (pid {ti['pid']}, {run}) "
          f"for {ti['state_age_s']:.0f} s: {ti['message']}")
    print(f"  read-through: {s['requests']} requests, {s['blocks_fetched']} blocks "
          f"({s['bytes_fetched'] / 2**20:.1f} MiB) brought in, {s['remote_misses']} remote misses, "
          f"{s['fetch_errors']} failed transfers, {s['expired']} expired")
    print(f"  write-back:   {s['wb_written']} written ({s['wb_bytes'] / 2**20:.1f} MiB), {s['wb_skipped']} "
          f"skipped, {s['wb_dropped']} dropped, {s['wb_refused']} refused by the store ({s['wb_errors']} "
          f"given up); {s['reconnects']} reconnects")
    if s["held"]:  # 0 for a tier that exited (umbp_tier_info_get): the pool's reaper frees what it held
        print(f"  held:         {s['held']} slots whose transfer Mooncake gave up on (it may still run): kept "
              f"until the tier exits; restart it to free them")
    if fi:
        for c in fi["consumers"]:
            live = "stopped" if c["stopped"] else "alive" if c["alive"] else "gone"
            print(f"  feed consumer {c['name']} (pid {c['pid']}): {live}, {c['behind']} behind, "
                  f"{c['lost']} lost")
    return 0


def check_args(a) -> None:
    """The checks argparse cannot make alone; raises UsageError. They run
    before anything attaches to the pool or imports Mooncake."""
    why = pool_name_error(a.pool)
    if why:
        raise UsageError(why)
    if a.json and not a.status:
        raise UsageError("--json only formats --status: add --status, or drop --json")
    # an empty value (--master "$UNSET") would read as the option left out and
    # silently take the config's value or the default: a usage error instead
    for opt, val, what, absent in (
            ("--master", a.master, "the master's HOST:PORT", "the config's or 127.0.0.1:50051"),
            ("--metadata", a.metadata, "a metadata service: P2PHANDSHAKE, etcd://... or http://...",
             "the config's or P2PHANDSHAKE"),
            ("--local-hostname", a.local_hostname, "the address other hosts reach this one at",
             "the config's or 127.0.0.1"),
            ("--config", a.config, "a file name (Mooncake's client JSON)", "none"),
            ("--log", a.log, "a file name", "stderr")):
        if val is not None and not val.strip():
            raise UsageError(f"{opt} '{val}' is empty: give {what}, or leave {opt} out for {absent}")
    why = master_error(a.master) if a.master is not None else None
    if why:
        raise UsageError(f"--master {why}")


def write_failed(what: str, e: OSError) -> int:
    """Standard output could not be written (/dev/full, a full disk): said as
    the C commands' cli_stdout_check says it, exit 1. What is left in the
    buffer goes to /dev/null, so that Python's own flush at exit neither
    fails again nor prints a traceback."""
    try:
        fd = os.open(os.devnull, os.O_WRONLY)
        os.dup2(fd, sys.stdout.fileno())
        os.close(fd)
    except OSError:
        pass
    print(f"umbp: {what}: writing the output failed: {e.strerror or e}", file=sys.stderr)
    return 1


def parse_args(p: argparse.ArgumentParser, argv: list[str] | None):
    """p.parse_args(argv) (argparse's own errors exit 2: Parser.error), with
    --help's text written as the C commands write theirs: a write that fails
    is exit 1 saying so. The namespace, or an exit status. The caller has set
    SIGPIPE to SIG_DFL, so that --help | head ends as the C commands do."""
    what = p.prog.removeprefix("umbp ") + " --help"
    try:
        return p.parse_args(argv)
    except SystemExit as e:
        if e.code in (0, None):  # --help: part of its text may be in the buffer yet
            try:
                sys.stdout.flush()
            except OSError as err:
                return write_failed(what, err)
        raise
    except OSError as e:  # --help's write (print_help)
        return write_failed(what, e)


def main(argv: list[str] | None = None) -> int:
    # --help and --status end as the C commands do when their reader goes
    # away (umbp tier POOL --status --json | head): killed by SIGPIPE, not a
    # BrokenPipeError traceback. Python's SIG_IGN is put back before the tier
    # proper starts (its sockets and Mooncake's expect EPIPE, not a signal).
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    p = build_parser()
    a = parse_args(p, argv)
    if isinstance(a, int):
        return a
    try:
        check_args(a)
    except UsageError as e:
        return usage_error(p.prog, str(e))
    if a.status:
        try:
            rc = status(a)
            sys.stdout.flush()
        except OSError as e:
            return write_failed("tier --status", e)
        return rc
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # SIGTERM and SIGINT stop the tier, exit 0, from here on: one that came
    # before run() installed its handlers (importing Mooncake and setting up
    # take a second or so) ended in a KeyboardInterrupt traceback, or, inside
    # Mooncake's import, as "the Mooncake Store client is not importable"
    # (exit 1). Until run() they are noted here; run() then stops at once.
    early: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda n, _f: early.append(n))
    why = shm_room_error(a)
    if why:
        return usage_error(p.prog, why)
    mc = mooncake_config(a)  # a bad config file ends here (exit 1), not after Mooncake's setup
    why = memory_error(mc)
    if why:
        print(f"umbp tier: {why}", file=sys.stderr)
        return 1
    try:
        log = Log(a.log, a.verbose)
    except OSError as e:
        print(f"umbp tier: cannot open the log file --log {a.log}: {e.strerror or e}: give a file in a "
              "directory that exists and that this user can write", file=sys.stderr)
        return 1
    if not a.verbose:
        # Mooncake's INFO lines (several per call); its errors stay, ours say the same once
        os.environ.setdefault("MC_LOG_LEVEL", "ERROR")
    try:
        import mooncake.store  # noqa: F401
    except ImportError as e:
        print(f"umbp tier: the Mooncake Store client is not importable by {sys.executable} ({e}): "
              "pip install mooncake-transfer-engine-non-cuda (or mooncake-transfer-engine with CUDA), or set "
              "UMBP_PYTHON to a Python that has it", file=sys.stderr)
        return 1
    if early:
        log(f"stopped by {signal.Signals(early[0]).name} before serving")
        return 0
    try:
        tier = Tier(a, log, mc)
    except (RuntimeError, OSError) as e:
        print(f"umbp tier: {e}", file=sys.stderr)
        return 1
    return tier.run(early)


if __name__ == "__main__":
    sys.exit(main())
