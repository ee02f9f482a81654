# SPDX-License-Identifier: Apache-2.0
"""The binding checks what it binds: every ctypes structure of _lib.py has
the size the loaded libumbp gives for its C struct, and a mismatch is refused
with a message naming the struct, both sizes and the fix."""
from __future__ import annotations

import ctypes as C
import glob
import os

import pytest

import umbp._lib as L


def test_every_structure_is_checked():
    declared = {v for v in vars(L).values()
                if isinstance(v, type) and issubclass(v, C.Structure) and not v.__name__.startswith("_")}
    assert declared == set(L._C_NAMES), "a structure of _lib.py is missing from _C_NAMES"
    L.check_abi(L.lib())   # the real library agrees with every one


def test_a_size_mismatch_is_refused(monkeypatch):
    class Short(C.Structure):
        _fields_ = [("ns", C.c_uint32)]
    monkeypatch.setattr(L, "_C_NAMES", {Short: "umbp_key"})
    want = L.lib().umbp_abi_struct_size(b"umbp_key")
    with pytest.raises(ImportError, match=rf"struct umbp_key is {want} bytes in .* but 4 in .*"
                                          r"different versions; rebuild or reinstall both"):
        L.check_abi(L.lib())
    monkeypatch.setattr(L, "_C_NAMES", {Short: "umbp_no_such_struct"})
    with pytest.raises(ImportError, match="struct umbp_no_such_struct is 0 bytes"):
        L.check_abi(L.lib())


def test_errno_names_not_numbers():
    src = os.path.join(os.path.dirname(L.__file__))
    for path in glob.glob(os.path.join(src, "*.py")):
        text = open(path).read()
        for bad in ("rc == -2", "rc == -17", "rc == -22", "rc == -11"):
            assert bad not in text, f"{path}: compare with -errno.NAME, not {bad}"


def test_umbp_error_survives_pickling():
    """A worker's UMBPError reaches the engine pickled (an executor returning
    a worker's exception, the tests' worker processes): it unpickled by calling
    __init__ with the message alone and raised TypeError ("missing 2 required
    positional arguments") in place of the error."""
    import errno
    import pickle
    with pytest.raises(L.UMBPError) as ei:
        L.check(L.lib().umbp_pool_attach(b"t-py-no-such-pool", None, C.byref(C.c_void_p())), "attach pool x")
    e = pickle.loads(pickle.dumps(ei.value))
    assert type(e) is L.UMBPError and str(e) == str(ei.value) and e.code == -errno.ENOENT


def test_a_wrong_umbp_lib_names_the_fix(monkeypatch, tmp_path):
    """UMBP_LIB set to the build directory (not the library in it) or to a
    file that is no library: the error says to point it at libumbp.so, not
    only "Is a directory" / "invalid ELF header" from the dynamic loader."""
    monkeypatch.setattr(L, "_lib", None)
    monkeypatch.setenv("UMBP_LIB", str(tmp_path))
    with pytest.raises(OSError, match=rf"UMBP_LIB={tmp_path} is a directory; .*UMBP_LIB={tmp_path}/libumbp.so"):
        L.lib()
    (tmp_path / "libumbp.so").write_text("not a library")
    monkeypatch.setenv("UMBP_LIB", str(tmp_path / "libumbp.so"))
    with pytest.raises(OSError, match=r"UMBP_LIB=.*cannot be loaded \(.*\): point it at libumbp.so"):
        L.lib()


def test_a_relative_umbp_lib_is_the_file_it_names(monkeypatch, tmp_path):
    """UMBP_LIB=libumbp.so run from the build directory names the file there;
    handed to dlopen() as it is, a name without '/' is looked up in the
    loader's path instead (another libumbp, or "cannot open shared object
    file" for a file that exists)."""
    real = L.lib_path()
    monkeypatch.setattr(L, "_lib", None)
    monkeypatch.chdir(os.path.dirname(real))
    monkeypatch.setenv("UMBP_LIB", os.path.basename(real))
    assert L.lib_path() == real


