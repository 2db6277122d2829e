"""Issue 34: the exported kernel as a PyTorch operator, on a CPU torch.

The operator's schema follows the signature on any torch. Where torch has
torch.library.custom_op (2.4 and later), the fake implementation gives the
problem's output shapes on meta tensors, torch.compile traces a model that
uses ModelNew as one graph, and the backward (PyTorch's own, recomputed)
reaches the inputs and the parameters: shown here with the kernel replaced
by the problem's forward, since no kernel runs on a CPU. Where torch lacks
custom_op (torch 1.13 in CI) those tests skip, and OP_NOTE says what the
module does instead. Running the kernel compiled, under CUDA graphs and in a
training step is export_gpu_test's (tests/export/compile_module.py).
"""
import pytest

from conftest import build_module

torch = pytest.importorskip("torch")

PROBLEM = '''import torch
class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln = torch.nn.LayerNorm(n)
        with torch.no_grad():
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)
    def forward(self, x):
        return self.ln(x) * 2.0
def get_inputs():
    return [torch.rand(4, 16)]
def get_init_inputs():
    return [16]
'''
PLAN = {"launches": [{"kernel": "norm", "grid": ["x.shape[0]"], "block": [256],
                      "args": ["x", "ln.weight", "ln.bias", "out", "x.shape[1]"]}]}
SIGNATURE = {"name": "ln", "inputs": [{"name": "x", "kind": "tensor", "dtype": "float32", "shape": [4, 16]}],
             "parameters": [{"name": "ln.weight", "kind": "tensor", "dtype": "float32", "shape": [16]},
                            {"name": "ln.bias", "kind": "tensor", "dtype": "float32", "shape": [16]}],
             "outputs": [{"name": "out", "kind": "tensor", "dtype": "float32", "shape": [4, 16]}]}
KERNELS = {"norm": ["b64", "b64", "b64", "b64", "b32"]}
SOURCE = 'extern "C" __global__ void norm(const float* x, const float* w, const float* b, float* out, int n) {}\n'


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return build_module(tmp_path_factory.mktemp("export_op"), PROBLEM, PLAN, SIGNATURE, KERNELS, SOURCE,
                        name="kernel_module_op")


def has_custom_op():
    return hasattr(getattr(torch, "library", None), "custom_op")


needs_op = pytest.mark.skipif(not has_custom_op(), reason="torch %s has no torch.library.custom_op (torch 2.4 "
                              "and later): ModelNew falls back to a plain eager call (OP_NOTE)" % torch.__version__)


def dynamo_supported():
    try:
        import torch._dynamo
        return torch._dynamo.is_dynamo_supported()
    except Exception:  # noqa: BLE001
        return False


needs_dynamo = pytest.mark.skipif(not has_custom_op() or not dynamo_supported(),
                                  reason="torch.compile needs torch >= 2.4 with dynamo on this Python")


def meta_model(module, n=16):
    return module.ModelNew(n).to("meta")


def test_the_operator_or_the_reason_why_not(module):
    if has_custom_op():
        assert module.OP is not None, module.OP_NOTE
        assert module.OP_NAME.startswith("kernelsearch::candidate_42"), module.OP_NAME
        assert module.OP_NOTE == ""
    else:
        assert module.OP is None and module.OP_NAME == ""
        assert "torch.library.custom_op (torch 2.4 and later)" in module.OP_NOTE
        assert "without autograd" in module.OP_NOTE and "graph" in module.OP_NOTE


def test_the_schema_follows_the_signature(module, monkeypatch):
    assert module._op_schema() == ("(int ks_model, bool ks_training, Tensor in0_x, Tensor state0_ln_weight, "
                                   "Tensor state1_ln_bias) -> Tensor")
    # Scalars by their dtype, several outputs as a tuple, names made identifiers.
    monkeypatch.setattr(module, "SIGNATURE", {
        "inputs": [{"name": "x", "kind": "tensor", "dtype": "float32", "shape": [2]},
                   {"name": "eps", "kind": "scalar", "dtype": "float32", "value": 0.1},
                   {"name": "k", "kind": "scalar", "dtype": "int64", "value": 3}],
        "parameters": [{"name": "0.weight", "kind": "tensor", "dtype": "float32", "shape": [2]}],
        "outputs": [{"name": "out0", "kind": "tensor", "dtype": "float32", "shape": [2]},
                    {"name": "out1", "kind": "tensor", "dtype": "int64", "shape": [2]}]})
    assert module._op_schema() == ("(int ks_model, bool ks_training, Tensor in0_x, float in1_eps, int in2_k, "
                                   "Tensor state0_0_weight) -> (Tensor, Tensor)")
    assert module._op_scalar("float", 2) == 2.0 and isinstance(module._op_scalar("float", 2), float)
    assert module._op_scalar("int", torch.tensor(3)) == 3 and module._op_scalar("bool", 1) is True
    assert module._SCALAR_KINDS == (None,)  # the module's own signature: one tensor


