#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`umbp tier`'s argument checks (python/umbp/tier_server.py), without
Mooncake: every bad argument is a usage error (exit 2) in the C commands' form
('umbp: ...' then "Try 'umbp tier --help'."), found before anything attaches
to a pool or imports Mooncake; a runtime error (a log file that cannot be
opened, a bad Mooncake config) exits 1 with a sentence; never a traceback.

A stand-in `mooncake` package on PYTHONPATH exits 7 when imported, so a test
sees whether the tier got as far as importing Mooncake (valid arguments do),
whether or not the real Mooncake is installed."""
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import taplib  # noqa: E402
from umbp.tier_server import parse_size, pool_name_error  # noqa: E402

TOOL = os.environ["UMBP_TOOL"]
TMP = tempfile.mkdtemp(prefix="umbp-tier-args-")
POOL = f"fb-args-{os.getpid()}"  # never created: no check here needs a pool
IMPORTED = 7  # exit status of the stand-in mooncake
TRY = "Try 'umbp tier --help'."

os.makedirs(os.path.join(TMP, "mooncake"))
with open(os.path.join(TMP, "mooncake", "__init__.py"), "w") as f:
    f.write("import sys\nsys.stderr.write('stand-in mooncake imported\\n')\nsys.exit(7)\n")
ENV = dict(os.environ, PYTHONPATH=TMP + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH")
                                         else ""))
checks, check = taplib.registry()


SANITIZED = os.environ.get("UMBP_SANITIZE", "none").replace("none", "")  # e.g. "address,undefined"


def tier(*args, pre=()):
    r = subprocess.run([*pre, TOOL, "tier", *args], capture_output=True, text=True, timeout=60, env=ENV)
    assert "Traceback" not in r.stderr, (args, r.stderr)
    return r.returncode, r.stdout, r.stderr


def usage(args, *words, pre=()):
    """ARGS are a usage error in the C form, naming WORDS, before Mooncake."""
    rc, out, err = tier(*args, pre=pre)
    assert rc == 2, (args, rc, err)
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 2 and lines[0].startswith("umbp: ") and lines[1] == TRY, (args, err)
    for w in words:
        assert w in lines[0], (args, w, err)
    assert "usage:" not in err and "error:" not in err, (args, err)


def write(name, text):
    p = os.path.join(TMP, name)
    with open(p, "w") as f:
        f.write(text)
    return p


@check("valid arguments get as far as importing Mooncake (the stand-in's exit 7)")
def _():
    for args in ([], ["--global-segment-size", "0", "--local-buffer-size", "1.5MiB"],
                 ["--global-segment-size", "16M", "--evict-free-pct", "100", "--writeback", "evict"],
                 ["--evict-free-pct", "0.5", "--queue", "4294967295", "--log", os.path.join(TMP, "log")]):
        rc, out, err = tier(POOL, *args)
        assert rc == IMPORTED and "stand-in mooncake imported" in err, (args, rc, err)


@check("--log FILE that cannot be opened: exit 1 naming the file, no traceback")
def _():
    for path, why in (("/nonexistent/x", "No such file or directory"), (TMP, "Is a directory")):
        rc, out, err = tier(POOL, "--log", path)
        assert rc == 1 and f"--log {path}" in err and why in err, (path, rc, err)


@check("sizes: the C CLI's units, whole bytes (parse_size)")
def _():
    KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
    for s, v in (("0", 0), ("4096", 4096), ("512B", 512), ("1K", KiB), ("1KB", KiB), ("1kib", KiB),
                 ("1.5MiB", 3 * MiB // 2), ("2 GB", 2 * GiB), ("1G", GiB), ("1TiB", TiB), ("3T", 3 * TiB),
                 (".5K", 512), ("2.", 2), ("1PiB", 1 << 50)):
        assert parse_size(s) == v, (s, parse_size(s), v)


@check("sizes: non-finite, exponent, fraction of a byte, garbage and too large are usage errors")
def _():
    for opt in ("--local-buffer-size", "--global-segment-size"):
        for bad in ("infG", "inf", "nan", "1e400G", "1e3", "0x10", "1.5", "0.1K", "1GiBs", "1 G B", "G", "",
                    " 1G", "1_000", "16385PiB", "99999999999999999999"):
            usage([POOL, f"{opt}={bad}"], opt, f"'{bad}'")


@check("the vLLM connector's sizes follow the same rule (vllm_config._parse_size: a ValueError naming the key)")
def _():
    from umbp.vllm_config import _parse_size
    assert _parse_size("64GiB", "capacity_bytes") == 64 << 30 and _parse_size(4096, "slot_size") == 4096
    assert _parse_size("1.5MiB", "slot_size") == 3 << 19
    for bad in ("infG", "1e400G", "-5M", "0.1K", -1, 1 << 64, True, 1.5):
        try:
            _parse_size(bad, "capacity_bytes")
        except ValueError as e:
            assert "kv_connector_extra_config.capacity_bytes" in str(e), (bad, e)
        else:
            raise AssertionError(f"{bad!r} was taken as a size")


@check("negative sizes are usage errors (--global-segment-size -1, --local-buffer-size -5M)")
def _():
    usage([POOL, "--global-segment-size", "-1"], "--global-segment-size '-1'", "negative")
    usage([POOL, "--local-buffer-size=-5M"], "--local-buffer-size '-5M'", "negative")
    usage([POOL, "--global-segment-size=-16MiB"], "--global-segment-size '-16MiB'", "negative")
    # a separate '-5M' reads as an option: still a usage error that names the option
    usage([POOL, "--local-buffer-size", "-5M"], "--local-buffer-size needs a value")
    usage([POOL, "--global-segment-size", "8M"], "--global-segment-size '8M'", "16MiB")


@check("--evict-free-pct: above 0 and at most 100, said in --help")
def _():
    for bad in ("200", "-1", "0", "100.5", "nan", "inf", "x"):
        usage([POOL, f"--evict-free-pct={bad}"], f"--evict-free-pct '{bad}'", "above 0 and at most 100")
    usage([POOL, "--evict-free-pct", "-1"], "--evict-free-pct '-1'")
    rc, out, err = tier("--help")
    assert rc == 0 and "above 0 and at most 100" in " ".join(out.split()), out


@check("invalid pool names are usage errors before Mooncake, with or without --status")
def _():
    for name, words in (("a/b", "'/' at position 2"), ("", "empty"), ("a" * 300, "300 characters"),
                        ("a" * 65, "65 characters"), (".", "reserved"), ("..", "reserved"),
                        ("-x", "starts with '-'"), ("sp ace", "' ' at position 3")):
        for extra in ([], ["--status"], ["--status", "--json"]):
            usage([*extra, "--", name], words)
    usage(["a" * 64 + "/"], "65 characters")


@check("the pool name rule is the C library's (umbp_pool_name_valid, through `umbp pool info`)")
def _():
    # through the C tool, not ctypes: a sanitizer build's library cannot be loaded into Python
    for name in ("kv", "a", "A.b_c-9", "a" * 64, "a" * 65, "", ".", "..", "...", ".x", "x.", "a/b", "a b", "a:b",
                 "é", "a\nb", "_", "x-", "-", "-x", "--"):
        py_ok = pool_name_error(name) is None
        if name.startswith("-"):  # pool info would read it as an option; the library refuses it too
            assert not py_ok, name
            continue
        r = subprocess.run([TOOL, "pool", "info", name], capture_output=True, text=True, timeout=60)
        c_ok = r.returncode != 2  # 1: a valid name of no pool; 2: the name is refused
        assert py_ok == c_ok, (name, py_ok, c_ok, pool_name_error(name), r.stderr)


@check("an empty --master, --metadata, --local-hostname, --config or --log is a usage error, not the default; "
       "a --master that is not HOST:PORT (or an HA master's URL) too")
def _():
    for opt in ("--master", "--metadata", "--local-hostname", "--config", "--log"):
        for val in ("", " "):
            usage([POOL, f"{opt}={val}"], f"{opt} '{val}' is empty: give ", f"leave {opt} out")
    # a --master that is not HOST:PORT is refused here, not tried by Mooncake for 85 s at a time
    for val in ("10.0.0.5", "10.0.0.5:", ":50051", "host:port", "host:0", "host:65536", "host:-1",
                # a traceback (ValueError from int()), and digits of other scripts that reached Mooncake
                "10.0.0.5:\u00b2", "10.0.0.5:\u0665\u0660\u0660\u0665\u0661",
                # a host that is no host: Mooncake's setup tried each for 85 s at a time, for ever
                "10.0.0.5:50051:1", "[10.0.0.5]:50051", "[::1:50051"):
        usage([POOL, f"--master={val}"], f"--master '{val}' is not HOST:PORT", "10.0.0.5:50051")
    for val in ("10.0.0.5 :50051", "a b:50051", " 10.0.0.5:50051", "10.0.0.5:50051\t"):  # passed on blanks and all
        usage([POOL, f"--master={val}"], f"--master '{val}' has a blank", "10.0.0.5:50051")
    # a URL of a scheme Mooncake has no HA backend for: its setup said only 'Invalid HA backend entry' and
    # failed, again and again, for as long as the tier ran
    for val in ("http://10.0.0.5:50051", "tcp://10.0.0.5:50051", "://", "etcd://", "etcd:// "):
        usage([POOL, f"--master={val}"], f"--master '{val}' is not HOST:PORT", "etcd://", "10.0.0.5:50051")
    p = write("mc-url.json", '{"master_server_address": "http://10.0.0.5:50051"}')
    rc, out, err = tier(POOL, "--config", p)
    assert rc == 1 and "master_server_address 'http://10.0.0.5:50051' is not HOST:PORT" in err, (rc, err)
    for val in ("10.0.0.5:50051", "[::1]:50051", "::1:50051", "localhost:50051", "my-host.example:50051",
                "etcd://10.0.0.5:2379", "redis://10.0.0.5:6379", "k8s://mooncake"):
        r = subprocess.run([TOOL, "tier", POOL, "--master", val], capture_output=True, text=True, timeout=60, env=ENV)
        assert r.returncode == IMPORTED, (val, r.returncode, r.stderr)
    p = write("mc.json", '{"master_server_address": "10.0.0.5"}')
    rc, out, err = tier(POOL, "--config", p)
    assert rc == 1 and p in err and "master_server_address '10.0.0.5' is not HOST:PORT" in err, (rc, err)
    rc, out, err = tier(POOL, "--config", p, "--master", "10.0.0.5:50051")  # the option overrides the key
    assert rc == IMPORTED, (rc, err)
    # MOONCAKE_CONFIG_PATH set but empty is the variable left unset (no --config), not a usage error
    r = subprocess.run([TOOL, "tier", POOL], capture_output=True, text=True, timeout=60,
                       env=dict(ENV, MOONCAKE_CONFIG_PATH=""))
    assert r.returncode == IMPORTED, (r.returncode, r.stderr)


@check("--json without --status is a usage error; with --status it is accepted")
def _():
    usage([POOL, "--json"], "--json", "--status")
    rc, out, err = tier(POOL, "--status", "--json")  # no such pool: a runtime error, not a usage one
    assert rc == 1 and TRY not in err and "stand-in" not in err, (rc, err)


@check("argparse's own errors read like the C commands' usage errors")
def _():
    usage([POOL, "--bogus"], "unknown option '--bogus'")
    usage([POOL, "extra"], "unexpected argument 'extra'")
    usage([], "missing the pool NAME")
    usage(["--status"], "missing the pool NAME")
    usage([POOL, "--queue", "x"], "--queue 'x'", "whole number")
    usage([POOL, "--records", "4294967296"], "--records '4294967296'", "4294967295")
    # the library's own limits, found before the tier attaches the pool or imports Mooncake
    usage([POOL, "--records", "65536"], "--records '65536'", "1 to 65535")
    usage([POOL, "--keys-per-record", "4294967295"], "--keys-per-record '4294967295'", "1 to 65535")
    usage([POOL, "--feed-capacity", "16777217"], "--feed-capacity '16777217'", "1 to 16777216")
    for opt, top in (("--records", "65535"), ("--keys-per-record", "65535"), ("--feed-capacity", "16777216")):
        rc, out, err = tier(POOL, opt, top)  # the top of each range is accepted
        assert rc == IMPORTED, (opt, rc, err)
    usage([POOL, "--timeout-ms", "0"], "--timeout-ms '0'")
    usage([POOL, "--protocol", "udp"], "--protocol 'udp'", "tcp")
    usage([POOL, "--log"], "--log needs a value")
    usage([POOL, "--status=1"], "--status takes no value")


def private_shm(size):
    """(argv prefix, free bytes): commands run behind the prefix see a new, empty tmpfs of size bytes as
    /dev/shm (a mount namespace of their own; root only), whose room no other process (a parallel test, the
    CI) changes; None where that cannot be made."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        return None
    pre = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
           f'mount -t tmpfs -o size={size} umbp-test /dev/shm && exec "$@"', "sh"]
    r = subprocess.run([*pre, sys.executable, "-c", "import os; s = os.statvfs('/dev/shm'); "
                        "print(s.f_bavail * s.f_frsize)"], capture_output=True, text=True, timeout=60)
    return (pre, int(r.stdout)) if r.returncode == 0 and r.stdout.strip().isdigit() else None


