# SPDX-License-Identifier: Apache-2.0
"""Real processes for the cluster tests: a mooncake_master on loopback and
"hosts" on this machine, each a pool owned by its own `umbp daemon` with its
own `umbp tier`. Nothing is mocked: the tiers are the CLI's, the master is
the one PyPI's Mooncake wheel ships."""
from __future__ import annotations

import ctypes as C
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TOOL = os.environ.get("UMBP_TOOL", "umbp")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def master_binary() -> str | None:
    import importlib.util
    spec = importlib.util.find_spec("mooncake")
    if spec is None or not spec.origin:
        return None
    p = Path(spec.origin).parent / "mooncake_master"
    return str(p) if p.exists() else None


def wait_for(pred, timeout: float, what: str, step: float = 0.05):
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > end:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(step)


class Master:
    """mooncake_master on 127.0.0.1 (its own RPC and metrics ports, so that
    several tests and engineers can run at once)."""

    def __init__(self, workdir: Path, *extra: str):
        self.bin = master_binary()
        self.extra = list(extra)  # more mooncake_master flags
        self.port, self.metrics_port = free_port(), free_port()
        self.log = workdir / "mooncake_master.log"
        self.proc = None
        self.start()

    @property
    def addr(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen([self.bin, f"--rpc_port={self.port}", "--rpc_address=127.0.0.1",
                                      f"--metrics_port={self.metrics_port}", "--enable_http_metadata_server=false",
                                      "--rpc_thread_num=2", *self.extra],
                                     stdout=open(self.log, "a"), stderr=subprocess.STDOUT)

        def up():
            if self.proc.poll() is not None:
                raise AssertionError("mooncake_master exited: " + self.log.read_text()[-800:])
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return True
            except OSError:
                return False
        wait_for(up, 20, "mooncake_master to listen")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


_hosts = iter(range(1 << 30))


class Host:
    """One 'host': a pool, its daemon, its tier."""

    def __init__(self, name: str, workdir: Path, capacity: str = "16MiB", slot_size: str = "64KiB"):
        self.name, self.workdir = name, workdir
        self.pool = f"cl-{name}-{os.getpid()}-{next(_hosts)}"
        self.daemon = subprocess.Popen([TOOL, "daemon", self.pool, "--capacity", capacity, "--slot-size", slot_size,
                                        "--no-prefault", "--index-pages", "small", "--foreground",
                                        "--unlink-on-exit", "--reap-interval", "100"],
                                       stdout=open(workdir / f"daemon-{name}.log", "a"), stderr=subprocess.STDOUT)
        wait_for(lambda: Path(f"/dev/shm/umbp.{self.pool}").exists() or self.daemon.poll() is not None, 20,
                 f"pool {self.pool}")
        assert self.daemon.poll() is None, (workdir / f"daemon-{name}.log").read_text()
        self.tier = None
        self.tier_log = workdir / f"tier-{name}.log"

    def start_tier(self, master: Master, *extra: str, env: dict | None = None) -> None:
        e = dict(os.environ, UMBP_PYTHON=sys.executable, **(env or {}))
        self.tier = subprocess.Popen([TOOL, "tier", self.pool, "--master", master.addr, "--local-hostname",
                                      "127.0.0.1", "--global-segment-size", "64MiB", "--timeout-ms", "5000",
                                      "--log", str(self.tier_log), *extra],
                                     stdout=subprocess.DEVNULL, stderr=open(self.tier_log, "a"), env=e)

    def status(self) -> dict:
        """The tier's state and counters, read from the table (read-only attach)."""
        from umbp import _lib as L
        from umbp import tier as T
        lib = T.lib()
        o = L.AttachOpts()
        lib.umbp_attach_opts_init(C.byref(o))
        o.read_only = True
        h = C.c_void_p()
        L.check(lib.umbp_pool_attach(self.pool.encode(), C.byref(o), C.byref(h)), "attach")
        try:
            return T.tier_info(h) or {}
        finally:
            lib.umbp_pool_detach(h)

    def wait_state(self, state: str, timeout: float = 30) -> dict:
        def ok():
            if self.tier is not None and self.tier.poll() is not None:
                raise AssertionError(f"umbp tier exited {self.tier.returncode}: " + self.tier_log.read_text()[-2000:])
            s = self.status()
            return s if s.get("alive") and s.get("state") == state else None
        return wait_for(ok, timeout, f"tier of {self.name} to be {state}", 0.1)

    def kill_tier(self, sig=signal.SIGKILL) -> None:
        if self.tier and self.tier.poll() is None:
            self.tier.send_signal(sig)
            try:
                self.tier.wait(20)
            except subprocess.TimeoutExpired:
                self.tier.kill()
                self.tier.wait()
                raise AssertionError(f"umbp tier of {self.name} did not stop on signal {sig} in 20 s")

    def worker(self, op: str, ns: str, rank, first: int, count: int) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(HERE / "worker.py"), op, self.pool, ns, str(rank), str(first),
                               str(count)], capture_output=True, text=True, timeout=60)

    def check(self) -> subprocess.CompletedProcess:
        return subprocess.run([TOOL, "inspect", self.pool, "--check"], capture_output=True, text=True, timeout=60)

    def close(self) -> None:
        try:
            self.kill_tier(signal.SIGTERM)
        finally:
            self.close_daemon()

    def close_daemon(self) -> None:
        if self.daemon.poll() is None:
            self.daemon.terminate()
            try:
                self.daemon.wait(10)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
        subprocess.run([TOOL, "pool", "destroy", self.pool, "--force"], capture_output=True)


