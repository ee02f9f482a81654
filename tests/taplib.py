# SPDX-License-Identifier: Apache-2.0
"""TAP output for the Python test scripts run by meson (protocol: 'tap')."""
import sys
import traceback


def run(checks, after_each=None):
    """Run (name, fn) pairs, print TAP, return the exit status (1 if any failed).

    fn passes by returning; it skips by returning a string "SKIP reason";
    any exception fails it, with the traceback as TAP comments. after_each
    (if given) runs after every check, passed or not (cleanup)."""
    print(f"1..{len(checks)}")
    failed = 0
    for i, (name, fn) in enumerate(checks, 1):
        try:
            r = fn()
            if isinstance(r, str) and r.startswith("SKIP"):
                print(f"ok {i} - {name} # {r}")
            else:
                print(f"ok {i} - {name}")
        except Exception:
            failed += 1
            print(f"not ok {i} - {name}")
            for line in traceback.format_exc().splitlines():
                print(f"# {line}")
        finally:
            if after_each:
                after_each()
        sys.stdout.flush()
    return 1 if failed else 0


def registry():
    """(checks, check): `@check("name")` above a function appends (name, fn) to
    checks, in file order, for run(checks)."""
    checks = []

    def check(name):
        def deco(fn):
            checks.append((name, fn))
            return fn
        return deco
    return checks, check


def foreground():
    """preexec_fn for a command whose signal handling a check exercises: SIGINT,
    SIGQUIT and SIGHUP at their defaults, as in a terminal's foreground job. A
    script's background job (CI) inherits SIGINT and SIGQUIT ignored and a run
    under nohup SIGHUP ignored, and the commands keep an ignored one ignored."""
    import signal
    for sig in (signal.SIGINT, signal.SIGQUIT, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    import socket
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def readline(p, secs=60):
    """The next line of Popen p's stdout (a text pipe), waiting at most secs:
    "" when the time is up (p is then killed, so that it cannot outlive the
    check) or at its end. A helper that hangs fails the check that waits for
    its line, with that line in the message, instead of holding the script
    until meson's timeout."""
    import select
    if not select.select([p.stdout], [], [], secs)[0]:
        p.kill()
        return ""
    return p.stdout.readline()
