#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""contrib/docker/docker-compose.yml: the structure that makes a daemon
container and a vLLM container share one pool. Docker is not available where
umbp is developed, so the file is never run here; this checks the keys that
matter (docs/operations.md, "In containers", gives the reasons):
the same IPC namespace (ipc: shareable + "service:DAEMON", or both host),
shm_size on the namespace's owner, cap_add SYS_NICE (mbind under Docker's
seccomp profile), the same uid or the pool's --group, the daemon's command,
and a vLLM config in standalone mode naming the daemon's pool.

argv: the compose file. Needs PyYAML: python3's, else the project's .venv
(scripts/setup-python.sh) is used; skips (77) without either."""
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
try:
    import yaml
except ImportError:
    venv_py = os.path.join(HERE, "..", "..", ".venv", "bin", "python")
    if os.access(venv_py, os.X_OK) and not os.environ.get("UMBP_COMPOSE_REEXEC"):
        os.environ["UMBP_COMPOSE_REEXEC"] = "1"
        os.execv(venv_py, [venv_py, *sys.argv])
    print("1..0 # SKIP PyYAML is missing: apt-get install python3-yaml, or run scripts/setup-python.sh")
    sys.exit(77)

sys.path.insert(0, os.path.join(HERE, ".."))
import taplib  # noqa: E402

COMPOSE = sys.argv[1]
with open(COMPOSE) as f:
    DOC = yaml.safe_load(f)
SV = DOC["services"]


def size(s):
    s = str(s).lower().rstrip("b")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    return int(float(s[:-1]) * mult[s[-1]]) if s[-1] in mult else int(s)


def daemon_name():
    ds = [n for n, s in SV.items() if "daemon" in (s.get("command") or [])]
    assert len(ds) == 1, f"one service runs 'umbp daemon': {ds}"
    return ds[0]


def engine_names():
    es = [n for n, s in SV.items() if "serve" in (s.get("command") or [])]
    assert es, "no service runs 'vllm serve'"
    return es


def kv_config(svc):
    cmd = svc["command"]
    return json.loads(cmd[cmd.index("--kv-transfer-config") + 1])


checks, check = taplib.registry()


@check("the daemon runs 'umbp daemon POOL --capacity SIZE --foreground'")
def _():
    cmd = SV[daemon_name()]["command"]
    assert cmd[0] == "daemon" and not cmd[1].startswith("-"), cmd
    assert "--foreground" in cmd and "--capacity" in cmd, cmd
    assert SV[daemon_name()].get("restart") in ("on-failure", "always", "unless-stopped")


@check("one IPC namespace: ipc shareable on the daemon and service:DAEMON on each engine, or host on all")
def _():
    d = daemon_name()
    ipc = SV[d].get("ipc")
    for e in engine_names():
        if ipc == "host":
            assert SV[e].get("ipc") == "host", e
        else:
            assert ipc == "shareable", ipc
            assert SV[e].get("ipc") == f"service:{d}", (e, SV[e].get("ipc"))
            assert SV[e].get("depends_on", {}).get(d), f"{e} must start after {d}"


@check("shm_size on the namespace's owner, at least the pool's capacity default, and set with it")
def _():
    d = SV[daemon_name()]
    if d.get("ipc") == "host":
        return "SKIP ipc: host uses the host's /dev/shm"
    cmd = d["command"]
    cap = cmd[cmd.index("--capacity") + 1]
    default = cap.split(":-")[1].rstrip("}") if ":-" in cap else cap
    shm = default_of(d["shm_size"])
    assert size(shm) > size(default.replace("GiB", "g").replace("MiB", "m")), (d["shm_size"], default)
    if ":-" in cap:  # a capacity from the environment needs a /dev/shm size from it too
        assert str(d["shm_size"]).startswith("${") and ":-" in str(d["shm_size"]), \
            f"--capacity is {cap} but shm_size is fixed at {d['shm_size']}: a larger capacity cannot be created"


@check("cap_add SYS_NICE (mbind/set_mempolicy under Docker's seccomp profile) on daemon and engines")
def _():
    for n in [daemon_name(), *engine_names()]:
        assert "SYS_NICE" in (SV[n].get("cap_add") or []), n


@check("the engines may open the pool: the daemon's uid, or a group the pool is created for")
def _():
    d = SV[daemon_name()]
    cmd = d["command"]
    group = cmd[cmd.index("--group") + 1] if "--group" in cmd else None
    for e in engine_names():
        u = str(SV[e].get("user", "root"))
        same_uid = u.split(":")[0] == str(d.get("user", "root")).split(":")[0]
        in_group = group is not None and (u.split(":")[1:] == [group] or group in map(str, SV[e].get("group_add", [])))
        assert same_uid or in_group, (e, u, d.get("user"), group)


@check("the engines' kv-transfer-config: standalone on the daemon's pool, kv_load_failure_policy recompute")
def _():
    cmd = SV[daemon_name()]["command"]
    for e in engine_names():
        c = kv_config(SV[e])
        assert c["kv_connector"] == "UMBPStoreConnector" and c["kv_connector_module_path"] == "umbp.vllm", c
        x = c["kv_connector_extra_config"]
        assert x["mode"] == "standalone" and x["pool"] == cmd[1], (x, cmd[1])
        assert c["kv_load_failure_policy"] == "recompute", c
        assert "--enable-prefix-caching" in SV[e]["command"]


# config.json fields of the models an engine may default to (what 'umbp size' reads)
MODELS = {"meta-llama/Llama-3.1-8B-Instruct": dict(layers=32, kv_heads=8, head_dim=128, dtype_bytes=2)}


def default_of(v):
    v = str(v)
    return v.split(":-", 1)[1].rstrip("}") if ":-" in v else v


@check("the daemon's default --slot-size holds the default model's block at the default TP (vLLM refuses less)")
def _():
    cmd = SV[daemon_name()]["command"]
    slot = size(default_of(cmd[cmd.index("--slot-size") + 1]).replace("iB", ""))
    for e in engine_names():
        ec = SV[e]["command"]
        model = default_of(ec[ec.index("serve") + 1])
        tp = int(default_of(ec[ec.index("--tensor-parallel-size") + 1])) if "--tensor-parallel-size" in ec else 1
        assert model in MODELS, f"{e} serves {model} by default: add its config.json fields to MODELS"
        m = MODELS[model]
        # umbp size: layers x 2 (K,V) x 16 tokens x max(1, kv_heads / tp) x head_dim x dtype, rounded to 4 KiB
        block = m["layers"] * 2 * 16 * max(1, m["kv_heads"] // tp) * m["head_dim"] * m["dtype_bytes"]
        block = (block + 4095) // 4096 * 4096
        assert slot >= block, f"--slot-size {slot} bytes < the {block} that {model} at TP {tp} needs ({e})"


@check("the Dockerfile and targets the services build exist")
def _():
    root = os.path.join(os.path.dirname(os.path.abspath(COMPOSE)))
    for n, s in SV.items():
        b = s.get("build")
        if not b:
            continue
        path = os.path.normpath(os.path.join(root, b["context"], b["dockerfile"]))
        with open(path) as f:
            text = f.read()
        assert f" AS {b['target']}" in text, (n, b["target"])


@check("the build context leaves out the test venvs, build directories and .git (.dockerignore)")
def _():
    import fnmatch
    for n, s in SV.items():
        b = s.get("build")
        if not b:
            continue
        ctx = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(COMPOSE)), b["context"]))
        # BuildKit reads DOCKERFILE.dockerignore first, else .dockerignore at the context's root
        for name in (b["dockerfile"] + ".dockerignore", ".dockerignore"):
            path = os.path.join(ctx, name)
            if os.path.exists(path):
                break
        else:
            raise AssertionError(f"{n}: no .dockerignore in {ctx}: COPY . /src would send .venv and build dirs")
        with open(path) as f:
            pats = [ln.strip().lstrip("/") for ln in f if ln.strip() and not ln.startswith("#")]
        for top in (".venv", ".venv-cpu", "build", "build-asan", ".git"):
            assert any(fnmatch.fnmatchcase(top, p) for p in pats), f"{path} does not leave out {top}"
        for kept in ("meson.build", "pyproject.toml", "src", "python", "tools", "include", "contrib"):
            assert not any(fnmatch.fnmatchcase(kept, p) for p in pats), f"{path} leaves out {kept}"


sys.exit(taplib.run(checks))