@check("a request table or feed larger than /dev/shm's free room: a usage error naming the options, the size "
       "and the room, before anything is created or Mooncake imported")
def _():
    from umbp import tier as T
    st = os.statvfs("/dev/shm")
    room = st.f_bavail * st.f_frsize
    table = f"/dev/shm/umbp.{POOL}.tier"
    if T.table_bytes(65535, 65535) <= room:
        print(f"# /dev/shm has {room} bytes free, more than the largest request table: not tried")
        return
    # Before: the tier imported Mooncake (the stand-in's 7), attached the pool and failed there, exit 1
    # naming neither option, and left the table file of the size asked in /dev/shm
    usage([POOL, "--records", "65535", "--keys-per-record", "65535"], "--records 65535 x --keys-per-record 65535",
          f"takes {T.table_bytes(65535, 65535)} bytes", "/dev/shm has ", " free", "lower --records or --keys-per-record")
    assert not os.path.exists(table), table
    # a table that fits, with a 1 GiB feed that then does not: the feed's option is named. In a /dev/shm of
    # its own where root: beside other processes (tests making GiB pools in parallel, the CI) the free room
    # moved by more than the 512 MiB either side allowed here between its measure and the command
    margin = 512 << 20
    pre = ()
    private = private_shm(1536 << 20)  # more than the 1 GiB feed alone: the table and it together do not fit
    if private:
        pre, room = private
        margin = 16 << 20
    record = T.table_bytes(1, 65535) - T.table_bytes(0, 65535)
    records = (room - margin - T.table_bytes(0, 65535)) // record
    if not 1 <= records <= 65535 or T.feed_bytes(1 << 24) <= 1 << 30:
        print(f"# /dev/shm has {room} bytes free: the feed's share is not tried")
        return
    args = [POOL, "--records", str(records), "--keys-per-record", "65535", "--feed-capacity", str(1 << 24)]
    usage(args, "--feed-capacity 16777216", f"--records {records} x --keys-per-record 65535", "/dev/shm has ",
          "lower --feed-capacity", pre=pre)
    # with write-back off there is no feed: the table alone fits, and the tier goes on
    rc, out, err = tier(*args, "--writeback", "off", pre=pre)
    assert rc == IMPORTED, (rc, err)