def test_each_model_has_its_own_key_and_a_copy_a_new_one(module):
    import copy
    a, b = module.ModelNew(16), module.ModelNew(16)
    c = copy.deepcopy(a)
    assert len({a._ks_key, b._ks_key, c._ks_key}) == 3
    assert module._model(c._ks_key) is c
    key = b._ks_key
    del b
    import gc
    gc.collect()
    with pytest.raises(RuntimeError, match="no longer exists"):
        module._model(key)


@needs_op
def test_a_second_import_registers_an_operator_of_its_own(module, tmp_path):
    again = build_module(tmp_path, PROBLEM, PLAN, SIGNATURE, KERNELS, SOURCE, name="kernel_module_op_again")
    assert again.OP is not None, again.OP_NOTE
    assert again.OP_NAME != module.OP_NAME  # never replaces the first module's operator
    assert module.OP is not again.OP


@needs_op
def test_the_fake_gives_the_problems_output_shapes(module):
    m = meta_model(module)
    for shape in ((4, 16), (7, 16), (2, 3, 16)):  # the signature's, and two it was not verified at
        out = m(torch.empty(*shape, device="meta"))
        assert out.device.type == "meta" and out.dtype == torch.float32 and tuple(out.shape) == shape
    # Called as the operator, as torch.compile calls it.
    out = module.OP(m._ks_key, False, torch.empty(9, 16, device="meta"), m.ln.weight, m.ln.bias)
    assert tuple(out.shape) == (9, 16)


@needs_op
def test_the_fake_refuses_what_the_kernel_refuses(module):
    m = meta_model(module)
    with pytest.raises(TypeError, match="the kernel takes torch.float32"):
        m(torch.empty(4, 16, dtype=torch.float64, device="meta"))
    with pytest.raises(ValueError, match="cannot tell the output shapes"):
        m(torch.empty(4, 15, device="meta"))  # the problem's own forward refuses 15 features
    with pytest.raises(ValueError, match="CUDA tensors"):
        module.ModelNew(16)(torch.rand(4, 16))


@needs_op
def test_the_fake_under_fake_tensor_mode_with_symbolic_shapes(module):
    from torch.fx.experimental.proxy_tensor import make_fx
    m = module.ModelNew(16)
    key = m._ks_key
    gm = make_fx(lambda x, w, b: module.OP(key, True, x, w, b), tracing_mode="symbolic")(
        torch.empty(5, 16, device="meta"), torch.empty(16, device="meta"), torch.empty(16, device="meta"))
    calls = [n for n in gm.graph.nodes if n.op == "call_function" and "candidate_42" in str(n.target)]
    assert len(calls) == 1, gm.graph
    val = calls[0].meta["val"]
    assert val.dim() == 2 and val.dtype == torch.float32, val


@needs_dynamo
def test_one_graph_without_a_break(module):
    import torch._dynamo
    m = meta_model(module)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(m)(torch.empty(4, 16, device="meta"))
    assert explained.graph_count == 1 and explained.graph_break_count == 0, explained.break_reasons
    out = torch.compile(m, backend="eager", fullgraph=True)(torch.empty(6, 16, device="meta"))
    assert tuple(out.shape) == (6, 16)


@pytest.fixture
def stand_in(module, monkeypatch):
    """The kernel replaced by the problem's own forward (no kernel runs on a CPU):
    what reaches it and what autograd does around it are the operator's."""
    calls = []

    def call_kernel(model_key, training, inputs, state):
        calls.append([tuple(v.shape) for v in inputs + state])
        with torch.no_grad():
            outs = module._reference_outputs(module._model(model_key), training, inputs, state)
        return outs[0].clone()
    monkeypatch.setattr(module, "_call_kernel", call_kernel)
    return calls


def training_step(model, x, g):
    x = x.detach().clone().requires_grad_()
    model.zero_grad(set_to_none=True)
    model(x).backward(g)
    return [x.grad] + [p.grad for p in model.parameters()]


