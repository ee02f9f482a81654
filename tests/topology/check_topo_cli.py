#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Runs `umbp topo` and checks its output against the JSON schema documented
in tools/cmd_topo.c and docs/topo.md (umbp-topo/1), plus its exit codes.

Environment (set by tests/meson.build): UMBP_TOOL = the umbp binary,
UMBP_SHARED_DATA = ../shared/data (real hwloc XML topologies). Prints TAP.
"""
import json
import os
import re
import subprocess
import sys
import traceback

TOOL = os.environ.get("UMBP_TOOL", "")
DATA = os.path.join(os.environ.get("UMBP_SHARED_DATA", ""), "topologies")
have_data = os.path.isdir(DATA)

results = []


def check(name):
    """Decorator: register a check; it returns None, or 'SKIP reason'."""
    def deco(fn):
        results.append((name, fn))
        return fn
    return deco


# ASan builds: hwloc's PCI plugin leaks inside hwloc_topology_load (lsan.supp).
SUPP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lsan.supp")
ENV = dict(os.environ)
ENV["LSAN_OPTIONS"] = ":".join(filter(None, [ENV.get("LSAN_OPTIONS"), f"suppressions={SUPP}"]))
ENV["ASAN_OPTIONS"] = ":".join(filter(None, [ENV.get("ASAN_OPTIONS"), "fast_unwind_on_malloc=0"]))


def run(*args):
    p = subprocess.run([TOOL, "topo", *args], capture_output=True, text=True, timeout=60, env=ENV)
    return p.returncode, p.stdout, p.stderr


def run_on_xml(tag, body, *args):
    """`umbp topo --xml FILE ARGS` on a temporary file holding body:
    (rc, stdout, stderr, FILE); the file is removed."""
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"umbp-topo-cli-{tag}-{os.getpid()}.xml")
    with open(path, "w") as f:
        f.write(body)
    try:
        return (*run("--xml", path, *args), path)
    finally:
        os.unlink(path)


# cuda0's element in tests/topology/unplaced-gpu.xml, which checks replace to craft GPUs
CUDA0 = '<object type="OSDev" gp_index="32" name="cuda0" subtype="CUDA" osdev_type="5"/>'


def unplaced_fixture():
    """The text of tests/topology/unplaced-gpu.xml (which holds CUDA0)."""
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "unplaced-gpu.xml")) as f:
        text = f.read()
    assert CUDA0 in text
    return text


def topo_json(*args):
    rc, out, err = run("--json", *args)
    assert rc == 0, f"exit {rc}: {err}"
    assert out.count("\n") == 1, "JSON output is one line"
    return json.loads(out)


def xml(name):
    return os.path.join(DATA, name)


def ints(v):
    return isinstance(v, list) and all(isinstance(x, int) and x >= 0 for x in v)


def check_schema(d):
    """Every field of umbp-topo/1, with its type, and the plan invariants."""
    assert d["schema"] == "umbp-topo/1"
    m, p = d["machine"], d["plan"]
    assert isinstance(m["source"], str) and isinstance(m["live"], bool)
    for k in ("packages", "cores", "pus"):
        assert isinstance(m[k], int) and m[k] >= 0, k
    assert m["pus"] >= 1 and len(m["numa_nodes"]) >= 1
    nodes = {}
    for n in m["numa_nodes"]:
        assert set(n) == {"os_index", "memory_bytes", "cores", "pus"}, n.keys()
        assert ints(n["pus"]) and n["memory_bytes"] >= 0
        nodes[n["os_index"]] = set(n["pus"])
    assert sorted(nodes) == [n["os_index"] for n in m["numa_nodes"]]
    gpus = m["gpus"]
    for i, g in enumerate(gpus):
        assert set(g) == {"index", "name", "pci_bus_id", "vendor", "model", "cuda_ordinal",
                          "source", "placed", "numa_nodes", "local_pus"}, g.keys()
        assert g["index"] == i
        assert g["source"] in ("cudart", "hwloc-cuda", "hwloc-nvml")
        assert g["cuda_ordinal"] is None or isinstance(g["cuda_ordinal"], int)
        assert ints(g["numa_nodes"]) and ints(g["local_pus"])
        assert all(n in nodes for n in g["numa_nodes"])
        if not g["placed"]:
            assert g["numa_nodes"] == [] and g["local_pus"] == []
    assert all(isinstance(s, str) for s in m["notes"])
    assert isinstance(p["threads_per_rank"], int) and p["threads_per_rank"] >= 1
    assert ints(p["numa_nodes"]) and p["numa_nodes"] == sorted(set(p["numa_nodes"]))
    ranks = p["ranks"]
    assert len(ranks) >= 1
    for i, r in enumerate(ranks):
        assert set(r) == {"rank", "gpu", "gpu_name", "numa_node", "gpu_local", "cpus",
                          "shared_cpus", "mempolicy", "mem_nodes", "notes"}, r.keys()
        assert r["rank"] == i
        assert r["numa_node"] in nodes and r["numa_node"] in p["numa_nodes"]
        assert r["mempolicy"] in ("bind", "preferred", "interleave", "default")
        assert ints(r["cpus"]) and 1 <= len(r["cpus"]) <= p["threads_per_rank"]
        assert len(set(r["cpus"])) == len(r["cpus"])
        assert ints(r["mem_nodes"]) and (r["mempolicy"] == "default") == (r["mem_nodes"] == [])
        assert len(r["notes"]) >= 3 and all(isinstance(s, str) for s in r["notes"])
        if r["gpu"] == -1:
            assert r["gpu_name"] is None and not r["gpu_local"]
        else:
            g = gpus[r["gpu"]]
            assert r["gpu_name"] == g["name"]
            if r["gpu_local"]:
                assert r["numa_node"] in g["numa_nodes"]
                assert set(r["cpus"]) <= set(g["local_pus"])
        if nodes[r["numa_node"]] and (r["gpu"] == -1 or r["gpu_local"]):
            assert set(r["cpus"]) <= nodes[r["numa_node"]], (r["cpus"], r["numa_node"])
    for a in ranks:
        for b in ranks:
            if a is not b and set(a["cpus"]) & set(b["cpus"]):
                assert a["shared_cpus"] and b["shared_cpus"], (a["rank"], b["rank"])
    assert all(isinstance(s, str) for s in p["notes"])
    return m, p


def need_data():
    if not have_data:
        return f"SKIP topology data not found in {DATA} (set UMBP_SHARED_DATA)"
    return None


@check("help: exit 0, the Usage/Options/Exit status/Examples layout of every umbp --help")
def _():
    rc, out, _ = run("--help")
    assert rc == 0
    for s in ("Usage: umbp topo", "Options:", "--xml", "--ranks", "--gpus",
              "--threads-per-rank", "--json", "--explain", "JSON schema", "Exit status:", "Examples:",
              "--mempolicy", "--no-cuda", "--help"):
        assert s in out, s
    # every value --mempolicy takes is in the text, the alias 'none' too (it was only in an error message)
    opts = out.split("--mempolicy POLICY", 2)[2].split("--no-cuda")[0]
    for v in ("auto", "bind", "preferred", "interleave", "default", "none"):
        assert v in opts, v
        rc, _, err = run("--mempolicy", v, "--json")
        assert rc == 0, (v, err)


@check("live machine: JSON parses and follows the schema")
def _():
    d = topo_json()
    m, p = check_schema(d)
    assert m["live"] and m["source"] == "this machine"


@check("power8: cuda0,cuda1 on node 0, cuda2,cuda3 on node 1; plan local and disjoint")
def _():
    if need_data():
        return need_data()
    m, p = check_schema(topo_json("--xml", xml("power8gpudistances.xml")))
    assert not m["live"] and m["packages"] == 2
    assert [g["name"] for g in m["gpus"]] == ["cuda0", "cuda1", "cuda2", "cuda3"]
    assert [g["numa_nodes"] for g in m["gpus"]] == [[0], [0], [1], [1]]
    assert [r["numa_node"] for r in p["ranks"]] == [0, 0, 1, 1]
    assert [r["gpu"] for r in p["ranks"]] == [0, 1, 2, 3]
    assert not any(r["shared_cpus"] for r in p["ranks"])
    assert p["numa_nodes"] == [0, 1]


@check("power8 --gpus 2,3: both ranks on node 1")
def _():
    if need_data():
        return need_data()
    _, p = check_schema(topo_json("--xml", xml("power8gpudistances.xml"), "--gpus", "2,3"))
    assert [r["numa_node"] for r in p["ranks"]] == [1, 1]
    assert p["numa_nodes"] == [1]


@check("power8 --ranks 12 --threads-per-rank 3: shared cores flagged")
def _():
    if need_data():
        return need_data()
    _, p = check_schema(topo_json("--xml", xml("power8gpudistances.xml"), "--ranks", "12",
                                  "--threads-per-rank", "3"))
    assert any(r["shared_cpus"] for r in p["ranks"])
    assert any("scarce" in n for n in p["notes"])


@check("32em64t: one GPU, cuda0 at 0000:84:00.0 on node 1")
def _():
    if need_data():
        return need_data()
    m, p = check_schema(topo_json("--xml", xml("32em64t-2n8c2t-pci-normalio.xml")))
    assert len(m["gpus"]) == 1
    g = m["gpus"][0]
    assert g["name"] == "cuda0" and g["pci_bus_id"] == "0000:84:00.0" and g["numa_nodes"] == [1]
    assert len(p["ranks"]) == 1 and p["ranks"][0]["numa_node"] == 1


@check("96em64t (GPU without CUDA): fallback over 4 nodes, note")
def _():
    if need_data():
        return need_data()
    m, p = check_schema(topo_json("--xml", xml("96em64t-4n4d3ca2co-pci.xml")))
    assert m["gpus"] == [] and len(m["numa_nodes"]) == 4
    assert any("card0" in n for n in m["notes"])
    assert [r["numa_node"] for r in p["ranks"]] == [0, 1, 2, 3]
    assert all(r["gpu"] == -1 for r in p["ranks"])
    assert any("no CUDA GPU found" in n for n in p["notes"])


@check("24em64t (no GPU): --ranks 5 round-robin, disjoint")
def _():
    if need_data():
        return need_data()
    m, p = check_schema(topo_json("--xml", xml("24em64t-2n6c2t-pci.xml"), "--ranks", "5"))
    assert m["gpus"] == []
    assert [r["numa_node"] for r in p["ranks"]] == [0, 1, 0, 1, 0]
    assert not any(r["shared_cpus"] for r in p["ranks"])
    assert any("round-robin" in n for n in p["notes"])


@check("own fixture: a GPU hwloc cannot place gets a valid plan and a note")
def _():
    fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unplaced-gpu.xml")
    m, p = check_schema(topo_json("--xml", fixture))
    assert [g["placed"] for g in m["gpus"]] == [True, False]
    assert [r["numa_node"] for r in p["ranks"]] == [1, 0]
    assert any("cannot place GPU 1" in n for n in p["notes"])


@check("tables: summary and one row per rank; --explain adds reasons")
def _():
    if need_data():
        return need_data()
    rc, out, _ = run("--xml", xml("power8gpudistances.xml"))
    assert rc == 0 and "NUMA nodes with memory" in out and "0002:01:00.0" in out
    assert "why:" not in out
    rc, out, _ = run("--xml", xml("power8gpudistances.xml"), "--explain")
    assert rc == 0 and out.count("why:") >= 12


@check("usage errors exit 2 and name the fix")
def _():
    cases = [(["--ranks", "0"], "--ranks"), (["--ranks", "x"], "--ranks"),
             (["--ranks", "2", "--gpus", "0,1"], "exclusive"), (["--gpus", "a,b"], "--gpus"),
             (["--threads-per-rank", "0"], "--threads-per-rank"), (["--mempolicy", "x"], "policy"),
             (["--bogus"], "unknown option"), (["--xml"], "needs a value"), (["stray"], "unexpected"),
             (["--xml", ""], "--xml needs a file name"), (["--json=1"], "'--json' takes no value"),
             (["--help=x"], "'--help' takes no value"),
             # strtol alone takes a leading space or sign: a number is digits only
             (["--ranks", " 2"], "--ranks"), (["--ranks", "+2"], "--ranks"), (["--gpus", "0,+1"], "--gpus"),
             (["--gpus", " 0,1"], "--gpus"), (["--threads-per-rank", "+1"], "--threads-per-rank"),
             # one entry more than a plan has ranks: the limit is named, the 8 KB list not echoed whole
             (["--gpus", ",".join(["0"] * 4097)], "at most 4096, such as 0,1,2,3 (got '0,0,")]
    if have_data:
        cases.append((["--xml", xml("power8gpudistances.xml"), "--gpus", "0,7"], "GPU 7"))
        cases.append((["--xml", xml("24em64t-2n6c2t-pci.xml"), "--gpus", "0"], "no CUDA GPU"))
    for args, needle in cases:
        rc, out, err = run(*args)
        assert rc == 2, (args, rc, err)
        assert needle in err and "--help" in err, (args, err)
        assert out == "", (args, out)


@check("runtime errors exit 1: missing and unparsable XML")
def _():
    rc, out, err = run("--xml", "/nonexistent/topo.xml")
    assert rc == 1 and "does not exist" in err and out == "", err
    rc, out, err, bad = run_on_xml("bad", "<topology version=\"2.0\"><object", "--json")
    assert rc == 1 and bad in err and out == "", err



@check("--xml of a device, a directory or a huge file: exit 1 at once, naming the file and the cause")
def _():
    big = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"umbp-topo-cli-big-{os.getpid()}.xml")
    with open(big, "w") as f:
        f.truncate(64 << 20)  # sparse
    try:
        # /dev/zero grew hwloc's buffer to 8.5 GB in 3 s, /dev/full hung
        for path, cause in (("/dev/zero", "is a character device"), ("/dev/full", "is a character device"),
                            ("/tmp", "is a directory"), (big, "over the 16 MiB")):
            p = subprocess.run([TOOL, "topo", "--xml", path], capture_output=True, text=True, timeout=10, env=ENV)
            assert p.returncode == 1 and f"'{path}'" in p.stderr and cause in p.stderr, (path, p.returncode, p.stderr)
            assert p.stdout == "", p.stdout
    finally:
        os.unlink(big)


@check("a crafted XML (every os_index 4294967295) is refused at once, before allocating")
def _():
    body = re.sub(r'os_index="[0-9]+"', 'os_index="4294967295"', unplaced_fixture())
    # (no ulimit -v here: ASan builds reserve terabytes of address space)
    rc, out, err, bad = run_on_xml("crafted", body, "--ranks", "64")
    assert rc == 1 and "OS index 4294967295" in err and bad in err and out == "", (rc, err[-400:])

@check("an XML nested 20000 deep is refused, naming the file (hwloc's importer overflowed the stack)")
def _():
    sets = 'cpuset="0x1" complete_cpuset="0x1" nodeset="0x1" complete_nodeset="0x1"'
    levels = 20000
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n<topology version="2.0">\n'
            f'<object type="Machine" os_index="0" {sets}>\n'
            f'<object type="NUMANode" os_index="0" {sets} local_memory="1073741824"/>\n'
            + f'<object type="Group" {sets}>\n' * levels + f'<object type="PU" os_index="0" {sets}/>\n'
            + '</object>\n' * levels + '</object>\n</topology>\n')
    rc, out, err, bad = run_on_xml("deep", body)
    assert rc == 1 and "nests its elements more than" in err and bad in err and out == "", (rc, err[-400:])


@check("GPU names and models from an XML that hold a terminal escape: the tables show '?' for it")
def _():
    evil = ('<object type="OSDev" gp_index="32" name="cu\x1b[2Jda0" subtype="CUDA" osdev_type="5">\n'
            '<info name="GPUModel" value="Evil\x1b]0;owned\x07GPU"/>\n</object>')
    rc, out, err, _ = run_on_xml("escape", unplaced_fixture().replace(CUDA0, evil))
    assert rc == 0, (rc, err)
    assert "\x1b" not in out and "\x07" not in out, repr(out[:600])
    assert "Evil?]0;owned?GPU" in out and "0 (cu?[2Jda0)" in out, out


@check("an XML with more GPUs than a plan has ranks is refused (one rank per GPU went past 4096, quadratic)")
def _():
    fixture = unplaced_fixture()

    def with_gpus(extra):
        # extra CUDA OS devices beside cuda0 (2 + extra GPUs in all)
        devs = "".join(f'<object type="OSDev" name="cuda{i}" subtype="CUDA" osdev_type="5"/>\n'
                       for i in range(2, 2 + extra))
        path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"umbp-topo-cli-gpus{extra}-{os.getpid()}.xml")
        with open(path, "w") as f:
            f.write(fixture.replace(CUDA0, CUDA0 + "\n" + devs))
        return path

    bad, ok = with_gpus(4095), with_gpus(4094)
    try:
        rc, out, err = run("--xml", bad)
        assert rc == 1 and "4097 GPUs" in err and "more than the 4096 ranks" in err and bad in err, (rc, err[-400:])
        assert out == "", out[:200]
        # 4096 GPUs: the default plan's 4096 ranks, one per GPU
        d = topo_json("--xml", ok)
        assert len(d["machine"]["gpus"]) == 4096 and len(d["plan"]["ranks"]) == 4096
    finally:
        os.unlink(bad)
        os.unlink(ok)


@check("an XML without a NUMA node: exit 1 naming the file, not a stale errno ('No such file or directory')")
def _():
    body = re.sub(r'<object type="NUMANode"[^>]*>\s*<page_type[^>]*/>\s*</object>\s*', "", unplaced_fixture())
    assert "NUMANode" not in body
    rc, out, err, bad = run_on_xml("nonuma", body)
    assert rc == 1 and f"could not parse '{bad}'" in err and out == "", (rc, err)
    assert "No such file" not in err, err


def bitmap(bits):
    """hwloc's bitmap syntax: 32-bit words, most significant first, zero words empty."""
    words = [0] * (max(bits) // 32 + 1)
    for b in bits:
        words[b // 32] |= 1 << (b % 32)
    return ",".join(f"0x{w:08x}" if w else "" for w in reversed(words))


@check("many ranks of many copy threads on a 2048-PU node: planned in seconds")
def _():
    npus = 2048
    every, node = bitmap(range(npus)), 'nodeset="0x1" complete_nodeset="0x1"'
    body = ['<?xml version="1.0" encoding="UTF-8"?>\n<topology version="2.0">\n',
            f'<object type="Machine" os_index="0" cpuset="{every}" complete_cpuset="{every}" {node}>\n',
            f'<object type="Package" os_index="0" cpuset="{every}" complete_cpuset="{every}" {node}>\n',
            f'<object type="NUMANode" os_index="0" cpuset="{every}" complete_cpuset="{every}" {node} '
            'local_memory="1073741824"/>\n']
    for c in range(npus // 2):
        pair = bitmap([2 * c, 2 * c + 1])
        body.append(f'<object type="Core" os_index="{c}" cpuset="{pair}" complete_cpuset="{pair}" {node}>')
        for pu in (2 * c, 2 * c + 1):
            one = bitmap([pu])
            body.append(f'<object type="PU" os_index="{pu}" cpuset="{one}" complete_cpuset="{one}" {node}/>')
        body.append("</object>\n")
    body.append("</object>\n</object>\n</topology>\n")
    path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"umbp-topo-cli-wide-{os.getpid()}.xml")
    with open(path, "w") as f:
        f.write("".join(body))
    try:
        # 64 ranks x 1024 threads want 32 times the PUs there are: each rank shares, picking its least-used PUs
        # one at a time; the picks must cost no more than sorting the candidates once, not a pass over the rank's
        # PUs per candidate per pick (K x |C| x K per rank)
        p = subprocess.run([TOOL, "topo", "--xml", path, "--ranks", "64", "--threads-per-rank", "1024", "--json"],
                           capture_output=True, text=True, timeout=30, env=ENV)
        assert p.returncode == 0, p.stderr[-400:]
        ranks = json.loads(p.stdout)["plan"]["ranks"]
        assert len(ranks) == 64 and all(len(r["cpus"]) == 1024 and r["shared_cpus"] for r in ranks)
        assert all(len(set(r["cpus"])) == 1024 for r in ranks)
    finally:
        os.unlink(path)


@check("HWLOC_XMLFILE (hwloc loads it for this machine) is read and checked as --xml is, and named")
def _():
    def live(value):
        env = dict(ENV, HWLOC_XMLFILE=value)
        env.pop("HWLOC_FSROOT", None)
        env.pop("HWLOC_SYNTHETIC", None)
        p = subprocess.run([TOOL, "topo", "--json"], capture_output=True, text=True, timeout=20, env=env)
        return p.returncode, p.stdout, p.stderr
    # /dev/zero: hwloc read it until memory ran out
    rc, out, err = live("/dev/zero")
    assert rc == 1 and "HWLOC_XMLFILE" in err and "'/dev/zero' is a character device" in err and out == "", err
    rc, out, err = live("/nonexistent/topo.xml")
    assert rc == 1 and "HWLOC_XMLFILE" in err and "does not exist" in err and out == "", err
    # a good file is still this machine's topology, with a note that says where it came from
    fixture = os.path.join(os.path.dirname(os.path.abspath(__file__)), "unplaced-gpu.xml")
    rc, out, err = live(fixture)
    assert rc == 0, err
    m, _ = check_schema(json.loads(out))
    assert m["live"] and len(m["gpus"]) == 2 and any("HWLOC_XMLFILE" in n and fixture in n for n in m["notes"])


def main():
    if not TOOL or not os.access(TOOL, os.X_OK):
        print("1..0 # SKIP UMBP_TOOL is not set to the umbp binary")
        return 0
    print(f"1..{len(results)}")
    failed = 0
    for i, (name, fn) in enumerate(results, 1):
        try:
            r = fn()
        except Exception:  # noqa: BLE001 - report any failure as TAP
            failed += 1
            print(f"not ok {i} - {name}")
            for line in traceback.format_exc().splitlines():
                print(f"# {line}")
            continue
        if isinstance(r, str) and r.startswith("SKIP"):
            print(f"ok {i} - {name} # {r}")
        else:
            print(f"ok {i} - {name}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