@check("a Mooncake config with a bad size, not an object, or a non-string address: exit 1 naming the file "
       "and the key, before Mooncake")
def _():
    # a segment larger than the host's memory, by option or by config key: exit 1 before Mooncake (whose
    # setup failed with -600 and was retried for ever)
    p = write("mc.json", '{"global_segment_size": "4000TiB"}')
    for args in (["--global-segment-size", "4000TiB"], ["--config", p]):
        rc, out, err = tier(POOL, *args)
        assert rc == 1 and "more than this host's memory" in err and "stand-in" not in err, (args, rc, err)
    for text, key in (('{"global_segment_size": "1e400G"}', "global_segment_size"),
                      ('{"local_buffer_size": 1e400}', "local_buffer_size"),
                      ('{"local_buffer_size": -5}', "local_buffer_size"),
                      ('{"local_buffer_size": "-5M"}', "local_buffer_size"),
                      ('{"local_buffer_size": 1.5}', "local_buffer_size")):
        p = write("mc.json", text)
        rc, out, err = tier(POOL, "--config", p)
        assert rc == 1 and p in err and key in err and "stand-in" not in err, (text, rc, err)
    for text, words in (("[]", "is an array, not a JSON object"), ("42", "is a number, not a JSON object"),
                        ("null", "is null, not a JSON object"), ('"x"', "is a string, not a JSON object"),
                        ('{"master_server_address": 50051}', "master_server_address 50051 is not a string"),
                        ('{"local_hostname": ["h"]}', "local_hostname ['h'] is not a string")):
        p = write("mc.json", text)
        rc, out, err = tier(POOL, "--config", p)
        assert rc == 1 and p in err and words in err and "stand-in" not in err, (text, rc, err)
    p = write("mc.json", '{"local_buffer_size": "32MiB", "global_segment_size": 33554432}')
    rc, out, err = tier(POOL, "--config", p)
    assert rc == IMPORTED, (rc, err)


