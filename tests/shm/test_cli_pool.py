#!/usr/bin/env python3
"""`umbp pool` from the command line: exit codes, messages, --help, JSON."""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import taplib  # noqa: E402

TOOL = os.environ["UMBP_TOOL"]
HELPER = os.path.join(os.environ["UMBP_TEST_HELPER_DIR"], "shm", "pool_helper")
name = f"t-cli-{os.getpid()}"
# the layout version this build writes, read from the header that defines it
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "src", "shm", "layout.h")) as f:
    _defs = dict(line.split()[1:3] for line in f if line.startswith("#define UMBP_LAYOUT_M"))
LAYOUT = f"{_defs['UMBP_LAYOUT_MAJOR']}.{_defs['UMBP_LAYOUT_MINOR']}"
failures = []
n = 0


def umbp(*args):
    r = subprocess.run([TOOL, *args], capture_output=True, text=True, timeout=60)
    return r.returncode, r.stdout, r.stderr


def check(what, cond, detail=""):
    global n
    n += 1
    print(("ok" if cond else "not ok") + f" {n} - {what}" + ("" if cond else f" # {detail}"))
    if not cond:
        failures.append(what)


def wait_mapped(pid, pool, secs=60):
    """Whether process pid maps pool's segment within secs (its attach is done)."""
    end = time.monotonic() + secs
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/maps") as f:
                if f"/dev/shm/umbp.{pool}" in f.read():
                    return True
        except OSError:  # it ended
            return False
        time.sleep(0.01)
    return False


def wait_stopped(pid, secs=60):
    """Whether pid is stopped within secs: kill() returns before the target stops."""
    end = time.monotonic() + secs
    while time.monotonic() < end:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("T", "t"):
                    return True
        except OSError:  # it ended
            return False
        time.sleep(0.005)
    return False


