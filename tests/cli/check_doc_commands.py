#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Every `umbp` command that a doc or an error message tells the user to run is
run here, and exits as the doc says (0 unless its comment says otherwise).

Docs: the `umbp ...` lines of README.md's and docs/*.md's code blocks (fenced
or indented), in file order, with the pool name replaced by a test name,
capacities shrunk to 16MiB and paths (/var/log, /etc/umbp, config.json) moved
to a temporary directory. Synopsis lines (with [OPTIONS] or NAME-style
placeholders) are not commands. A daemon started by a doc line is checked to
serve the pool, then stopped with SIGTERM (exit 0) before the next line.
Lines that cannot run here are listed in NOT_HERE with the reason; the rest
must pass.

Messages: every `'umbp ...'`, `` `umbp ...` `` and `(umbp ...)` in a string
of src/, tools/, the vLLM connector's python/umbp/vllm*.py and pool_notes.py and
the host tier's tier*.py and bench_tier.py (C literals split over lines are joined first) must be in MESSAGES: run in the state whose error suggests it
(pool missing, pool present), or marked as prose that names a command without
being one. A new suggestion fails the test until it is added there."""
import glob
import json
import os
import re
import shlex
import select
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(HERE, ".."))
import taplib  # noqa: E402

TOOL = os.path.abspath(os.environ["UMBP_TOOL"])
TMP = tempfile.mkdtemp(prefix="umbp-doccmd-")
POOL = f"t-doc-{os.getpid()}"
CAP = "16MiB"
LLAMA = os.path.join(TMP, "config.json")
with open(LLAMA, "w") as f:
    json.dump({"architectures": ["LlamaForCausalLM"], "hidden_size": 4096, "num_attention_heads": 32,
               "num_hidden_layers": 32, "num_key_value_heads": 8, "torch_dtype": "bfloat16"}, f)
with open(os.path.join(TMP, "kv.quotas"), "w") as f:
    f.write("chat 1MiB\n")
# a trace for the replay line `umbp size` prints (16-token blocks)
TRACE = os.path.join(TMP, "trace.jsonl")
with open(TRACE, "w") as f:
    for i in range(6):
        f.write(json.dumps({"timestamp": i, "input_length": 64, "output_length": 8,
                            "hash_ids": [1, 2, 3 + i % 2, 10 + i]}) + "\n")

# doc lines that cannot run on this machine, with the reason (matched as substrings)
NOT_HERE = {
    "../shared/data/traces/synthetic_trace.jsonl --capacity-sweep":
        "a 7-capacity sweep of a 2 GiB trace: minutes; the replay suite runs the trace",
    "bash scripts/setup.sh": "installs Debian packages and builds: the build this test runs in",
    "daemon kv-a": "the two pools of docs/cluster.md's two-host trial: suite cluster runs that setup",
    "daemon kv-b": "the two pools of docs/cluster.md's two-host trial: suite cluster runs that setup",
    "tier kv-": "the tiers of docs/cluster.md's two-host trial need Mooncake: suite cluster runs them",
}


def umbp(*args, timeout=120):
    r = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=timeout, cwd=TMP)
    return r.returncode, r.stdout, r.stderr


def daemon_pid():
    rc, out, _ = umbp("pool", "info", POOL, "--json")
    if rc:
        return None
    ds = [p["pid"] for p in json.loads(out)["processes"] if p["role"] == "daemon" and p["alive"]]
    return ds[0] if ds else None


def wait_gone(pid, s=10.0):
    end = time.time() + s
    while time.time() < end:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def destroy():
    subprocess.run([TOOL, "pool", "destroy", POOL, "--force"], capture_output=True)


# ---- docs ---------------------------------------------------------------------
def doc_lines():
    """(file, line number, command, expected exit) of every umbp line in a code block."""
    out = []
    for path in [os.path.join(SRC, "README.md"), *sorted(glob.glob(os.path.join(SRC, "docs", "*.md")))]:
        fenced = in_indent = False
        prev_blank = True
        for n, raw in enumerate(open(path), 1):
            if raw.lstrip().startswith("```"):
                fenced = not fenced
                continue
            indented = raw.startswith("    ") and not fenced and (prev_blank or in_indent)
            in_indent = indented
            prev_blank = not raw.strip()
            if not (fenced or indented):
                continue
            line = raw.strip()
            if line.startswith("$ "):
                line = line[2:]
            m = re.search(r"(?:^|&& )((?:\./build/tools/)?umbp (?:pool|daemon|inspect|size|topo|replay|bench|tier)\b.*)",
                          line)
            if not m:
                continue
            cmd, _, comment = m.group(1).partition("#")
            cmd = cmd.strip().rstrip("\\").strip()
            # 0, unless the comment states another status outright ("# exits 1");
            # "exit 1 when ..." describes a case, not this run
            m2 = re.match(r"\s*exits? (\d)\b", comment)
            want = int(m2.group(1)) if m2 and not re.search(r"\b(when|if|unless)\b", comment) else 0
            out.append((os.path.relpath(path, SRC), n, cmd, want))
    return out


def synopsis(cmd):
    words = shlex.split(cmd)[1:]
    return any(c in cmd for c in "[|") or any(
        re.fullmatch(r"[A-Z][A-Z_.]*(\.jsonl|\.svg)?", w) for w in words if not w.startswith("-"))


def localise(cmd):
    """The doc's command with this test's pool, sizes and paths."""
    a = shlex.split(cmd.replace("./build/tools/umbp", "umbp"))[1:]
    out = []
    i = 0
    while i < len(a):
        w = a[i]
        if w == "kv":
            w = POOL
        elif i > 0 and a[i - 1] == "--capacity":
            w = CAP
        elif i > 0 and a[i - 1] == "--pool" and a[i] == "kv":
            w = POOL
        elif i > 0 and a[i - 1] == "--log":
            w = os.path.join(TMP, "daemon.log")
        elif i > 0 and a[i - 1] == "--quota-file":
            w = os.path.join(TMP, "kv.quotas")
        elif i > 0 and a[i - 1] == "--model-config":
            w = LLAMA
        elif i > 0 and a[i - 1] == "--metrics":
            w = f"127.0.0.1:{taplib.free_port()}"
        elif i > 0 and a[i - 1] == "--slot-size" and a[0] == "daemon":
            w = "256KiB"
        out.append(w)
        i += 1
    if out[:2] == ["pool", "create"] and "--no-prefault" not in out:
        out.append("--no-prefault")
    return out


def run_daemon(args):
    """A daemon line: it must come up serving the pool; then SIGTERM, exit 0."""
    if "--foreground" in args:
        p = subprocess.Popen([TOOL, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=TMP)
        end = time.time() + 30
        while daemon_pid() != p.pid:
            if p.poll() is not None:
                return p.returncode, p.stderr.read()
            if time.time() >= end:
                # a daemon that never served the pool passed here as long as SIGTERM then ended it with 0
                p.kill()
                return 97, f"no daemon served the pool 30 s after the start (pid {p.pid}): {p.communicate()[1]}"
            time.sleep(0.05)
        p.send_signal(signal.SIGTERM)
        return p.wait(30), p.stderr.read()
    rc, out, err = umbp(*args)
    if rc:
        return rc, err
    pid = daemon_pid()
    if not pid:
        return 99, "no daemon serves the pool after: " + " ".join(args)
    os.kill(pid, signal.SIGTERM)
    return (0 if wait_gone(pid) else 98), err


def run_until_interrupted(args):
    """--watch / --stat run until Ctrl-C, which exits 0 (docs/operations.md)."""
    p = subprocess.Popen([TOOL, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=TMP)
    # Ctrl-C once it has drawn: its handler is in place before the first draw (a fixed sleep was too short on
    # a loaded machine, where SIGINT's default action ended it); no draw in 60 s: interrupted all the same
    select.select([p.stdout], [], [], 60)
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=30)
    return p.returncode, err if p.returncode else ""


def run_doc_line(cmd):
    args = localise(cmd)
    if args[0] == "daemon":
        return run_daemon(args)
    if args[0] == "inspect" and ("--watch" in args or "--stat" in args):
        return run_until_interrupted(args)
    if args[0] == "topo" and "--xml" in args:
        xml = os.path.join(TMP, args[args.index("--xml") + 1])
        if not os.path.exists(xml):
            r = subprocess.run(["lstopo-no-graphics", "--of", "xml", xml], capture_output=True)
            if r.returncode:
                return None, "lstopo-no-graphics (hwloc) is missing: cannot make the XML"
        if "--gpus" in args:
            rc, out, _ = umbp("topo", "--json")
            if len(json.loads(out)["machine"]["gpus"]) < 2:
                return None, "names GPUs 0,1: this machine has fewer"
    rc, out, err = umbp(*args, timeout=300)
    return rc, err


checks, check = taplib.registry()


@check("every umbp command in README.md and docs/*.md code blocks exits as the doc says")
def _():
    lines = doc_lines()
    assert len(lines) > 20, f"found only {len(lines)} doc commands: is the extraction broken?"
    ran = skipped = 0
    failed = []
    for path, n, cmd, want in lines:
        if synopsis(cmd):
            continue
        why = next((r for k, r in NOT_HERE.items() if k in cmd), None)
        if why:
            print(f"# {path}:{n}: not run here ({why}): {cmd}")
            skipped += 1
            continue
        rc, err = run_doc_line(cmd)
        if rc is None:
            print(f"# {path}:{n}: not run here ({err}): {cmd}")
            skipped += 1
            continue
        ran += 1
        print(f"# {path}:{n}: exit {rc}: {cmd}")
        if rc != want:
            failed.append(f"{path}:{n}: '{cmd}' exited {rc}, the doc says {want}: {err.strip()[:300]}")
    destroy()
    assert not failed, "\n".join(failed)
    assert ran >= 15, f"only {ran} doc commands ran"


# ---- error messages ---------------------------------------------------------------
# The vLLM connector's modules (split by concern: the standalone-pool error is in vllm_pool.py)
# and the host tier's (umbp tier, umbp bench tier)
CONNECTOR_PY = sorted(glob.glob(os.path.join(SRC, "python", "umbp", "vllm*.py")) +
                      glob.glob(os.path.join(SRC, "python", "umbp", "tier*.py")) +
                      [os.path.join(SRC, "python", "umbp", "pool_notes.py"),
                       os.path.join(SRC, "python", "umbp", "bench_tier.py")])

def suggestions():
    """{normalised template: [file:line]} of the commands quoted in message strings."""
    # a backslash ends a candidate: help texts wrap commands over "\n" escapes
    pat = re.compile(r"""(?<=['`(])umbp (?:pool|daemon|inspect|topo|size|replay|bench|tier)\b[^'`)\n"\\]*(?=['`)])""")
    files = (glob.glob(os.path.join(SRC, "src", "**", "*.c"), recursive=True) +
             glob.glob(os.path.join(SRC, "tools", "**", "*.c"), recursive=True) +
             CONNECTOR_PY)
    found = {}
    for f in files:
        text = open(f).read()
        if f.endswith(".c"):
            text = re.sub(r'"\s*\n\s*"', "", text)  # "a "\n "b" -> "a b": one literal
        for n, ln in enumerate(text.splitlines(), 1):
            s = ln.strip()
            if s.startswith(("/*", "*", "//", "#")) or '"' not in ln:
                continue
            for m in pat.findall(ln):
                t = re.sub(r"\{self\.name\}|\{a\.pool\}|%s", "NAME", m)
                found.setdefault(t, []).append(f"{os.path.relpath(f, SRC)}:{n}")
    return found


# template -> (state the message is given in, argv or None for prose, expected exit)
MESSAGES = {
    # no pool named NAME (attach, inspect, daemon without --capacity)
    "umbp pool create NAME --capacity SIZE": ("missing", ["pool", "create", POOL, "--capacity", CAP], 0),
    "umbp pool ls": ("missing", ["pool", "ls"], 0),
    "umbp daemon NAME --capacity SIZE": ("missing", "daemon", 0),  # vllm_config.py's standalone error
    # vllm_pool.py: a daemon's pool whose slots are too small, made again (after its 'pool destroy')
    "umbp daemon NAME --capacity SIZE --slot-size {size}": ("missing", "daemon --slot-size", 0),
    "umbp pool create NAME": ("missing", ["pool", "create", POOL, "--capacity", CAP], 0),
    # a pool that exists (stale, corrupted, of another layout, stuck)
    "umbp pool destroy NAME": ("present", ["pool", "destroy", POOL], 0),
    "umbp pool info NAME": ("present", ["pool", "info", POOL], 0),
    "umbp inspect NAME --check": ("present", ["inspect", POOL, "--check"], 0),
    "umbp inspect NAME --prometheus": ("present", ["inspect", POOL, "--prometheus"], 0),
    "umbp pool reap": ("present", ["pool", "reap", POOL], 0),
    "umbp pool destroy --force": ("present", ["pool", "destroy", POOL, "--force"], 0),
    "umbp pool destroy NAME, then umbp pool create NAME --capacity SIZE --slot-size NAME":
        ("present", "destroy+create", 0),
    "umbp pool info": ("present", ["pool", "info", POOL], 0),
    "umbp inspect": ("present", ["inspect", POOL], 0),
    "umbp inspect NAME": ("present", ["inspect", POOL], 0),
    # an embedded pool whose engine is gone (python/tests/test_pool_lifetime.py); run here on the
    # test's pool only: a bare gc would remove other tests' dead engines' pools while they look at them
    "umbp pool gc": ("present", ["pool", "gc", POOL], 0),
    # help pointers
    "umbp bench SUBCOMMAND --help": ("missing", ["bench", "index", "--help"], 0),
    "umbp pool SUBCOMMAND --help": ("missing", ["pool", "create", "--help"], 0),
    "umbp daemon --help": ("missing", ["daemon", "--help"], 0),  # a foreground daemon's usage error
    "umbp topoNAMENAME": ("missing", ["topo"], 0),  # 'umbp topo%s%s' to list the GPUs: plain topo here
    "umbp replay --block-tokens T": ("missing", None, 0),
    # prose that names a command or an option of one, not a command to run
    "umbp bench index": ("missing", None, 0),
    "umbp daemon": ("missing", None, 0),
    "umbp daemon --metrics": ("missing", None, 0),
    "umbp replay": ("missing", None, 0),
    "umbp pool create": ("missing", None, 0),  # "made by 'umbp pool create'"
    "umbp topo takes only options": ("missing", None, 0),
    # the host tier (needs Mooncake and runs until stopped: suite cluster runs it)
    "umbp tier": ("missing", None, 0),
    "umbp tier NAME": ("missing", None, 0),  # src/tier/tierq.c: the command that serves the table
    "umbp tier NAME --status": ("missing", None, 0),  # exits 1 where no tier ever served the pool
    "umbp bench tier": ("missing", None, 0),
    "umbp daemon POOL": ("missing", None, 0),  # tier --help: "beside its daemon (umbp daemon POOL)"
    "umbp pool destroy": ("missing", None, 0),  # "was destroyed (umbp pool destroy) under this tier"
}


@check("every umbp command quoted in a message of src/, tools/ and the vLLM connector is known here")
def _():
    unknown = {t: w for t, w in suggestions().items() if t not in MESSAGES}
    assert not unknown, "add these to MESSAGES in tests/cli/check_doc_commands.py: " + json.dumps(unknown)


@check("... and each one that is a command runs and exits 0 in the state its message is given in")
def _():
    failed = []
    for t, (state, argv, want) in MESSAGES.items():
        if argv is None:
            continue
        destroy()
        if state == "present":
            rc, _, err = umbp("pool", "create", POOL, "--capacity", CAP, "--no-prefault", "--quiet")
            assert rc == 0, err
        if argv == "daemon":
            rc, err = run_daemon(["daemon", POOL, "--capacity", CAP])
        elif argv == "daemon --slot-size":
            rc, err = run_daemon(["daemon", POOL, "--capacity", CAP, "--slot-size", "16KiB"])
        elif argv == "destroy+create":
            rc, _, err = umbp("pool", "destroy", POOL)
            if rc == 0:
                rc, _, err = umbp("pool", "create", POOL, "--capacity", CAP, "--slot-size", "256KiB", "--no-prefault")
        else:
            rc, _, err = umbp(*argv)
        print(f"# exit {rc}: '{t}' as umbp {argv}")
        if rc != want:
            failed.append(f"'{t}': exit {rc}: {err.strip()[:300]}")
    destroy()
    assert not failed, "\n".join(failed)


@check("the error messages that suggest commands say them as run above")
def _():
    destroy()
    rc, _, err = umbp("inspect", POOL)
    assert rc == 1 and f"'umbp pool create {POOL} --capacity SIZE'" in err and "'umbp pool ls'" in err, err
    rc, _, err = umbp("daemon")
    assert rc == 2 and "'umbp daemon NAME --capacity SIZE'" in err, err
    src = "".join(open(f).read() for f in CONNECTOR_PY)
    assert "`umbp daemon {self.name} --capacity SIZE`" in src


@check("the commands umbp size prints run: pool create, and replay with this model's block sizes")
def _():
    destroy()
    rc, out, err = umbp("size", "--model-config", LLAMA, "--tp", "2", "--tokens", "2000")
    assert rc == 0, err
    lines = {ln.split()[0]: ln.split(None, 1)[1] for ln in out.splitlines() if ln and not ln.startswith(" ")}
    create = shlex.split(lines["pool"].split("   (")[0].replace("NAME", POOL))
    assert create[:3] == ["umbp", "pool", "create"], create
    rc, _, err = umbp(*create[1:], "--no-prefault")
    assert rc == 0, err
    replay = shlex.split(lines["replay"].split(" (")[0].replace("TRACE.jsonl", TRACE))
    rc, out, err = umbp(*replay[1:])
    assert rc == 0 and "cache ratio" in out, (rc, out, err)
    destroy()


def cleanup():
    destroy()


rc = taplib.run(checks, after_each=None)
cleanup()
sys.exit(rc)
