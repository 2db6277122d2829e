"""Resident references: tensors kept on the GPU for the evaluator to map
(CUDA IPC, no files), how many input sets fit the device, and the checks that
kept inputs are still the ones the reference saw."""

from ks_bridge.errors import BridgeError, CHUNK_ELEMENTS, _human


_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int32": 4, "int64": 8, "int8": 1,
                "uint8": 1, "bool": 1}


def _spec_bytes(specs):
    total = 0
    for spec in specs:
        if spec.get("kind", "tensor") != "tensor":
            continue
        n = 1
        for d in spec["shape"]:
            n *= d
        total += n * _DTYPE_BYTES.get(spec["dtype"], 8)
    return total


def fit_resident(sig, asked, budget, shifted=0):
    """How many input sets a resident reference may have on `budget` bytes of
    GPU memory (0 = no limit): the bridge keeps each set's inputs and outputs
    and the parameters twice (the model's and the pre-forward copy), and
    these are the evaluator's pristine copy too (it maps them); its arena
    holds one set's inputs and one output (it stages one set at a time) and
    the parameters twice more; one more output is margin for what forward
    allocates.
    Returns (sets, why) with why naming the limit when sets < asked."""
    inp, out, par = _spec_bytes(sig["inputs"]), _spec_bytes(sig["outputs"]), _spec_bytes(sig["parameters"])
    # A distribution-shifted set (the last `shifted` of `asked`) may have its
    # own float32 parameters (transforms.py): kept here, in the arena and its pristine copy.
    own = _spec_bytes([p for p in sig["parameters"] if p.get("dtype") in ("float32", "float64")])
    per_set = inp + out
    judging = asked - shifted

    def need(k):
        shifted_in = max(0, min(shifted, k - max(min(judging, 2), k - shifted)))
        return 4 * par + 2 * out + inp + k * per_set + 3 * own * shifted_in

    sets = 0
    for k in range(asked, 0, -1):
        if budget == 0 or need(k) <= budget:
            sets = k
            break
    why = ""
    if sets < asked:
        k = sets + 1
        why = ("%d set(s) need %s of GPU memory (%s per set: the reference's inputs and outputs), but %s is free" % (k, _human(need(k)), _human(per_set),
                                                                   _human(budget)))
    return sets, why


class _Resident:
    """Tensors kept on the GPU for the evaluator to map (reference --resident).

    Nothing is written: each tensor stays alive here, and the manifest names it
    by the CUDA IPC handle of its allocation and its offset in it. The driver is
    called through ctypes: the IPC handle of an allocation of torch's caching
    allocator, whatever torch's version.
    """

    def __init__(self):
        import ctypes
        self._ct = ctypes
        try:
            self._cuda = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise BridgeError("device_error", "--resident needs the CUDA driver (libcuda.so.1): %s" % e)
        self.tensors = []   # kept alive until the bridge exits
        self._handles = {}  # allocation base -> base64 IPC handle

    def _call(self, name, *args):
        rc = getattr(self._cuda, name)(*args)
        if rc != 0:
            raise BridgeError("device_error", "%s failed with CUDA error %d while exporting the reference "
                              "(is PYTORCH_CUDA_ALLOC_CONF asking for expandable segments? they cannot be "
                              "shared)" % (name, rc))

    def export(self, t):
        """Keeps t (contiguous) and returns {"handle", "offset", "bytes"}."""
        import base64
        t = t.detach().contiguous()
        nbytes = t.numel() * t.element_size()
        self.tensors.append(t)
        if nbytes == 0:
            return {"handle": "", "offset": 0, "bytes": 0}
        ct = self._ct
        ptr = t.data_ptr()
        base, size = ct.c_uint64(0), ct.c_size_t(0)
        self._call("cuMemGetAddressRange_v2", ct.byref(base), ct.byref(size), ct.c_uint64(ptr))
        if base.value not in self._handles:
            handle = (ct.c_char * 64)()
            self._call("cuIpcGetMemHandle", handle, ct.c_uint64(base.value))
            self._handles[base.value] = base64.b64encode(handle.raw).decode()
        return {"handle": self._handles[base.value], "offset": ptr - base.value, "bytes": nbytes}

    def pci_bus_id(self):
        """The PCI bus id of the GPU the tensors live on (this process's current
        device), "" when the driver cannot say: an evaluator on another GPU
        copies them into its own memory instead of reading them across GPUs."""
        ct = self._ct
        dev, bus = ct.c_int(0), ct.create_string_buffer(32)
        if self._cuda.cuCtxGetDevice(ct.byref(dev)) != 0 or self._cuda.cuDeviceGetPCIBusId(bus, 32, dev) != 0:
            return ""
        return bus.value.decode()


