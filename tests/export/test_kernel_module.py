"""export/kernel_module.py, rendered as search/export.cc renders it and
imported on a CPU torch: the placeholders become the values, ModelNew is the
problem's Model, and what can be checked without a GPU is (argument checks,
the plan against RESOLVED). Running the kernel is export_gpu_test's."""
import os
import re
import sys

import pytest

from conftest import EXPORT_DIR, build_module

torch = pytest.importorskip("torch")

PROBLEM = '''import torch
class Model(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.ln = torch.nn.LayerNorm(n)
    def forward(self, x):
        return self.ln(x)
def get_inputs():
    return [torch.rand(4, 16)]
def get_init_inputs():
    return [16]
'''
SOURCE = 'extern "C" __global__ void row_stats(const float* x) {}\n// a "quote", a \\ backslash and @@NOT_A_KEY@@\n'
PLAN = {"launches": [{"kernel": "norm", "grid": ["x.shape[0]"], "block": [256],
                      "args": ["x", "ln.weight", "ln.bias", "out", "x.shape[1]"]}]}
SIGNATURE = {"name": "ln", "inputs": [{"name": "x", "kind": "tensor", "dtype": "float32", "shape": [4, 16]}],
             "parameters": [{"name": "ln.weight", "kind": "tensor", "dtype": "float32", "shape": [16]},
                            {"name": "ln.bias", "kind": "tensor", "dtype": "float32", "shape": [16]}],
             "outputs": [{"name": "out", "kind": "tensor", "dtype": "float32", "shape": [4, 16]}]}
KERNELS = {"norm": ["b64", "b64", "b64", "b64", "b32"]}


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    return build_module(tmp_path_factory.mktemp("export"), PROBLEM, PLAN, SIGNATURE, KERNELS, SOURCE)


def test_the_template_has_only_known_placeholders():
    text = (EXPORT_DIR / "kernel_module.py").read_text()
    assert set(re.findall(r"@@([A-Z_]+)@@", text)) == {
        "ID", "PROBLEM", "SPEEDUP", "SOURCE", "PLAN", "SIGNATURE", "KERNELS", "RESOLVED", "NVRTC_OPTIONS",
        "PRELUDE_NAME", "PRELUDE", "CUDA_HOME", "TARGET", "ROBUSTNESS", "JUDGE"}


def test_the_values_arrive_as_they_were(module):
    assert module.SOURCE == SOURCE
    assert module.PLAN == PLAN
    assert module.SIGNATURE == SIGNATURE
    assert module.KERNELS == KERNELS
    assert module.NVRTC_OPTIONS == ["--std=c++17"]
    assert module.PRELUDE_NAME == "ks_prelude.h"
    assert module.PRELUDE == "#define KS 1\n"
    assert module.EXPORT_CUDA_HOME == "/nonexistent/cuda"
    assert module.TARGET == "sm_90a"
    assert module.__doc__.startswith("kernelsearch export: candidate 42 of problem ln  small  "
                                     "(correct, 1.50x over PyTorch eager).")


def test_model_new_is_the_problems_model(module):
    m = module.ModelNew(16)
    assert isinstance(m, module._problem.Model)
    assert list(m.state_dict()) == ["ln.weight", "ln.bias"]
    m.load_state_dict(module._problem.Model(16).state_dict())


def test_the_plan_resolves_as_the_evaluator_did(module):
    env = module._plan.env_from_signature(module.SIGNATURE)
    assert module._plan.resolve_plan(module.PLAN, module.KERNELS, env) == module.RESOLVED
    assert module.RESOLVED["launches"][0]["grid"] == [4, 1, 1]


def test_an_arch_specific_target_runs_only_on_its_architecture(module):
    # sm_90a (wgmma, setmaxnreg) is kept on an H100 and refused elsewhere, with the reason.
    assert module.target_for(9, 0) == "sm_90a"
    for major, minor in ((8, 0), (10, 0), (12, 0)):
        with pytest.raises(RuntimeError, match=r"compiled for sm_90a, an arch-specific target.*this GPU is sm_%d%d"
                           % (major, minor)):
            module.target_for(major, minor)
    # A portable target (older records) compiles for whatever GPU runs it.
    assert module.target_for(8, 6, "sm_90") == "sm_86"
    assert module.target_for(10, 0, "sm_100a") == "sm_100a"