@needs_op
def test_gradients_reach_the_inputs_and_the_parameters(module, stand_in):
    torch.manual_seed(0)
    new = module.ModelNew(16)
    ref = module._problem.Model(16)
    ref.load_state_dict(new.state_dict())
    x, g = torch.randn(5, 16), torch.randn(5, 16)
    got, want = training_step(new, x, g), training_step(ref, x, g)
    assert stand_in, "the operator did not call the kernel"
    assert all(a is not None for a in got)
    for a, b in zip(got, want):  # PyTorch's own backward, recomputed: the same numbers
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6), (a - b).abs().max()
    # check_backward's figures by the judge's rule (float64 truth) agree.
    report = module.check_backward(new, x)
    assert report["ok"], report
    assert [f["name"] for f in report["gradients"]] == ["x", "ln.weight", "ln.bias"]


@needs_op
def test_the_backward_follows_train_and_eval_mode():
    problem = PROBLEM.replace("return self.ln(x) * 2.0", "return self.ln(x) * (2.0 if self.training else 3.0)")
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        mod = build_module(d, problem, PLAN, SIGNATURE, KERNELS, SOURCE, name="kernel_module_op_mode")
        mod._call_kernel = stand_in_kernel(mod)
        m = mod.ModelNew(16).eval()
        x = torch.randn(3, 16, requires_grad=True)
        m(x).sum().backward()
        ref = mod._problem.Model(16).eval()
        ref.load_state_dict(m.state_dict())
        x2 = x.detach().clone().requires_grad_()
        ref(x2).sum().backward()
        assert torch.allclose(x.grad, x2.grad, atol=1e-6)


def stand_in_kernel(mod):
    def call_kernel(model_key, training, inputs, state):
        with torch.no_grad():
            return mod._reference_outputs(mod._model(model_key), training, inputs, state)[0].clone()
    return call_kernel


@needs_dynamo
def test_compiled_training_traces_the_backward(module, stand_in):
    """aot_eager traces forward and backward as torch.compile's default
    backend does (the recomputation included) without generating code."""
    import torch._dynamo
    torch._dynamo.reset()
    torch.manual_seed(0)
    new = module.ModelNew(16)
    ref = module._problem.Model(16)
    ref.load_state_dict(new.state_dict())
    compiled = torch.compile(new, backend="aot_eager", fullgraph=True)
    x, g = torch.randn(5, 16), torch.randn(5, 16)
    got, want = training_step(compiled, x, g), training_step(ref, x, g)
    for a, b in zip(got, want):
        assert a is not None and torch.allclose(a, b, rtol=1e-5, atol=1e-5), (a - b).abs().max()


def test_check_and_benchmark_take_a_compiled_model(module):
    # The problem's forward runs on the module inside the wrapper, never the wrapper's compiled forward.
    m = module.ModelNew(16)

    class Wrapper:  # what torch.compile returns, as far as check() looks
        _orig_mod = m
    assert module._base(Wrapper()) is m
    assert module._base(m) is m


# ---- the operator's pieces, called as torch would call them (any torch) ----

def test_the_fake_implementation_on_meta_tensors(module):
    """What the fake implementation returns, called directly: the problem's
    output shapes, the signature's dtype, the inputs' device."""
    m = module.ModelNew(16)
    w, b = m.ln.weight.to("meta"), m.ln.bias.to("meta")
    for shape in ((4, 16), (7, 16), (2, 3, 16)):
        out = module._op_fake(m._ks_key, True, torch.empty(*shape, device="meta"), w, b)
        assert out.device.type == "meta" and out.dtype == torch.float32 and tuple(out.shape) == shape
    with pytest.raises(ValueError, match="cannot tell the output shapes"):
        module._op_fake(m._ks_key, True, torch.empty(4, 15, device="meta"), w, b)
    # Any device: torch.compile traces a CPU model with CPU fake tensors; only the real call refuses CPU.
    out = module._op_fake(m._ks_key, True, torch.empty(4, 16), m.ln.weight, m.ln.bias)
    assert out.device.type == "cpu" and tuple(out.shape) == (4, 16)
    with pytest.raises(ValueError, match="CUDA tensors"):
        module._op_forward(m._ks_key, True, torch.empty(4, 16), m.ln.weight, m.ln.bias)
    with pytest.raises(ValueError, match="is on cpu"):
        module._op_fake(m._ks_key, True, torch.empty(4, 16, device="meta"), m.ln.weight, b)