@check("umbp bench tier: each bad number names its option (--engine-tokens, --engine-reps too), before Mooncake")
def _():
    def bench(*args):
        r = subprocess.run([TOOL, "bench", "tier", *args], capture_output=True, text=True, timeout=60, env=ENV)
        assert "Traceback" not in r.stderr, (args, r.stderr)
        return r.returncode, r.stderr
    for args, words in ((("--engine-reps", "0"), "--engine-reps 0"), (("--engine-tokens", "-5"), "--engine-tokens -5"),
                        (("--reps", "0"), "--reps 0"), (("--prefix", "0"), "--prefix 0"),
                        (("--sizes", "100"), "--sizes '100'"),
                        # a slot over 4 GiB: refused by pool creation only, after the /dev/shm check
                        (("--sizes", "64KiB,5GiB", "--prefix", "1"), "--sizes '64KiB,5GiB': give block sizes"),
                        # a prefix past a pool's 2^24 - 1 slots: named, not the library's --capacity/--slot-size
                        (("--prefix", "100000000"), "--prefix 100000000: the bench's second pool")):
        rc, err = bench(*args)
        assert rc == 2 and words in err and "stand-in" not in err and "--capacity" not in err, (args, rc, err)
    # every usage error in the C commands' form, as umbp tier's and umbp bench copy's: it was argparse's
    # 'usage: ... error: ...' for some and 'umbp bench tier: ...' without the help line for others
    for args, words in ((("--bogus",), "unknown option '--bogus'"), (("--reps", "x"), "'x'"),
                        (("--engine", "maybe"), "--engine 'maybe'"), (("--reps", "0"), "--reps 0"),
                        (("--sizes", "100"), "--sizes '100'"), (("--sizes", "1Q"), "--sizes '1Q'")):
        rc, err = bench(*args)
        lines = err.rstrip("\n").split("\n")
        assert rc == 2 and len(lines) == 2 and lines[0].startswith("umbp: ") and words in lines[0], (args, rc, err)
        assert lines[1] == "Try 'umbp bench tier --help'.", (args, err)
    # pools larger than /dev/shm's free space: refused before anything starts, naming what to lower
    rc, err = bench("--prefix", "8000000", "--sizes", "4MiB")
    assert rc == 1 and "bytes of /dev/shm for its two pools" in err and "lower --prefix" in err, (rc, err)
    rc, err = bench("--sizes", "4KiB", "--reps", "1", "--engine-reps", "1")
    assert rc == IMPORTED, (rc, err)