def test_a_missing_function_is_refused_naming_the_fix(monkeypatch):
    """A libumbp of another version whose structures have the same sizes but
    that lacks a function the package calls: ImportError naming the function,
    the library and its version, and the fix (it was ctypes' bare
    AttributeError "undefined symbol", at every later call too)."""
    import umbp.tier as T
    version = L.lib().umbp_version().decode()
    for mod in (L, T):
        monkeypatch.setattr(L, "_lib", None)
        monkeypatch.setattr(T, "_ready", False)
        monkeypatch.setitem(mod._SIGS, "umbp_no_such_function", (None, []))
        with pytest.raises(ImportError, match=rf"\(libumbp {version}\) has no function umbp_no_such_function, "
                                              r"which .* calls: .*different versions; rebuild or reinstall both"):
            (T if mod is T else L).lib()
        monkeypatch.delitem(mod._SIGS, "umbp_no_such_function")
    monkeypatch.setattr(L, "_lib", None)
    assert T.lib() is L.lib()


def test_version_without_a_library_is_an_attribute_error(monkeypatch, tmp_path):
    """umbp.__version__ comes from libumbp: when it cannot be loaded the
    module's __getattr__ raises AttributeError (with the loader's reason and
    fix), so that hasattr(), getattr() with a default and help(umbp) answer
    instead of raising OSError."""
    import pydoc
    import umbp
    monkeypatch.setattr(L, "_lib", None)
    monkeypatch.setenv("UMBP_LIB", str(tmp_path / "missing.so"))
    assert not hasattr(umbp, "__version__")
    assert getattr(umbp, "__version__", "unknown") == "unknown"
    with pytest.raises(AttributeError, match=r"libumbp cannot be loaded: UMBP_LIB=.*missing.so does not exist; "
                                             "point it at libumbp.so"):
        umbp.__version__
    assert "umbp" in pydoc.render_doc(umbp)


