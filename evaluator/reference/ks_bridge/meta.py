"""The meta device: a TorchFunctionMode that keeps every tensor a problem
creates shape-only, and the meta kernels torch 1.13 lacks for ops KernelBench
uses. Shape inference and the FLOP count run a forward here, computing nothing."""


# torch functions that create a tensor and take `device=`: while shapes are
# inferred they are sent to the "meta" device, so building the model and calling
# get_inputs() allocate nothing. (`torch.device` as a context manager does this
# on torch >= 2; a TorchFunctionMode does it on 1.13 as well.)
_FACTORIES = frozenset((
    "rand", "randn", "randint", "randperm", "empty", "empty_strided", "zeros", "ones", "full", "arange",
    "linspace", "logspace", "eye", "tensor", "as_tensor", "scalar_tensor", "normal", "bernoulli",
    "rand_like", "randn_like", "randint_like", "zeros_like", "ones_like", "empty_like", "full_like",
))


def _meta_mode_class():
    """A TorchFunctionMode that keeps everything on the meta device."""
    import torch
    from torch.overrides import TorchFunctionMode

    meta = torch.device("meta")

    def on_meta(x):
        return isinstance(x, torch.Tensor) and x.device == meta

    class MetaMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            name = getattr(func, "__name__", "")
            if name in _FACTORIES and getattr(torch, name, None) is func:
                kwargs["device"] = meta
                kwargs.pop("generator", None)  # a CPU generator cannot draw on meta
            elif name in ("cuda", "cpu") and args and on_meta(args[0]):
                return args[0]  # problems that place their tensors explicitly
            elif name == "to" and args and on_meta(args[0]):
                # Keep a dtype change, drop a device change: x.to("cuda"), x.to(device, dtype).
                kwargs.pop("device", None)
                rest = [a for a in args[1:] if not isinstance(a, (str, torch.device))]
                if not rest and not kwargs:
                    return args[0]
                args = (args[0],) + tuple(rest)
            return func(*args, **kwargs)

    return MetaMode


def _pool_out(size, k, s, p, d, ceil):
    """PyTorch's pooling output length (ATen pooling_output_shape)."""
    num = size + 2 * p - d * (k - 1) - 1 + ((s - 1) if ceil else 0)
    out = num // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


_META_KERNELS_ADDED = []


def _add_missing_meta_kernels():
    """Meta kernels for the few ops KernelBench uses that torch 1.13 lacks one for.

    Registered only where the op really fails on meta (a newer torch has its
    own), and only for the shape: nothing here ever computes a value.
    """
    import torch
    if _META_KERNELS_ADDED:
        return
    _META_KERNELS_ADDED.append(True)
    try:
        torch.nn.functional.max_pool3d(torch.empty(1, 1, 2, 2, 2, device="meta"), 2)
        return
    except NotImplementedError:
        pass
    except Exception:  # noqa: BLE001 - a torch that fails differently: leave it to the real run
        return

    def triple(v, default):
        v = list(v) if isinstance(v, (list, tuple)) else [v]
        if not v:
            v = list(default)
        return v * 3 if len(v) == 1 else v

    def max_pool3d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1, ceil_mode=False):
        k = triple(kernel_size, ())
        s = triple(stride, k)
        p = triple(padding, ())
        d = triple(dilation, ())
        spatial = [_pool_out(x.shape[-3 + i], k[i], s[i], p[i], d[i], ceil_mode) for i in range(3)]
        shape = list(x.shape[:-3]) + spatial
        return (torch.empty(shape, dtype=x.dtype, device="meta"), torch.empty(shape, dtype=torch.int64, device="meta"))

    lib = torch.library.Library("aten", "IMPL", "Meta")
    lib.impl("max_pool3d_with_indices", max_pool3d_with_indices)
    _META_KERNELS_ADDED.append(lib)  # the registration lives as long as the library object
