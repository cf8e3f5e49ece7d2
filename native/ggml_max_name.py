"""Print the GGML_MAX_NAME the ggml library under ``argv[1]`` was built with (CMake runs
this at configure time): a tensor of a no-alloc context is given a long name, and the
library keeps ``GGML_MAX_NAME - 1`` characters of it."""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path


class InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p),
                ("no_alloc", ctypes.c_bool)]


def main() -> int:
    root = Path(sys.argv[1])
    names = ("libggml-base.so", "libggml-base.dylib", "ggml-base.dll")
    lib_path = next((p for d in ("lib", "lib64", "bin") for n in names
                     for p in [root / d / n] if p.exists()), None)
    if lib_path is None:
        print(f"no ggml-base library under {root}", file=sys.stderr)
        return 1
    lib = ctypes.CDLL(str(lib_path))
    lib.ggml_init.restype = ctypes.c_void_p
    lib.ggml_init.argtypes = [InitParams]
    lib.ggml_new_tensor_1d.restype = ctypes.c_void_p
    lib.ggml_new_tensor_1d.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int64]
    lib.ggml_set_name.restype = ctypes.c_void_p
    lib.ggml_set_name.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
    lib.ggml_get_name.restype = ctypes.c_char_p
    lib.ggml_get_name.argtypes = [ctypes.c_void_p]
    lib.ggml_free.argtypes = [ctypes.c_void_p]
    ctx = lib.ggml_init(InitParams(1 << 16, None, True))
    tensor = lib.ggml_new_tensor_1d(ctx, 0, 1)  # GGML_TYPE_F32
    lib.ggml_set_name(tensor, b"n" * 1023)
    print(len(lib.ggml_get_name(tensor)) + 1)
    lib.ggml_free(ctx)
    return 0


if __name__ == "__main__":
    sys.exit(main())
