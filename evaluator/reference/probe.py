#!/usr/bin/env python3
"""Which torch this interpreter has (evaluator/reference/python_env.cc, ResolvePython).

  probe.py              imports torch; prints {"torch", "cuda", "device"} as JSON
  probe.py --installed  exits 0 when torch can be found, 1 when not, without
                        importing it (importing torch costs a second or more)
  probe.py --quick      the same JSON as without arguments, without importing
                        torch: its version from the package metadata, CUDA from
                        the driver (libcuda through ctypes: device 0's name, as
                        torch.cuda.get_device_name(0) reports it) and whether
                        this torch was built with CUDA (lib/libtorch_cuda.so).
                        Exit 1 when torch cannot be found. For the reference
                        cache's key, which is needed before any bridge runs.
"""
import json
import sys


def _driver_device_name():
    """CUDA device 0's name from the driver, or None (no driver, no device)."""
    import ctypes
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    count, dev = ctypes.c_int(0), ctypes.c_int(0)
    name = ctypes.create_string_buffer(256)
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return None
    if cuda.cuDeviceGet(ctypes.byref(dev), 0) != 0 or cuda.cuDeviceGetName(name, 256, dev) != 0:
        return None
    return name.value.decode(errors="replace")


def quick():
    import importlib.metadata
    import importlib.util
    import os
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return 1
    try:
        version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return 1
    lib = os.path.join(list(spec.submodule_search_locations)[0], "lib")
    built_with_cuda = any(f.startswith("libtorch_cuda") for f in os.listdir(lib)) if os.path.isdir(lib) else False
    device = _driver_device_name() if built_with_cuda else None
    print(json.dumps({"torch": version, "cuda": device is not None, "device": device or "cpu"}))
    return 0


def main(argv):
    if argv[1:] == ["--quick"]:
        return quick()
    if argv[1:] == ["--installed"]:
        import importlib.util
        return 0 if importlib.util.find_spec("torch") else 1
    import torch
    cuda = bool(torch.cuda.is_available())
    print(json.dumps({"torch": torch.__version__, "cuda": cuda,
                      "device": torch.cuda.get_device_name(0) if cuda else "cpu"}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
