# SPDX-License-Identifier: Apache-2.0
"""A pool's notes: what the segment does not record, in /dev/shm/umbp-notes.NAME.

The segment knows its slots, namespaces and attached processes, but not who a
pool belongs to or what a namespace is to a person. The vLLM connector writes
that here, one record a line, fields separated by tabs:

  umbp-notes  1  UUID                          first line: the pool it describes
  embedded    INSTANCE  NAMESPACE  CAPACITY  PID
                                               the pool was created by a vLLM engine
                                               in embedded mode (vLLM's instance id)
  proc        INSTANCE  PID  NAMESPACE         a process of that engine (or of
                                               another that joined) attached
  label       NAMESPACE  LABEL                 a person's name for a derived
                                               namespace: model, revision, TP, dtype
  layout      NAMESPACE  FINGERPRINT  FACTS    what the blocks of an explicit
                                               key_namespace are: FINGERPRINT is the
                                               namespace the first worker to use it
                                               would have derived (vllm-...), FACTS a
                                               JSON object of what went into it (model,
                                               dtypes, block size, TP, block bytes, ...)

UUID is the pool's (umbp_pool_info.uuid, 32 hex digits): notes of an earlier
pool of the same name are stale and read as empty, so a notes file never
describes a pool it was not written for. Records are appended; the last
record of a kind and key wins; a line without its newline (a writer killed
mid-write) and records of unknown kinds are skipped. tools/pool_notes.c reads
the same format for `umbp pool ls/info/gc`, `umbp inspect` and the daemon's
label quotas.

Why a file and not the segment: the header and the namespace table are
frozen layouts with no room for a label of a few hundred bytes, and the file
lives where the pool does (tmpfs: it survives engine and daemon restarts and
goes with a reboot). The connector removes it with its embedded pool; `umbp
pool destroy` and `umbp pool gc` remove it too.

Writers hold an flock(2) on the file (LOCK_EX) for the whole of a
create-or-attach and of a detach-and-maybe-destroy of an embedded pool, so
those steps of different processes never interleave. Whoever removes the file
holds the lock; a process that got the lock on a file that was removed
meanwhile sees another inode at the path (or none) and locks again.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import time
from dataclasses import dataclass, field

NOTES_DIR = "/dev/shm"
MAGIC = "umbp-notes"
VERSION = "1"


def path(pool: str) -> str:
    return os.path.join(NOTES_DIR, f"umbp-notes.{pool}")


def _clean(v) -> str:
    return " ".join(str(v).split("\t")).replace("\n", " ").replace("\r", " ")


@dataclass
class Embedded:
    instance: str
    namespace: str
    capacity: int
    pid: int


@dataclass
class Notes:
    """Parsed notes of one pool (empty when missing or stale)."""

    uuid: str | None = None
    embedded: Embedded | None = None
    procs: dict[int, tuple[str, str]] = field(default_factory=dict)  # pid -> (instance, namespace)
    labels: dict[str, str] = field(default_factory=dict)              # namespace -> label
    layouts: dict[str, tuple[str, dict]] = field(default_factory=dict)  # namespace -> (fingerprint, facts)


def parse(text: str, uuid: str | None = None) -> Notes:
    """Notes from a file's text; empty when its first line is not the header,
    or names another pool than `uuid` (when given)."""
    lines = text.split("\n")[:-1]          # the last piece has no newline: incomplete or empty
    if not lines:
        return Notes()
    head = lines[0].split("\t")
    if len(head) < 3 or head[0] != MAGIC or (uuid is not None and head[2] != uuid):
        return Notes()
    n = Notes(uuid=head[2])
    for ln in lines[1:]:
        f = ln.split("\t")
        try:
            if f[0] == "embedded" and len(f) >= 5:
                n.embedded = Embedded(f[1], f[2], int(f[3]), int(f[4]))
            elif f[0] == "proc" and len(f) >= 4:
                n.procs[int(f[2])] = (f[1], f[3])
            elif f[0] == "label" and len(f) >= 3:
                n.labels[f[1]] = f[2]
            elif f[0] == "layout" and len(f) >= 4:
                try:
                    facts = json.loads(f[3])
                except ValueError:
                    facts = {}
                n.layouts[f[1]] = (f[2], facts if isinstance(facts, dict) else {})
        except ValueError:
            continue
    return n


def _open_regular(p: str, flags: int, mode: int = 0o600) -> int:
    """os.open(p) of the notes file, refused unless it is a regular file: any
    local user can make /dev/shm/umbp-notes.NAME first, and a FIFO there would
    block open() or read() for ever (O_NONBLOCK; O_NOFOLLOW as every pool
    file). OSError naming the file, what it is and the command that removes it."""
    fd = os.open(p, flags | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        what = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a directory" if stat.S_ISDIR(st.st_mode) else \
            "not a regular file"
        raise OSError(errno.EINVAL, f"{p} is {what}, not umbp's notes file of the pool: if no other program "
                                    f"uses it, remove it ({'rm -r' if stat.S_ISDIR(st.st_mode) else 'rm'} {p})")
    os.set_blocking(fd, True)
    return fd


def read(pool: str, uuid: str | None = None) -> Notes:
    """The notes of `pool` without the lock (readers tolerate a record being
    appended); none when the file is missing or is not a regular file."""
    try:
        with os.fdopen(_open_regular(path(pool), os.O_RDONLY), encoding="utf-8", errors="replace") as f:
            return parse(f.read(), uuid)
    except OSError:
        return Notes()


def _pool_file_mode(pool: str) -> tuple[int, int] | None:
    """(mode bits, gid) of the pool's file, so that the notes have the same access."""
    for d in ("/dev/shm", "/dev/hugepages"):
        try:
            st = os.stat(os.path.join(d, f"umbp.{pool}"))
            return st.st_mode & 0o666, st.st_gid
        except OSError:
            continue
    return None