class Ctx:
    """What register_autograd's setup_context and backward are given."""

    def save_for_backward(self, *tensors):
        self.saved_tensors = tensors


def test_the_backward_formula_is_pytorchs_own(module):
    """setup_context + backward as autograd calls them: PyTorch's gradients of
    the problem's forward at the saved inputs, None where none is asked for."""
    torch.manual_seed(0)
    m = module.ModelNew(16)
    x, g = torch.randn(5, 16), torch.randn(5, 16)
    args = (m._ks_key, True, x, m.ln.weight, m.ln.bias)
    ctx = Ctx()
    module._op_setup_context(ctx, args, torch.empty(5, 16))
    ctx.needs_input_grad = (False, False, True, True, False)
    got = module._op_backward(ctx, g)
    assert len(got) == len(args) and got[0] is None and got[1] is None and got[4] is None

    ref = module._problem.Model(16)
    ref.load_state_dict(m.state_dict())
    xr = x.clone().requires_grad_()
    ref(xr).backward(g)
    assert torch.allclose(got[2], xr.grad, rtol=1e-6, atol=1e-7)
    assert torch.allclose(got[3], ref.ln.weight.grad, rtol=1e-6, atol=1e-7)
    assert m.ln.weight.grad is None  # gradients are returned, not accumulated by the formula

    ctx.needs_input_grad = (False, False, False, False, False)
    assert module._op_backward(ctx, g) == (None,) * 5


def test_training_through_the_formula_as_autograd_calls_it(module, monkeypatch):
    """The operator's forward, setup_context and backward inside a plain
    autograd.Function (what custom_op builds from them), the kernel stood in
    for: gradients reach every parameter of a bigger model, and
    check_backward() passes by the judge's rule. Runs on any torch."""
    class Operator(torch.autograd.Function):
        @staticmethod
        def forward(ctx, key, training, *args):
            out = module._op_forward(key, training, *args)
            module._op_setup_context(ctx, (key, training) + args, out)
            return out

        @staticmethod
        def backward(ctx, *grads):
            return module._op_backward(ctx, *grads)

    monkeypatch.setattr(module, "OP", Operator.apply)
    monkeypatch.setattr(module, "_call_kernel", stand_in_kernel(module))
    monkeypatch.setattr(module, "_call_device", lambda inputs, fake=False: inputs[0].device)
    torch.manual_seed(0)
    layer = module.ModelNew(16)
    net = torch.nn.Sequential(torch.nn.Linear(16, 16), layer)
    x = torch.randn(8, 16)
    net(x).square().mean().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in net.parameters())
    report = module.check_backward(layer, x)
    assert report["ok"] and report["truth"] == "float64", report
    assert [f["name"] for f in report["gradients"]] == ["x", "ln.weight", "ln.bias"]
    assert module.check(layer, x)["ok"]


def test_without_the_operator_check_backward_says_why(module, monkeypatch):
    monkeypatch.setattr(module, "OP", None)
    monkeypatch.setattr(module, "OP_NOTE", "no custom_op here")
    report = module.check_backward(module.ModelNew(16), torch.randn(4, 16))
    assert not report["ok"] and report["why"] == "no custom_op here"


def test_gradients_arriving_at_the_outputs_leave_the_random_state_alone(module):
    """benchmark() and check_backward() draw the gradients that arrive at the
    outputs from a generator of their own: the caller's random state is
    untouched, and so is the device's default generator, which a CUDA graph
    capture registers (a draw from it outside the capture it belongs to is
    refused: "Offset increment outside graph capture")."""
    torch.manual_seed(7)
    outs = [torch.randn(3, 4, requires_grad=True) * 2, torch.zeros(3, dtype=torch.int64), torch.randn(2)]
    before = torch.get_rng_state()
    first = module._seeded_normal(outs)
    assert torch.equal(torch.get_rng_state(), before)
    assert first[1] is None and first[0].shape == (3, 4) and first[2].shape == (2,)
    again = module._seeded_normal(outs)
    assert all(torch.equal(x, y) for x, y in zip([first[0], first[2]], [again[0], again[2]]))
    only = module._seeded_normal(outs, only_differentiable=True)
    assert only[1] is None and only[2] is None and torch.equal(only[0], first[0])
    module._mark_step()  # no model compiled with reduce-overhead: nothing to do, on any torch
    assert torch.equal(torch.get_rng_state(), before)
