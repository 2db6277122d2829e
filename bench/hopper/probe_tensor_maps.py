"""Which tensor maps the driver itself refuses (cuTensorMapEncodeTiled), for
configurations the plan's own rules let through; run on a Hopper GPU. Prints
one line per case: the driver's result."""
import ctypes
import torch

cu = ctypes.CDLL("libcuda.so.1")
cu.cuTensorMapEncodeTiled.restype = ctypes.c_int
x = torch.empty(300 * 200, dtype=torch.float32, device="cuda")


class Map(ctypes.Structure):
    _fields_ = [("opaque", ctypes.c_uint64 * 16)]


def encode(dims, strides, box, estr=None, interleave=0, swizzle=0, dtype=7, addr=None):
    rank = len(dims)
    buf = ctypes.create_string_buffer(256)
    off = (-ctypes.addressof(buf)) % 64
    m = Map.from_buffer(buf, off)
    estr = estr or [1] * rank
    rc = cu.cuTensorMapEncodeTiled(ctypes.byref(m), dtype, rank, ctypes.c_void_p(addr or x.data_ptr()),
                                   (ctypes.c_uint64 * rank)(*dims), (ctypes.c_uint64 * max(rank - 1, 1))(*(strides or [0])),
                                   (ctypes.c_uint32 * rank)(*box), (ctypes.c_uint32 * rank)(*estr),
                                   interleave, swizzle, 0, 0)
    name = ctypes.c_char_p()
    cu.cuGetErrorName(rc, ctypes.byref(name))
    return name.value.decode()


cases = {
    "ok 200x300 box 32x64": ([200, 300], [800], [32, 64]),
    "overlapping rows: stride 400 < 800": ([200, 300], [400], [32, 64]),
    "stride 16 < row": ([200, 300], [16], [32, 64]),
    "box larger than dims: 32x64 over 8x8": ([8, 8], [32], [32, 64]),
    "address +16": ([200, 299], [800], [32, 64], None, 0, 0, 7, x.data_ptr() + 16),
    "address +8 (ours refuses)": ([200, 299], [800], [32, 64], None, 0, 0, 7, x.data_ptr() + 8),
    "interleave 16B rank 3 box0 64B": ([16, 10, 300], [64, 640], [16, 4, 4], None, 1, 0),
    "swizzle 128B box0 128B": ([200, 300], [800], [32, 64], None, 0, 3),
}
for k, v in cases.items():
    print("probe: %-45s %s" % (k, encode(*v)))