class Locked:
    """The notes file of `pool`, created when missing, under an exclusive flock.

    with Locked("vllm") as n: n.read(uuid); n.reset(uuid); n.append(...)

    Waits up to timeout_s for the lock (a process that holds it is creating or
    removing the pool; creation pre-faults the pool, which takes a while for a
    large one), then raises TimeoutError naming the file."""

    def __init__(self, pool: str, timeout_s: float = 600.0, on_wait=None):
        self.pool, self.path, self.timeout_s, self.on_wait = pool, path(pool), timeout_s, on_wait
        self.fd = -1

    def __enter__(self) -> Locked:
        start = time.monotonic()
        end = start + self.timeout_s
        said = False
        while True:
            fd = self._open()
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as e:
                    if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                        os.close(fd)
                        raise
                if time.monotonic() > end:
                    os.close(fd)
                    raise TimeoutError(f"{self.path} stayed locked for {self.timeout_s:.0f} s: another process "
                                       f"is creating or removing pool {self.pool!r} (or is stopped while doing it)")
                if not said and self.on_wait and time.monotonic() > start + 5:
                    said = True
                    self.on_wait(self.path)
                time.sleep(0.02)
            # the file may have been removed (and made again) while this process waited
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self.fd = fd
                return self
            os.close(fd)

    def _open(self) -> int:
        try:
            fd = _open_regular(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL)
        except FileExistsError:
            return _open_regular(self.path, os.O_RDWR)
        mode = _pool_file_mode(self.pool)
        if mode:
            try:
                os.fchmod(fd, mode[0])
                os.fchown(fd, -1, mode[1])
            except OSError:
                pass  # another group than ours: the notes stay the creator's (0600)
        return fd

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)   # drops the flock
            self.fd = -1

    def read(self, uuid: str | None = None) -> Notes:
        os.lseek(self.fd, 0, os.SEEK_SET)
        chunks = []
        while True:
            b = os.read(self.fd, 1 << 16)
            if not b:
                break
            chunks.append(b)
        return parse(b"".join(chunks).decode("utf-8", errors="replace"), uuid)

    def reset(self, uuid: str) -> None:
        """Start the notes of pool `uuid` (dropping whatever was there)."""
        os.ftruncate(self.fd, 0)
        os.lseek(self.fd, 0, os.SEEK_SET)
        os.write(self.fd, f"{MAGIC}\t{VERSION}\t{uuid}\n".encode())

    def append(self, kind: str, *fields) -> None:
        line = "\t".join([kind, *(_clean(f) for f in fields)]) + "\n"
        os.lseek(self.fd, 0, os.SEEK_END)
        os.write(self.fd, line.encode())

    def ensure(self, uuid: str) -> Notes:
        """The notes of pool `uuid`, started afresh when missing or stale."""
        n = self.read(uuid)
        if n.uuid is None:
            self.reset(uuid)
            n = Notes(uuid=uuid)
        return n

    def remove(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