_WEIGHTS = {}  # device -> int64 position weights (i % 65521 + 1), shared by every chunk (_fingerprint)


def _chunk_weights(n, device):
    """Position weights for one chunk of n elements (made once per device)."""
    import torch
    key = str(device)
    w = _WEIGHTS.get(key)
    if w is None or w.numel() < n:  # grown to the longest chunk seen (at most CHUNK_ELEMENTS)
        w = torch.arange(n, device=device, dtype=torch.int64) % 65521 + 1
        _WEIGHTS[key] = w
    return w[:n]


def _fingerprint(t):
    """A cheap digest of t's bytes computed where t lives (chunked: no copy of a
    multi-GB tensor): tells whether forward changed an input in place. The
    bytes are read as 32-bit words where the tensor allows (a quarter of the
    elements), each chunk's sum and position-weighted sum (weighted again by
    the chunk's index, so a permutation changes it too) add up on the device
    in int64, wrapping (the same for any order), and one sync per tensor
    reads them. The digest depends on the bytes and their number only."""
    import torch
    flat = t.detach().contiguous().reshape(-1)
    if flat.numel() == 0:
        return (0, 0)
    b = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
    words = b
    if b.numel() % 4 == 0:
        if b.storage_offset() % 4:
            b = b.clone()  # a view at an odd byte offset (rare): the same bytes, the same digest
        words = b.view(torch.int32)
    total = torch.zeros((), dtype=torch.int64, device=words.device)
    weighted = torch.zeros((), dtype=torch.int64, device=words.device)
    for k, i in enumerate(range(0, words.numel(), CHUNK_ELEMENTS)):
        c = words[i:i + CHUNK_ELEMENTS].to(torch.int64)
        total += c.sum()
        weighted += (c * _chunk_weights(c.numel(), c.device)).sum() * (k + 1)
    return (int(total), int(weighted))


def _same_data(a, b):
    """Digests (file mode: SHA-1 strings) or kept tensors (resident mode) compare equal."""
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    import torch
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


def _keep_inputs_pristine(problem, specs, kept, prints, i, set_seed, device):
    """Resident mode: set i's kept inputs must be what the reference saw. When
    forward changed one in place, the set is generated again from its seed (and
    must give the same bytes as the first time)."""
    if all(_fingerprint(t) == p for t, p in zip(kept[i], prints[i])):
        return
    fresh = [v.contiguous() for spec, v in zip(specs, problem.inputs(set_seed, device)) if spec["kind"] == "tensor"]
    if [_fingerprint(t) for t in fresh] != prints[i]:
        raise problem.fail("inputs_vary", "forward() changes its inputs in place, and get_inputs() does not give "
                           "the same tensors again for seed %d: the reference cannot be kept" % set_seed)
    kept[i] = fresh


def _with_scalars(problem, specs, tensors):
    """The argument list of forward: kept tensors, and scalar inputs from the signature."""
    out, it = [], iter(tensors)
    for spec in specs:
        out.append(next(it) if spec["kind"] == "tensor" else spec["value"])
    return out
