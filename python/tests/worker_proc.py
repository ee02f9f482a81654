# SPDX-License-Identifier: Apache-2.0
"""A worker-role UMBPStoreConnector in its own process (exec'd by the tests).

Protocol: pickled (command, args) on stdin, a pickled reply on stdout.
Steps follow vLLM's CPU model-runner order (v1/worker/cpu/kv_connector.py):
handle_preemptions, bind_connector_metadata, start_load_kv, wait_for_layer_load,
wait_for_save, get_finished, get_block_ids_with_load_errors, stats, events,
build_connector_worker_meta, clear_connector_metadata."""
import logging
import os
import pickle
import sys

sys.path.insert(0, os.path.dirname(__file__))
from conftest import LAYERS, make_kv_cache_config, make_kv_caches, make_vllm_config  # noqa: E402

from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.forward_context import set_forward_context  # noqa: E402

import torch  # noqa: E402


def make(pool, tp, rank, seed, extra):
    """A worker-role connector and its KV caches, as vLLM's worker makes them."""
    extra = dict(extra)
    layout = extra.pop("test_layout", "one-group")   # test settings, not connector keys
    engine = extra.pop("test_engine", "test-engine")
    cfg = make_vllm_config(pool, tp=tp, rank=rank, engine=engine, **extra)
    conn = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, make_kv_cache_config(layout))
    caches = make_kv_caches(seed if seed >= 0 else None, layout)
    conn.register_kv_caches(caches)
    return cfg, conn, caches


def make_intree(pool, tp, rank, seed, extra):
    """vLLM's in-tree UMBPStoreConnector (no module path) on the umbp backend."""
    import intree_util as I
    I.register_plugin()
    cfg = I.make_vllm_config(pool, tp=tp, rank=rank, **extra)
    conn = KVConnectorFactory.create_connector(cfg, KVConnectorRole.WORKER, I.make_kv_cache_config())
    caches = I.make_kv_caches(seed if seed >= 0 else None)
    conn.register_kv_caches(caches)
    return cfg, conn, caches


class _Logs(logging.Handler):
    """What the connector logged (logger vllm.umbp), for the 'logs' command."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(f"{record.levelname}: {record.getMessage()}")


LOGS = _Logs()
logging.getLogger("vllm.umbp").addHandler(LOGS)
logging.getLogger("vllm.umbp").setLevel(logging.INFO)


def main():
    # One process serves many tests in turn: importing vLLM and torch is most of
    # a worker's cost. 'init' makes a connector, 'shutdown' ends it; EOF exits.
    cfg = conn = caches = None
    block_dim = 1          # our caches: (2, blocks, ...); the in-tree ones: (blocks, 2, ...)
    out = sys.stdout.buffer
    inp = sys.stdin.buffer
    while True:
        try:
            cmd, args = pickle.load(inp)
        except EOFError:
            break
        if cmd in ("init", "init_intree"):
            try:
                cfg, conn, caches = (make if cmd == "init" else make_intree)(*args)
                block_dim = 1 if cmd == "init" else 0
                reply = "ok"
            except Exception as e:  # noqa: BLE001 - the test sees the connector's error
                reply = e
        elif cmd == "info":
            reply = {"cls": f"{type(conn).__module__}.{type(conn).__name__}",
                     "handshake": conn.get_handshake_metadata(), "placement": getattr(conn, "placement", None),
                     "runtime": (f"{type(conn.connector_worker.runtime).__module__}."
                                 f"{type(conn.connector_worker.runtime).__name__}"
                                 if hasattr(conn, "connector_worker") else None)}
        elif cmd == "step":
            meta, finished = args
            conn.handle_preemptions(meta)
            conn.bind_connector_metadata(meta)
            with set_forward_context(None, cfg):
                conn.start_load_kv(None)
                for name in LAYERS:
                    conn.wait_for_layer_load(name)
            conn.wait_for_save()
            sending, recving = conn.get_finished(set(finished))
            reply = {"finished_sending": sending, "finished_recving": recving,
                     "errors": conn.get_block_ids_with_load_errors(),
                     "stats": conn.get_kv_connector_stats(),
                     "events": conn.get_kv_connector_kv_cache_events(),
                     "worker_meta": conn.build_connector_worker_meta()}
            conn.clear_connector_metadata()
        elif cmd == "start_load":
            # a step that ends after start_load_kv, before wait_for_layer_load
            # (its forward pass raised): the loads stay pending
            conn.bind_connector_metadata(args)
            with set_forward_context(None, cfg):
                conn.start_load_kv(None)
            reply = "ok"
        elif cmd == "job_count":
            from umbp import _lib as L
            reply = L.lib().umbp_dp_job_count()
        elif cmd == "dump":
            reply = {n: caches[n].index_select(block_dim, torch.tensor(list(args), dtype=torch.long)).clone() for n in LAYERS}
        elif cmd == "zero":
            for t in caches.values():
                t.zero_()
            reply = "ok"
        elif cmd == "logs":
            reply, LOGS.lines = LOGS.lines, []
        elif cmd == "shutdown":
            conn.shutdown()
            cfg = conn = caches = None
            reply = "bye"
        pickle.dump(reply, out)
        out.flush()


if __name__ == "__main__":
    main()