@check("--help and --status into /dev/full: exit 1 saying so, as the C commands; into a pipe nobody reads: "
       "ended by SIGPIPE, as the C commands; never a traceback")
def _():
    pool = f"fb-args-st-{os.getpid()}"
    r = subprocess.run([TOOL, "pool", "create", pool, "--capacity", "4MiB", "--slot-size", "64KiB"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        # Before: --help exited 0 with nothing written (argparse swallows the error), --status ended in an
        # OSError traceback, and --status --json | head in a BrokenPipeError traceback
        cases = [(["tier", "--help"], "tier --help"), (["tier", pool, "--status"], "tier --status"),
                 (["tier", pool, "--status", "--json"], "tier --status"), (["bench", "tier", "--help"],
                                                                          "bench tier --help")]
        if SANITIZED:  # --status loads libumbp into Python
            cases = [c for c in cases if "--status" not in c[0]]
        for args, what in cases:
            with open("/dev/full", "w") as full:
                r = subprocess.run([TOOL, *args], stdout=full, stderr=subprocess.PIPE, text=True,
                                   timeout=60, env=ENV)
            assert r.returncode == 1 and "Traceback" not in r.stderr, (args, r.returncode, r.stderr)
            assert r.stderr == f"umbp: {what}: writing the output failed: No space left on device\n", (args, r.stderr)
            rd, wr = os.pipe()
            os.close(rd)
            try:
                r = subprocess.run([TOOL, *args], stdout=wr, stderr=subprocess.PIPE, text=True, timeout=60, env=ENV)
            finally:
                os.close(wr)
            assert r.returncode == -13 and "Traceback" not in r.stderr, (args, r.returncode, r.stderr)
        rd, wr = os.pipe()  # what the C commands do in the same place
        os.close(rd)
        r = subprocess.run([TOOL, "inspect", pool], stdout=wr, stderr=subprocess.PIPE, timeout=60)
        os.close(wr)
        assert r.returncode == -13, r.returncode
    finally:
        subprocess.run([TOOL, "pool", "destroy", pool], capture_output=True, timeout=60)


@check("--status with a FIFO named as the pool's tier table (anyone may make one in /dev/shm): exit 1 naming it "
       "and the fix, no wait")
def _():
    if SANITIZED:
        return f"SKIP --status loads libumbp into Python, which cannot load it built with -Db_sanitize={SANITIZED}"
    pool = f"fb-args-ff-{os.getpid()}"
    r = subprocess.run([TOOL, "pool", "create", pool, "--capacity", "4MiB", "--slot-size", "64KiB"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    fifo = f"/dev/shm/umbp.{pool}.tier"
    os.mkfifo(fifo)
    try:
        for extra in ([], ["--json"]):
            # it waited for a writer of the FIFO, without bound
            try:
                r = subprocess.run([TOOL, "tier", pool, "--status", *extra], capture_output=True, text=True,
                                   timeout=20, env=ENV)
            except subprocess.TimeoutExpired:
                raise AssertionError("umbp tier --status still waiting after 20 s") from None
            assert r.returncode == 1 and "Traceback" not in r.stderr, (extra, r.returncode, r.stderr)
            assert "is not a tier table" in r.stderr and f"umbp tier {pool}" in r.stderr, (extra, r.stderr)
    finally:
        os.unlink(fifo)
        subprocess.run([TOOL, "pool", "destroy", pool], capture_output=True, timeout=60)


def cleanup():
    subprocess.run(["rm", "-rf", TMP])


rc = taplib.run(checks)
cleanup()
sys.exit(rc)
