# SPDX-License-Identifier: Apache-2.0
"""Exec'd by test_sigbus: load libumbp (UMBP_LIB) with ctypes, attach and
detach pool argv[1], dlclose the library, then touch a file of its own mapped
past its end. The library's SIGBUS handler must have left with the library:
the process dies of SIGBUS (the default action), not of a jump into unmapped
code. Prints "unloaded" or "still loaded" (another reference kept it)."""
import _ctypes
import ctypes
import mmap
import os
import sys
import tempfile

lib = ctypes.CDLL(os.environ["UMBP_LIB"])
lib.umbp_pool_attach.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.umbp_pool_detach.argtypes = [ctypes.c_void_p]
pool = ctypes.c_void_p()
rc = lib.umbp_pool_attach(sys.argv[1].encode(), None, ctypes.byref(pool))
if rc:
    print(f"attach {rc}", flush=True)
    sys.exit(1)
lib.umbp_pool_detach(pool)
handle = lib._handle
del lib
_ctypes.dlclose(handle)
with open("/proc/self/maps") as f:
    print("still loaded" if "libumbp" in f.read() else "unloaded", flush=True)
with tempfile.TemporaryFile() as f:
    f.truncate(8192)
    m = mmap.mmap(f.fileno(), 8192)
    f.truncate(0)
    m[4096] = 1
print("not reached", flush=True)