def test_tensor_map_descriptors_are_64_byte_aligned(module):
    import ctypes
    for _ in range(8):
        p = module._TensorMapParam()
        assert p.address() % 64 == 0
        assert ctypes.sizeof(p.map) == 128


def test_cpu_tensors_are_refused(module):
    with pytest.raises(ValueError, match="CUDA tensors"):
        module.ModelNew(16)(torch.rand(4, 16))


def test_inputs_are_checked(module):
    m = module.ModelNew(16)
    with pytest.raises(TypeError, match="expected the inputs"):
        m(torch.rand(4, 16), torch.rand(4, 16))
    with pytest.raises(TypeError, match="missing input 'x'"):
        m()
    with pytest.raises(TypeError, match="the kernel takes torch.float32"):
        module._tensor_arg(torch.zeros(4, 16, dtype=torch.float64), SIGNATURE["inputs"][0], torch.device("cpu"))
    with pytest.raises(TypeError, match="expected a tensor"):
        module._tensor_arg(3, SIGNATURE["inputs"][0], torch.device("cpu"))


def test_cuda_home_is_found_or_named(module, monkeypatch):
    for v in ("KS_CUDA_HOME", "CUDA_HOME", "CUDA_PATH"):
        monkeypatch.delenv(v, raising=False)
    try:
        home = module._cuda_home()
    except RuntimeError as e:
        assert "KS_CUDA_HOME" in str(e)
    else:
        assert os.path.exists(os.path.join(home, "include", "cuda_fp16.h"))


def test_output_shapes_follow_the_inputs(module):
    assert module.ModelNew(16)._output_shapes([torch.rand(7, 16)]) == [[7, 16]]
    assert module.ModelNew(16)._output_shapes([torch.rand(4, 16)]) == [[4, 16]]  # the signature's


if __name__ == "__main__":
    sys.exit(pytest.main([__file__]))


def test_robustness_arrives(module):
    assert module.ROBUSTNESS == {"specialised": False, "broken_by": "", "checks": []}


def test_check_judges_against_float64_with_pytorchs_own_error_per_block(module):
    """issue 36: the block bound is 16x PyTorch's own |fp32 - fp64| in each
    block of 256; an exact result passes where PyTorch itself is far off, and
    kernelbench is allclose at 1e-2 and nothing else."""
    import torch
    truth = torch.randn(1024, dtype=torch.float64)
    pt32 = truth.float()
    pt32[300] += 1.0  # PyTorch is wrong in block 1 (elements 256..511)
    bound = module._block_bound(pt32, truth)
    assert bound.shape == truth.shape
    assert float(bound[300]) >= 16 * 0.99 and float(bound[0]) < 1e-5
    exact = truth.clone().float()
    assert module.compare(exact, truth, "float32", bound=bound)["ok"]
    like_pytorch = pt32.clone()
    assert module.compare(like_pytorch, truth, "float32", bound=bound, own_rel_norm=module.compare(pt32, truth, "float32")["rel_norm"])["ok"]
    off_elsewhere = exact.clone()
    off_elsewhere[10] += 1.0  # far outside PyTorch's own error in block 0
    assert not module.compare(off_elsewhere, truth, "float32", bound=bound)["ok"]
    half = truth.half().float()
    assert not module.compare(half, truth, "float32")["ok"]
    assert module.compare(half, truth, "float32", contract="kernelbench")["ok"]


def test_compare_follows_the_evaluators_rules(module):
    import torch
    ref = torch.randn(1000, dtype=torch.float64).float()
    assert module.compare(ref.clone(), ref, "float32")["ok"]
    # Within atol/rtol everywhere but 1e-4 relative noise everywhere: the norm bound (1e-5) fails it.
    noisy = ref * (1 + 9e-5 * torch.sign(torch.randn(1000)))
    figures = module.compare(noisy, ref, "float32")
    assert figures["mismatches"] == 0 and not figures["ok"] and figures["rel_norm"] > 1e-5
    wrong = ref.clone()
    wrong[3] = float("nan")
    assert module.compare(wrong, ref, "float32")["mismatches"] == 1
    assert not module.compare(ref[:10], ref, "float32")["ok"]
    assert module.compare(torch.arange(5), torch.arange(5), "int64")["ok"]
    assert not module.compare(torch.arange(5), torch.arange(5) + 1, "int64")["ok"]
