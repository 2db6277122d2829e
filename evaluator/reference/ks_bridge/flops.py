"""The problem's FLOPs for the compute floor: torch's FLOP counter over one
forward on the meta device, booked by compute class (the operands' dtype)."""

from ks_bridge.errors import _first_line
from ks_bridge.meta import _add_missing_meta_kernels, _meta_mode_class
from ks_bridge.signature import _dtype_name


# Op names that do matrix work: one of these without a FLOP formula makes the
# count an undercount, and the figure says so.
_MATRIX_OP_WORDS = ("mm", "conv", "attention", "linear", "matmul", "dot", "einsum")


# The dtype of an op's operands -> the compute class whose measured peak
# (peaks.py) bounds it. Classes without a measured peak get no compute floor.
# The keys count_flops merges into a signature.
FLOP_KEYS = ("flops", "flops_source", "flops_by_class", "flops_note")

_FLOP_CLASS = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64"}


def _attention_flops(q, k, v):
    """QK^T and PV of scaled-dot-product attention, 2 FLOPs per multiply-add
    (torch's own sdpa formula); q, k, v are shapes [..., s, d]."""
    batch = 1
    for d in q[:-2]:
        batch *= int(d)
    s_q, d_q, s_k, d_v = int(q[-2]), int(q[-1]), int(k[-2]), int(v[-1])
    return 2 * batch * s_q * s_k * (d_q + d_v)


def _flop_counter_class():
    """A FlopCounterMode that also books each op's FLOPs under its operands'
    dtype (the compute class), and names matrix ops it has no formula for.
    None where torch has no torch.utils.flop_counter (torch < 2.1)."""
    import torch
    try:
        from torch.utils.flop_counter import FlopCounterMode
    except ImportError:
        return None

    class DtypeFlopCounter(FlopCounterMode):
        def __init__(self):
            mapping = {}
            # The CPU's fused attention has no formula in some torch versions.
            cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
            if cpu_sdpa is not None:
                # FlopCounterMode hands a custom formula shapes, not tensors.
                mapping[cpu_sdpa] = lambda q, k, v, *a, out_shape=None, **kw: _attention_flops(q, k, v)
            super().__init__(display=False, custom_mapping=mapping)
            self.by_dtype = {}
            self.uncounted = set()
            self.paused = False  # inside an op counted as a whole (attention, below)

        def add(self, dtype, n):
            self.by_dtype[dtype] = self.by_dtype.get(dtype, 0) + int(n)

        def _count_flops(self, func_packet, out, args, kwargs):
            if self.paused:
                return out
            name = str(getattr(func_packet, "__name__", func_packet))
            if func_packet in self.flop_registry:
                n = self.flop_registry[func_packet](*args, **kwargs, out_val=out)
                dtype = next((_dtype_name(a) or str(a.dtype) for a in args if isinstance(a, torch.Tensor)), "unknown")
                self.add(dtype, n)
            elif any(w in name for w in _MATRIX_OP_WORDS):
                self.uncounted.add(name)
            return super()._count_flops(func_packet, out, args, kwargs)

    return DtypeFlopCounter


def _attention_mode_class():
    """A TorchFunctionMode that counts scaled-dot-product attention as a whole,
    in its operands' dtype. Off a GPU (the meta device) torch runs attention as
    its math fallback, which computes half-precision attention in float32: the
    counter would see fp32 matmuls and book the work in the wrong class."""
    import torch
    from torch.overrides import TorchFunctionMode
    sdpa = getattr(torch.nn.functional, "scaled_dot_product_attention", None)

    class AttentionMode(TorchFunctionMode):
        def __init__(self, counter):
            super().__init__()
            self.counter = counter

        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if sdpa is None or func is not sdpa or self.counter.paused:
                return func(*args, **kwargs)
            qkv = list(args[:3]) + [kwargs.get(n) for n in ("query", "key", "value")[len(args[:3]):]]
            q, k, v = qkv
            self.counter.add(_dtype_name(q) or str(q.dtype), _attention_flops(q.shape, k.shape, v.shape))
            self.counter.paused = True
            try:
                return func(*args, **kwargs)
            finally:
                self.counter.paused = False

    return AttentionMode


def count_flops(problem, seed):
    """The problem's FLOPs, for the compute floor: the keys merged into the signature.

    {"flops": N or None, "flops_source": "FLOPS" | "counted" | None,
     "flops_by_class": {"fp32": N, ...} (counted only), "flops_note": "..."}.
    Counted with torch's own FLOP counter (matmul, convolution, attention; 2
    FLOPs per multiply-add) over one forward on the meta device, so nothing is
    computed and nothing allocated. A FLOPS in the problem file overrides the
    count. Where counting is not possible the note says why, and the evaluator's
    floor is then the memory floor alone.
    """
    import torch
    declared = problem.flops
    counter_cls = _flop_counter_class()
    result = {"flops": declared, "flops_source": "FLOPS" if declared is not None else None,
              "flops_by_class": {}, "flops_note": ""}
    if counter_cls is None:
        why = "torch %s has no torch.utils.flop_counter (it needs torch >= 2.1)" % torch.__version__
        if declared is None:
            result["flops_note"] = "FLOPs not counted: " + why
        return result
    try:
        _add_missing_meta_kernels()
        with _meta_mode_class()():
            model = problem.build_model(seed, None)
            inputs = problem.inputs(seed + 1, None)
            counter = counter_cls()
            with torch.no_grad(), counter, _attention_mode_class()(counter):
                model(*inputs)
    except Exception as e:  # noqa: BLE001 - the problem still runs; only its FLOPs are unknown
        if declared is None:
            result["flops_note"] = ("FLOPs not counted: the forward does not run on the meta device (%s: %s)"
                                    % (type(e).__name__, _first_line(e, 200)))
        return result
    by_class, notes = {}, []
    for dtype, n in sorted(counter.by_dtype.items()):
        cls = _FLOP_CLASS.get(dtype)
        if cls is None:
            notes.append("%d FLOPs on %s operands have no compute class" % (n, dtype))
            cls = dtype
        by_class[cls] = by_class.get(cls, 0) + n
    if counter.uncounted:
        notes.append("no FLOP formula for %s: the count leaves their work out" % ", ".join(sorted(counter.uncounted)))
    counted = sum(by_class.values())
    if declared is None:
        result.update(flops=counted, flops_source="counted", flops_by_class=by_class)
    else:
        # The file's figure wins; the count is kept as a cross-check and for
        # the dtype split (scaled to the declared total).
        if counted > 0:
            result["flops_by_class"] = {k: declared * v / counted for k, v in by_class.items()}
        notes.insert(0, "FLOPS from the problem file (counted: %d)" % counted)
    result["flops_note"] = "; ".join(notes)
    return result
