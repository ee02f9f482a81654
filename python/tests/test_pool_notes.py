# SPDX-License-Identifier: Apache-2.0
"""The pool notes (/dev/shm/umbp-notes.NAME) are read and locked only as a
regular file: any local user can make that name first, and a FIFO there must
neither hang an engine that reads the notes nor pass for them."""
from __future__ import annotations

import os
import subprocess
import sys

from umbp import pool_notes

CHILD = """
import sys
from umbp import pool_notes as N
name = sys.argv[1]
print("read", N.read(name).uuid, flush=True)
try:
    with N.Locked(name, timeout_s=5):
        print("locked", flush=True)
except OSError as e:
    print("refused", e, flush=True)
"""


def test_a_fifo_in_place_of_the_notes_is_refused_not_waited_on():
    name = f"t-notes-fifo-{os.getpid()}"
    p = pool_notes.path(name)
    os.mkfifo(p, 0o666)
    try:
        # in a child with a timeout: a hang fails this test instead of hanging the suite
        r = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True, timeout=30,
                           env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    finally:
        os.unlink(p)
    assert r.returncode == 0, r
    lines = r.stdout.splitlines()
    assert lines[0] == "read None", r.stdout  # no notes
    assert lines[1].startswith(f"refused [Errno 22] {p} is a FIFO, not umbp's notes file") and f"(rm {p})" in lines[1], \
        r.stdout


def test_regular_notes_still_read_and_lock():
    name = f"t-notes-reg-{os.getpid()}"
    try:
        with pool_notes.Locked(name, timeout_s=5) as n:
            n.ensure("uuid-1")
            n.append("label", "7", "llama tp8")
        assert pool_notes.read(name, "uuid-1").labels == {"7": "llama tp8"}
    finally:
        os.unlink(pool_notes.path(name))


def test_layout_records_parse_and_tolerate_garbage():
    """layout NAMESPACE FINGERPRINT FACTS: the last record of a namespace
    wins; facts that are not a JSON object read as {} (the fingerprint still
    counts), a record with fields missing or cut short is skipped."""
    u = "ab" * 16
    text = (f"umbp-notes\t1\t{u}\n"
            "layout\tns-a\tvllm-1\t{\"block size\":16}\n"
            "layout\tns-b\tvllm-2\tnot json\n"
            "layout\tns-c\tvllm-3\n"
            "layout\tns-a\tvllm-4\t{\"block size\":32}\n"
            "layout\tns-d\tvllm-5\t{}")
    n = pool_notes.parse(text, u)
    assert n.layouts == {"ns-a": ("vllm-4", {"block size": 32}), "ns-b": ("vllm-2", {})}
