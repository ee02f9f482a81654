# SPDX-License-Identifier: Apache-2.0
"""Exec'd by test_sigbus: a Python program with faulthandler enabled before
libumbp (UMBP_LIB) attaches pool argv[1]; it prints "ready" and writes every
slot until the test truncates the pool's file. Both the library's message and
faulthandler's traceback should come out, and the process die of SIGBUS."""
import ctypes
import faulthandler
import os
import sys

faulthandler.enable()
lib = ctypes.CDLL(os.environ["UMBP_LIB"])
lib.umbp_pool_attach.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p)]
lib.umbp_slot_ptr.restype = ctypes.c_void_p
lib.umbp_slot_ptr.argtypes = [ctypes.c_void_p, ctypes.c_uint32]
pool = ctypes.c_void_p()
rc = lib.umbp_pool_attach(sys.argv[1].encode(), None, ctypes.byref(pool))
if rc:
    print(f"attach {rc}", flush=True)
    sys.exit(1)
slots = [lib.umbp_slot_ptr(pool, s) for s in range(int(sys.argv[2]))]
print("ready", flush=True)


def copy_thread_body():
    while True:
        for p in slots:
            ctypes.memset(p, 7, 4096)


copy_thread_body()