class Scheduler:
    """A scheduler's side on one host, in this process: the connector's
    TierClient over a read-write attach."""

    def __init__(self, host: Host, timeout_ms: int = 0):
        from umbp import _lib as L
        from umbp import tier as T
        self.L, self.T = L, T
        self.lib = T.lib()
        o = L.AttachOpts()
        self.lib.umbp_attach_opts_init(C.byref(o))
        o.role = 1
        h = C.c_void_p()
        L.check(self.lib.umbp_pool_attach(host.pool.encode(), C.byref(o), C.byref(h)), "attach")
        self.h = h
        self.client = T.TierClient(h, timeout_ms)

    def keys(self, ns: str, ranks: int, first: int, count: int):
        sys.path.insert(0, str(HERE))
        import worker
        nsid = C.c_uint32()
        self.L.check(self.lib.umbp_ns_register(self.h, ns.encode(), C.byref(nsid)), "namespace")
        return (self.L.Key * (count * ranks))(*[worker.key(nsid.value, r, first + b)
                                                for b in range(count) for r in range(ranks)])

    def fetch(self, ns: str, ranks: int, first: int, count: int, timeout: float = 30) -> tuple[int, float]:
        """Ask the tier for the prefix and poll as the connector does; returns
        (blocks, seconds from request to answer). Raises if the request is refused."""
        keys = self.keys(ns, ranks, first, count)
        t0 = time.monotonic()
        r = self.client.request(keys, count, ranks)
        if r is None:
            raise RuntimeError(f"request refused: {self.client.last}")
        ticket, _ = r
        end = t0 + timeout
        while True:
            v = self.client.poll(ticket)
            if v is not None:
                return v, time.monotonic() - t0
            if time.monotonic() > end:
                raise AssertionError("no answer")
            time.sleep(0.0005)

    def close(self) -> None:
        self.client.close()
        self.lib.umbp_pool_detach(self.h)


def dump_logs(workdir: Path) -> str:
    out = []
    for p in sorted(workdir.glob("*.log")):
        out.append(f"==== {p.name}\n" + p.read_text()[-3000:])
    return "\n".join(out)


def json_status(host: Host) -> dict:
    r = subprocess.run([TOOL, "tier", host.pool, "--status", "--json"], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, UMBP_PYTHON=sys.executable))
    return json.loads(r.stdout)