def test_a_sanitizer_build_in_umbp_lib_is_refused_not_fatal(tmp_path):
    """UMBP_LIB at an ASan build: loading it without the runtime preloaded
    ends the process ("ASan runtime does not come first", exit 1, no
    exception); the binding refuses it first with the fix instead."""
    import shutil
    import subprocess
    import sys
    gcc = shutil.which("gcc")
    if not gcc:
        pytest.skip("no gcc to build an ASan library")
    so = tmp_path / "libumbp.so"
    src = tmp_path / "a.c"
    src.write_text("int umbp_version(void) { return 0; }\n")
    if subprocess.run([gcc, "-shared", "-fPIC", "-fsanitize=address", "-o", str(so), str(src)]).returncode:
        pytest.skip("gcc cannot build with -fsanitize=address here")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env.update(UMBP_LIB=str(so), PYTHONPATH=os.path.dirname(os.path.dirname(L.__file__)))
    r = subprocess.run([sys.executable, "-c", "import umbp._lib as L\ntry:\n L.lib()\nexcept OSError as e:\n print(e)"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert f"UMBP_LIB={so} is a sanitizer build (linked against libasan.so)" in r.stdout, r.stdout
    assert "LD_PRELOAD=$(gcc -print-file-name=libasan.so)" in r.stdout, r.stdout
    # the check reads a regular file's start only: /dev/zero is refused by the loader, not read forever
    env["UMBP_LIB"] = "/dev/zero"
    r = subprocess.run([sys.executable, "-c", "import umbp._lib as L\ntry:\n L.lib()\nexcept OSError as e:\n print(e)"],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "UMBP_LIB=/dev/zero cannot be loaded" in r.stdout, (r.stdout, r.stderr)


def test_key_fields_lie_where_the_library_reads_them():
    """A size check passes two fields of one type swapped (tp_rank and
    pcp_rank, say): every key the package built would then name another
    rank's block. The library's encoder reads the key by its C layout and
    writes each field at a documented place (connector.h: ns(4) tp(2)
    pcp(2) dcp(2) pp(2) group(2) hash_len(1) hash, little endian), so the
    bytes it writes for a Key made here show where each field landed."""
    lib = L.lib()
    encode = lib.umbp_conn_key_encode
    encode.restype, encode.argtypes = C.c_int, [C.POINTER(L.Key), C.c_char_p, C.c_size_t]
    k = L.Key(ns=0x11223344, tp_rank=0x0102, pcp_rank=0x0304, dcp_rank=0x0506, pp_rank=0x0708, group=0x090A,
              hash_len=3)
    k.hash[0], k.hash[1], k.hash[2] = 0xA1, 0xA2, 0xA3
    buf = C.create_string_buffer(64)
    assert encode(C.byref(k), buf, 64) == 15 + 3
    assert buf.raw[:18] == bytes([0x44, 0x33, 0x22, 0x11, 0x02, 0x01, 0x04, 0x03, 0x06, 0x05, 0x08, 0x07,
                                  0x0A, 0x09, 3, 0xA1, 0xA2, 0xA3]), buf.raw[:18].hex()


def test_every_field_is_where_the_c_compiler_puts_it(tmp_path):
    """Sizes alone pass two fields of one type swapped, or a field put in
    another's padding: the offset of every field of every structure in
    _C_NAMES (_lib.py's and tier.py's), as gcc lays out the public header's
    struct, equals ctypes'. A field name that the C struct lacks fails the
    compile, naming it."""
    import shutil
    import subprocess
    import umbp.tier as T
    structs = {**L._C_NAMES, **T._C_NAMES}
    gcc = shutil.which("gcc")
    if not gcc:
        pytest.skip("no gcc to compile the public headers")
    include = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include")
    if not os.path.exists(os.path.join(include, "umbp", "umbp.h")):
        pytest.skip(f"no public headers at {include} (a copy of the tests outside the source tree)")

    def members(cls, path="", base=0):
        """(C member designator, ctypes offset) of every field, nested
        structures (FeedInfo's consumers, every Key inside another) included."""
        for f in cls._fields_:
            t, off = f[1], base + getattr(cls, f[0]).offset
            yield path + f[0], off
            if isinstance(t, type) and issubclass(t, C.Structure):
                yield from members(t, path + f[0] + ".", off)
            elif isinstance(t, type) and issubclass(t, C.Array) and issubclass(t._type_, C.Structure):
                yield from members(t._type_, path + f[0] + "[1].", off + C.sizeof(t._type_))
    want = [(name, m, off) for cls, name in structs.items() for m, off in members(cls)]
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "umbp/umbp.h"', "int main(void) {"]
    lines += [f'  printf("%zu\\n", offsetof({name}, {m}));' for name, m, _ in want]
    lines.append("  return 0;\n}")
    (tmp_path / "offsets.c").write_text("\n".join(lines) + "\n")
    r = subprocess.run([gcc, "-I", include, "-o", str(tmp_path / "offsets"), str(tmp_path / "offsets.c")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    got = subprocess.run([str(tmp_path / "offsets")], capture_output=True, text=True, check=True).stdout.split()
    assert len(got) == len(want), got
    wrong = [f"{name}.{m}: {int(c)} in C, {off} in the package's ctypes structure"
             for (name, m, off), c in zip(want, got) if int(c) != off]
    assert not wrong, wrong


def test_a_clang_tsan_build_is_never_picked_by_default(tmp_path):
    """clang's TSan shared library names no runtime (the executable brings
    it), so the lookup of build*/libumbp.so, newest first, took a freshly
    built build-tsan/libumbp.so and failed to load it ('undefined symbol:
    __tsan_atomic64_fetch_sub', reported as missing liburcu/libnuma/hwloc).
    Its instrumentation's symbols mark it as a sanitizer build."""
    tsan = tmp_path / "libumbp-tsan.so"
    tsan.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 64 + b"__tsan_atomic64_fetch_sub\0__tsan_func_entry\0")
    asan = tmp_path / "libumbp-asan.so"
    asan.write_bytes(b"\x7fELF\x02\x01\x01" + b"\0" * 64 + b"__asan_report_load8\0")
    assert L._sanitized(str(tsan)) and L._sanitized(str(asan))
    lib = os.environ.get("UMBP_LIB")
    if lib and os.path.isfile(lib):
        assert not L._sanitized(lib), f"the library under test, {lib}, reads as a sanitizer build"