try:
    for sub in ["create", "destroy", "ls", "info", "reap", "gc"]:
        rc, out, _ = umbp("pool", sub, "--help")
        check(f"pool {sub} --help", rc == 0 and "Usage: umbp pool " + sub in out and "Exit status" in out, out[:200])
    rc, out, _ = umbp("--help")
    check("umbp --help lists pool", rc == 0 and "pool" in out)
    rc, _, err = umbp("pool", "create", name)
    check("missing --capacity is a usage error", rc == 2 and "--capacity is required" in err, err)
    rc, _, err = umbp("pool", "create", "bad/name", "--capacity", "1GiB")
    check("bad name is a usage error", rc == 2 and "[A-Za-z0-9._-]" in err, err)
    # a name with bytes that do not print is refused without echoing them
    r = subprocess.run([TOOL.encode(), b"pool", b"create", b"a\xff\x1b[2Jb", b"--capacity", b"1MiB"],
                       capture_output=True, timeout=60)
    check("a name of raw bytes is refused naming the byte, not echoing it",
          r.returncode == 2 and b"byte 0xff at position 2" in r.stderr and b"\xff" not in r.stderr
          and b"\x1b" not in r.stderr, r.stderr)
    rc, _, err = umbp("pool", "create", name, "--capacity", "lots")
    check("bad size is a usage error", rc == 2 and "not a size" in err, err)
    rc, _, err = umbp("pool", "create", name, "--capacity", "64MiB", "--bogus")
    check("unknown option is a usage error", rc == 2 and "--bogus" in err, err)
    # issue 32, smaller defects: every bad value is a usage error (exit 2) naming the option
    for args, word in [(["--slot-size", "100"], "--slot-size '100'"), (["--slot-size", "4097"], "--slot-size '4097'"),
                       (["--slot-size", "0"], "--slot-size '0'"), (["--slot-size", "8GiB"], "--slot-size '8GiB'"),
                       (["--numa-nodes", "0,0"], "--numa-nodes '0,0' lists node 0 twice"),
                       (["--capacity", "0x100000"], "--capacity '0x100000'"), (["--capacity", "1e9"], "--capacity '1e9'")]:
        full = ["--capacity", "64MiB", *args] if args[0] != "--capacity" else args
        rc, _, err = umbp("pool", "create", name, *full)
        check(f"{' '.join(args)} is a usage error naming the option",
              rc == 2 and word in err and not os.path.exists(f"/dev/shm/umbp.{name}"), err)
    # options that cannot make a pool on any machine are usage errors (exit 2) naming the option
    for args, word in [(["--capacity", "100TiB"], "at most 16777215 are supported"),
                       (["--capacity", "1B"], "raise --capacity"),
                       (["--capacity", "16MiB", "--slot-size", "16MiB"], "raise --capacity"),
                       (["--capacity", "16MiB", "--hugetlbfs", "/tmp"], "--hugetlbfs only makes sense with --hugepages"),
                       (["--capacity"], "option '--capacity' needs a value"),
                       (["--capacity", "16MiB", "--group", "99999999999"], "--group '99999999999'"),
                       (["--capacity", "16MiB", "--group", "4294967295"], "--group '4294967295'")]:
        rc, _, err = umbp("pool", "create", name, *args)
        check(f"{' '.join(args)}: usage error ({word})",
              rc == 2 and word in err and "Try 'umbp pool create --help'" in err
              and not os.path.exists(f"/dev/shm/umbp.{name}"), (rc, err))
    # larger than this machine's /dev/shm: a runtime error, refused before allocation
    shm = os.statvfs("/dev/shm")
    big = (shm.f_bavail * shm.f_frsize // (1 << 30) + 64) // 64 * 64
    rc, _, err = umbp("pool", "create", name, "--capacity", f"{big}GiB", "--slot-size", "64MiB")
    check("larger than /dev/shm is refused before allocation",
          rc == 1 and "--capacity" in err and not os.path.exists(f"/dev/shm/umbp.{name}"), (rc, err))
    # a name that commands would read as an option is refused where it would be made
    rc, _, err = umbp("pool", "create", "--capacity", "16MiB", "--", "-" + name)
    check("a name starting with '-' is refused", rc == 2 and "starts with '-'" in err
          and not os.path.exists(f"/dev/shm/umbp.-{name}"), (rc, err))
    # ... but one an older build made can still be listed and destroyed
    with open(f"/dev/shm/umbp.-{name}", "wb") as f:
        f.write(b"\0" * 4096)
    rc, out, err = umbp("pool", "ls")
    check("pool ls still lists a pool named '-...'", rc == 0 and f"-{name}" in out, out + err)
    rc, out, err = umbp("pool", "destroy", "--force", "--", "-" + name)
    check("pool destroy -- -NAME removes it", rc == 0 and not os.path.exists(f"/dev/shm/umbp.-{name}"), (rc, out, err))
    # a negative --stat interval is refused as a value, not as an unknown option '-1'
    for v in ("-1", "-0.5"):
        rc, _, err = umbp("inspect", name, "--stat", v)
        check(f"inspect --stat {v}: usage error naming the value and the range",
              rc == 2 and f"--stat '{v}'" in err and "0.1 to 86400" in err, (rc, err))
    # --events shows nothing under --stat and --prometheus: refused as their other conflicts are, not ignored
    for args in (["--stat", "--events", "3"], ["--events", "0", "--stat", "1"], ["--prometheus", "--events", "5"]):
        rc, out, err = umbp("inspect", name, *args)
        check(f"inspect {' '.join(args)}: usage error naming --events", rc == 2 and "--events" in err and not out
              and "Try 'umbp inspect --help'" in err, (rc, out, err))
    rc, _, err = umbp("pool", "create", name, "extra", "--capacity", "16MiB")
    check("too many arguments names the extra one", rc == 2 and "'extra' after pool NAME" in err, err)
    for sub in (["info", name, "x"], ["destroy", name, "x"], ["reap", name, "x"]):
        rc, _, err = umbp("pool", *sub)
        check(f"pool {sub[0]}: too many arguments names the extra one", rc == 2 and "'x' after pool NAME" in err, err)
    rc, _, err = umbp("pool", "reap", name, "--x")
    check("pool reap: an unknown option is named as one", rc == 2 and "unknown option '--x'" in err, err)
    rc, out, err = umbp("pool", "create", name, "--capacity", "64MiB", "--slot-size", "64KiB", "--no-prefault")
    check("create", rc == 0 and "1024 slots" in out, out + err)
    rc, _, err = umbp("pool", "create", name, "--capacity", "64MiB")
    check("second create fails with 'already exists'", rc == 1 and "already exists" in err, err)
    st = os.stat(f"/dev/shm/umbp.{name}")
    check("mode 0600", (st.st_mode & 0o777) == 0o600, oct(st.st_mode))
    rc, out, err = umbp("pool", "info", name, "--json")
    info = json.loads(out) if rc == 0 else {}
    check("info --json", rc == 0 and info.get("slot_count") == 1024 and info.get("slot_size") == 65536
          and info["slots"]["free"] == 1024 and info["layout"] == LAYOUT, out + err)
    rc, out, _ = umbp("pool", "ls", "--json")
    names = [p["name"] for p in json.loads(out)] if rc == 0 else []
    check("ls --json lists the pool", name in names, out[:300])
    # output that cannot be written is a runtime error, never a silent success
    for args in (["pool", "info", name], ["pool", "info", name, "--json"], ["pool", "ls"], ["pool", "ls", "--json"],
                 ["inspect", name], ["inspect", name, "--json"], ["--help"], ["--version"]):
        with open("/dev/full", "w") as full:
            r = subprocess.run([TOOL, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60)
        check(f"{' '.join(args)} > /dev/full: exit 1 and says why",
              r.returncode == 1 and "writing the output failed: No space left on device" in r.stderr,
              (r.returncode, r.stderr))
    for args in (["inspect", name, "--watch", "0.1"], ["inspect", name, "--stat", "0.1"]):
        with open("/dev/full", "w") as full:
            r = subprocess.run([TOOL, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=20)
        check(f"{' '.join(args)} > /dev/full ends (exit 1) instead of printing into nothing",
              r.returncode == 1 and "writing the output failed" in r.stderr, (r.returncode, r.stderr))
    # inspect's read-only attach does not keep destroy from removing the pool: --watch and --stat end,
    # saying so, instead of showing the removed pool (or the old one after a create of the same name)
    for args, recreate in ((["--watch", "0.1"], False), (["--stat", "0.1"], False), (["--watch", "0.1", "--json"], True)):
        w = subprocess.Popen([TOOL, "inspect", name, *args], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        # destroy once inspect has attached (a fixed sleep was too short on a loaded machine: the destroy came
        # first, and inspect failed to attach, or, stopped, attached to the new pool and never ended)
        check(f"inspect {' '.join(args)} attached within 60 s", wait_mapped(w.pid, name), w.poll())
        if recreate:  # stopped meanwhile, so that inspect sees only the new pool
            w.send_signal(signal.SIGSTOP)
            check("inspect stopped within 60 s", wait_stopped(w.pid), w.pid)
        umbp("pool", "destroy", name)
        if recreate:
            umbp("pool", "create", name, "--capacity", "32MiB", "--slot-size", "128KiB", "--no-prefault", "-q")
            w.send_signal(signal.SIGCONT)
        try:
            err = w.communicate(timeout=20)[1]
        except subprocess.TimeoutExpired:
            w.kill()
            err = w.communicate()[1] + " (still running 20 s after the destroy)"
        word = "now names another pool" if recreate else "was removed"
        check(f"inspect {' '.join(args)}: a pool destroyed{' and created again' if recreate else ''} ends it (exit 1)",
              w.returncode == 1 and f"pool '{name}' was destroyed while inspect watched it" in err and word in err
              and f"umbp inspect {name}" in err, (w.returncode, err))
        if not recreate:
            umbp("pool", "create", name, "--capacity", "64MiB", "--slot-size", "64KiB", "--no-prefault", "-q")
    umbp("pool", "destroy", name)
    umbp("pool", "create", name, "--capacity", "64MiB", "--slot-size", "64KiB", "--no-prefault", "-q")
    rc, _, err = umbp("--version", "extra")
    check("umbp --version takes no arguments", rc == 2 and "'extra'" in err, err)
    # 'umbp help pool' (as 'git help pull') is that command's help; it was a usage error naming no fix
    for args in (["help", "pool"], ["--help", "daemon"], ["-h", "inspect"]):
        rc, out, err = umbp(*args)
        check(f"umbp {' '.join(args)} prints that command's help", rc == 0 and out.startswith(f"Usage: umbp {args[1]}")
              and not err, (rc, err))
    rc, out, err = umbp("help", "bogus")
    check("umbp help bogus: usage error listing the commands", rc == 2 and "'bogus' is none of pool, topo" in err, err)
    # a live process keeps destroy from removing the pool
    holder = subprocess.Popen([HELPER, "hold", name], stdout=subprocess.PIPE, text=True)
    line = taplib.readline(holder)
    check("holder attached", line.startswith("ready"), line)
    rc, _, err = umbp("pool", "destroy", name)
    check("destroy refuses while a process is attached", rc == 1 and "live process" in err and str(holder.pid) in err, err)
    holder.kill()
    holder.wait()
    rc, out, _ = umbp("pool", "info", name, "--json")
    procs = json.loads(out)["processes"]
    check("info shows the killed holder as dead", any(p["pid"] == holder.pid and not p["alive"] for p in procs), out)
    rc, out, err = umbp("pool", "reap", name)
    check("reap", rc == 0 and "reaped 1" in out, out + err)
    rc, out, err = umbp("pool", "destroy", name)
    check("destroy", rc == 0 and not os.path.exists(f"/dev/shm/umbp.{name}"), out + err)
    rc, _, err = umbp("pool", "destroy", name)
    check("destroy of a missing pool", rc == 1 and "no pool named" in err, err)
    rc, _, err = umbp("pool", "info", name)
    check("info of a missing pool", rc == 1 and "umbp pool create" in err, err)
    # where the index goes: --index-pages, shown by create, info and info --json
    rc, _, err = umbp("pool", "create", name, "--capacity", "64MiB", "--index-pages", "big")
    check("bad --index-pages is a usage error", rc == 2 and "try, huge or small" in err, err)
    rc, out, err = umbp("pool", "create", name, "--capacity", "64MiB", "--slot-size", "64KiB", "--no-prefault",
                        "--index-pages", "small")
    check("create --index-pages small", rc == 0 and "index on 4 KiB pages" in out, out + err)
    rc, out, err = umbp("pool", "info", name)
    check("info names the index pages", rc == 0 and "index pages   4 KiB pages" in out, out + err)
    rc, out, err = umbp("pool", "info", name, "--json")
    info = json.loads(out) if rc == 0 else {}
    check("info --json: index on 4 KiB pages", info.get("index_hugepages") is False and info.get("index_huge_bytes") == 0,
          out + err)
    rc, out, err = umbp("pool", "ls")
    row = [ln for ln in out.splitlines() if ln.split()[:1] == [name]]
    check("ls: INDEX column says 4K", rc == 0 and "INDEX" in out and len(row) == 1 and row[0].split()[6] == "4K",
          out + err)
    rc, out, _ = umbp("pool", "ls", "--json")
    row = [r for r in json.loads(out) if r["name"] == name] if rc == 0 else []
    check("ls --json: index_hugepages false", len(row) == 1 and row[0]["index_hugepages"] is False, out)
    umbp("pool", "destroy", name)
    with open("/proc/mounts") as f:
        hdirs = [ln.split()[1] for ln in f if ln.split()[2] == "hugetlbfs"]
    meminfo = {ln.split(":")[0]: int(ln.split()[1]) for ln in open("/proc/meminfo") if ln.split()[1].isdigit()}
    # more index than all the huge pages hold (72 B a slot), not only the free ones: other processes give
    # pages back meanwhile, and an index sized to the free count then fitted
    all_pages = meminfo.get("HugePages_Total", 0)
    slots = all_pages * 2 * 1024 * 1024 // 72 + 65536
    if slots * 4096 < meminfo.get("MemAvailable", 0) * 1024 // 2:
        rc, out, err = umbp("pool", "create", name, "--capacity", str(slots * 4096), "--slot-size", "4KiB",
                            "--no-prefault", "--no-reserve")
        check("try without enough huge pages: created, index on 4 KiB pages, a note with the fix",
              rc == 0 and "index on 4 KiB pages" in out and "note:" in err and "re-create the pool" in err
              and "or use --index-pages small" not in err and (not hdirs or "nr_hugepages" in err), out + err)
        umbp("pool", "destroy", name)
    rc, out, err = umbp("pool", "create", name, "--capacity", "64MiB", "--slot-size", "64KiB", "--no-prefault",
                        "--index-pages", "huge")
    if rc == 0:
        rc2, out2, _ = umbp("pool", "info", name, "--json")
        info = json.loads(out2) if rc2 == 0 else {}
        path = f"{hdirs[0]}/umbp-index.{name}" if hdirs else ""
        check("create --index-pages huge: the index file on the hugetlbfs mount",
              "index on 2 MiB pages" in out and info.get("index_hugepages") is True
              and info.get("index_huge_bytes") == 2 << 20 and os.path.getsize(path) == 2 << 20, out + out2)
        rc, out, err = umbp("pool", "ls")
        row = [ln for ln in out.splitlines() if ln.split()[:1] == [name]]
        check("ls: INDEX column says 2M", len(row) == 1 and row[0].split()[6] == "2M", out + err)
        rc, out, err = umbp("pool", "destroy", name)
        check("destroy removes the index file", rc == 0 and not os.path.exists(path), out + err)
        # the main file removed alone: ls names the leftover index file, destroy removes it
        umbp("pool", "create", name, "--capacity", "64MiB", "--slot-size", "64KiB", "--no-prefault",
             "--index-pages", "huge")
        os.unlink(f"/dev/shm/umbp.{name}")
        rc, out, err = umbp("pool", "ls")
        check("ls names a leftover index file and the fix",
              rc == 0 and f"leftover index file {path}" in out and f"umbp pool destroy {name}" in out, out + err)
        rc, out, err = umbp("pool", "destroy", name)
        rc2, out2, _ = umbp("pool", "ls")
        check("destroy removes a leftover index file", rc == 0 and not os.path.exists(path) and name not in out2,
              out + err + out2)
        # a whole-hugepage pool is listed from the hugetlbfs mount
        rc, out, err = umbp("pool", "create", name, "--capacity", "4MiB", "--slot-size", "64KiB", "--hugepages", "-q")
        rc2, out2, _ = umbp("pool", "ls")
        row = [ln for ln in out2.splitlines() if ln.split()[:1] == [name]]
        check("ls lists a --hugepages pool", rc == 0 and len(row) == 1 and row[0].split()[6] == "2M"
              and row[0].endswith("ok"), out + err + out2)
        umbp("pool", "destroy", name)
    else:
        check("create --index-pages huge without huge pages fails naming the fix",
              rc == 1 and ("nr_hugepages" in err or "hugetlbfs" in err) and "--index-pages small" in err
              and not os.path.exists(f"/dev/shm/umbp.{name}"), err)
    rc, _, err = umbp("pool", "frobnicate")
    check("unknown subcommand", rc == 2, err)
    # --hugetlbfs DIR that is not a hugetlbfs mount (issue 32, item 9): refused, naming DIR, nothing left there
    plain = tempfile.mkdtemp(prefix="umbp-plain-")
    rc, out, err = umbp("pool", "create", name, "--capacity", "4MiB", "--slot-size", "64KiB", "--hugepages",
                        "--hugetlbfs", plain)
    check("--hugetlbfs on a plain directory is refused", rc == 1 and f"--hugetlbfs {plain} is not a hugetlbfs mount"
          in err and not os.listdir(plain), out + err)
    for f in os.listdir(plain):
        os.unlink(os.path.join(plain, f))
    os.rmdir(plain)
    # --no-prefault reserves the slot bytes (issue 32, item 12); --no-reserve does not, and warns
    rc, out, err = umbp("pool", "create", name, "--capacity", "64MiB", "--slot-size", "64KiB", "--no-prefault",
                        "--index-pages", "small")
    st = os.stat(f"/dev/shm/umbp.{name}")
    check("--no-prefault reserves the slot bytes", rc == 0 and st.st_blocks * 512 >= 64 << 20, f"{st.st_blocks} {err}")
    umbp("pool", "destroy", name)
    rc, out, err = umbp("pool", "create", name, "--capacity", "64MiB", "--slot-size", "64KiB", "--no-prefault",
                        "--no-reserve", "--index-pages", "small")
    st = os.stat(f"/dev/shm/umbp.{name}")
    check("--no-reserve: sparse, with a SIGBUS warning", rc == 0 and st.st_blocks * 512 < 32 << 20
          and "SIGBUS" in err, f"{st.st_blocks} {err}")
    umbp("pool", "destroy", name)
    rc, _, err = umbp("pool", "create", name, "--capacity", "64MiB", "--no-reserve")
    check("--no-reserve without --no-prefault is a usage error", rc == 2 and "--no-reserve" in err, err)
    # the kernel's own memory policy is 'default' to umbp topo and 'none' to pool create: each takes both
    rc, _, err = umbp("pool", "create", name, "--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault",
                      "--index-pages", "small", "--mempolicy", "default", "--quiet")
    check("pool create --mempolicy default (umbp topo's word) is none", rc == 0, err)
    umbp("pool", "destroy", name)
    rc, out, err = umbp("topo", "--mempolicy", "none", "--json")
    check("topo --mempolicy none (pool create's word) is default", rc == 0 and '"mempolicy":"default"' in
          out.replace(" ", ""), (rc, err))
    # SIGTERM (or Ctrl-C) while pre-faulting, or with --no-prefault while reserving the slot bytes
    # (fallocate), left the half-made file, its memory and its index file behind until the next
    # create or destroy; now they are removed and the command dies of the signal
    for how, extra in (("pre-faulting", []), ("reserving", ["--no-prefault"])):
        w = subprocess.Popen([TOOL, "pool", "create", name, "--capacity", "4GiB", "-q", *extra],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        seg = f"/dev/shm/umbp.{name}"
        for _ in range(3000):  # until the work is under way (64 MiB in)
            try:
                if os.stat(seg).st_blocks * 512 >= 64 << 20:
                    break
            except FileNotFoundError:
                pass
            time.sleep(0.005)
        w.send_signal(signal.SIGTERM)
        out, err = w.communicate(timeout=60)
        if w.returncode == 0:  # finished before the signal: nothing to check on this machine
            check(f"pool create stopped by SIGTERM while {how} (finished first: not checked)", True)
            umbp("pool", "destroy", name)
        elif f"after pool '{name}' was made: the pool is kept" in err:
            # the signal came after the pool was made (a fast machine): it is whole, and said so
            check(f"pool create ended by SIGTERM after the pool was made while {how}: kept, whole and said so",
                  w.returncode == -signal.SIGTERM and umbp("pool", "info", name)[0] == 0, (w.returncode, err))
            umbp("pool", "destroy", name)
        else:
            check(f"pool create stopped by SIGTERM while {how} removes the half-made pool",
                  w.returncode == -signal.SIGTERM and not os.path.exists(seg)
                  and f"the half-made pool '{name}' was removed" in err
                  and name not in umbp("pool", "ls")[1], (w.returncode, err))
    # the synopsis's '--prefault-threads N | --no-prefault': together, the threads did nothing, without a word
    rc, _, err = umbp("pool", "create", name, "--capacity", "64MiB", "--no-prefault", "--prefault-threads", "4")
    check("--prefault-threads with --no-prefault is a usage error naming both", rc == 2 and "--prefault-threads" in err
          and "--no-prefault" in err and "Try 'umbp pool create --help'" in err
          and not os.path.exists(f"/dev/shm/umbp.{name}"), err)
    # a creator killed while pre-faulting (issue 32, item 7): info fails at once naming the cause, create replaces it
    stall = subprocess.Popen([HELPER, "create-stall", name], stdout=subprocess.PIPE, text=True)
    line = taplib.readline(stall)
    stall.kill()
    stall.wait()
    t0 = time.monotonic()
    rc, _, err = umbp("pool", "info", name)
    check("info of a half-made pool fails at once: its creator died",
          line.strip() == "prefault" and rc == 1 and f"(pid {stall.pid}) died before finishing" in err
          and time.monotonic() - t0 < 5, err)
    rc, out, err = umbp("pool", "create", name, "--capacity", "64MiB", "--slot-size", "64KiB", "--no-prefault")
    check("create replaces a half-made pool, with a warning",
          rc == 0 and "1024 slots" in out and "warning:" in err and "left half-made" in err, out + err)
    umbp("pool", "destroy", name)
    # files named umbp.NAME that are not regular files: a FIFO used to hang ls, info and destroy for
    # ever; a directory was called "truncated" and its fix, 'umbp pool destroy', failed
    odd = {"fifo": "a FIFO", "dir": "a directory", "link": "a symbolic link"}
    for kind in odd:
        path = f"/dev/shm/umbp.{name}-{kind}"
        {"fifo": os.mkfifo, "dir": os.mkdir, "link": lambda p: os.symlink("/etc/hostname", p)}[kind](path)
    try:
        r = subprocess.run([TOOL, "pool", "ls"], capture_output=True, text=True, timeout=20)
        rows = {ln.split()[0]: ln for ln in r.stdout.splitlines() if ln.startswith(f"{name}-")}
        check("ls names a FIFO, a directory and a link called umbp.NAME as not pools, without hanging",
              r.returncode == 0 and all(f"is {odd[k]}, not a umbp pool" in rows.get(f"{name}-{k}", "")
                                        for k in odd), r.stdout + r.stderr)
        for kind in odd:
            # create: "a pool named ... already exists ... 'umbp pool destroy NAME'" (which fails on a
            # directory), or for a FIFO "cannot reset the half-made pool file": now as info says it
            for sub in ["info", "reap", "create"]:
                extra = ["--capacity", "1MiB", "--slot-size", "4KiB", "--no-prefault", "--index-pages", "small",
                         "-q"] if sub == "create" else []
                r = subprocess.run([TOOL, "pool", sub, f"{name}-{kind}", *extra], capture_output=True, text=True,
                                   timeout=20)
                check(f"pool {sub} of {odd[kind]} named umbp.NAME: exit 1 naming it and how to remove it",
                      r.returncode == 1 and f"is {odd[kind]}, not a umbp pool" in r.stderr
                      and ("'rm -r /dev/shm/umbp." if kind == "dir" else "'rm /dev/shm/umbp.") in r.stderr, r.stderr)
        r = subprocess.run([TOOL, "pool", "destroy", f"{name}-dir"], capture_output=True, text=True, timeout=20)
        check("destroy of a directory named umbp.NAME says how to remove it",
              r.returncode == 1 and f"'rm -r /dev/shm/umbp.{name}-dir'" in r.stderr
              and os.path.isdir(f"/dev/shm/umbp.{name}-dir"), r.stderr)
    except subprocess.TimeoutExpired as e:
        check("commands on a FIFO named umbp.NAME do not hang", False, str(e.cmd))
    finally:
        for kind in odd:
            path = f"/dev/shm/umbp.{name}-{kind}"
            if kind == "dir" and os.path.isdir(path):
                os.rmdir(path)
            elif os.path.lexists(path):
                os.unlink(path)
    # NAME.feed, NAME.tier, NAME.ipc are pool NAME's side files: a pool so named was removed by
    # 'umbp pool destroy NAME', and ls listed a live feed as a broken pool to destroy
    umbp("pool", "create", name, "--capacity", "1MiB", "--slot-size", "4KiB", "-q")
    for suf in ["feed", "tier", "ipc"]:
        rc, _, err = umbp("pool", "create", f"{name}.{suf}", "--capacity", "1MiB", "--slot-size", "4KiB", "-q")
        check(f"a pool named NAME.{suf} is refused", rc == 2 and f"ends in '.{suf}'" in err
              and not os.path.exists(f"/dev/shm/umbp.{name}.{suf}"), (rc, err))
    with open(f"/dev/shm/umbp.{name}.feed", "wb") as f:
        f.write(b"UMBPFEED" + bytes(4088))
    rc, out, err = umbp("pool", "ls")
    names = [ln.split()[0] for ln in out.splitlines()[1:] if ln.strip()]
    check("ls does not list a pool's feed as a pool", rc == 0 and name in names and f"{name}.feed" not in names,
          out + err)
    umbp("pool", "destroy", name)
    check("destroy removes the pool's feed", not os.path.exists(f"/dev/shm/umbp.{name}.feed"))
    # a FIFO named as a pool's notes (umbp-notes.NAME) used to hang ls, info and gc
    umbp("pool", "create", name, "--capacity", "1MiB", "--slot-size", "4KiB", "-q")
    os.mkfifo(f"/dev/shm/umbp-notes.{name}")
    try:
        for args in [("ls",), ("info", name), ("gc",), ("gc", name)]:
            r = subprocess.run([TOOL, "pool", *args], capture_output=True, text=True, timeout=20)
            # an unnamed gc also reports other garbage on this machine: only this pool's fate is checked
            check(f"pool {' '.join(args)} with a FIFO as the pool's notes: no notes, no hang",
                  r.returncode == 0 and (args != ("gc", name) or f"kept {name}" in r.stdout)
                  and f"removed embedded pool {name} " not in r.stdout, r.stdout + r.stderr)
    except subprocess.TimeoutExpired as e:
        check("commands on a pool whose notes are a FIFO do not hang", False, str(e.cmd))
    finally:
        os.unlink(f"/dev/shm/umbp-notes.{name}")
        umbp("pool", "destroy", name)
    # an unnamed gc looks at every notes file, not the first 256 it lists
    orphans = [f"/dev/shm/umbp-notes.{name}-o{i}" for i in range(300)]
    for o in orphans:
        open(o, "w").close()
    rc, out, err = umbp("pool", "gc")
    left = [o for o in orphans if os.path.exists(o)]
    check("pool gc removes 300 notes left without their pools", rc == 0 and not left, (rc, len(left), err[-300:]))
    for o in left:
        os.unlink(o)
finally:
    subprocess.run([TOOL, "pool", "destroy", "--force", name], capture_output=True)

print(f"1..{n}")
sys.exit(1 if failures else 0)
