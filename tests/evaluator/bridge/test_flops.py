"""pytest for the bridge's FLOP count (evaluator/reference/bridge.py: count_flops),
the compute floor's numerator: torch's own FLOP counter over one forward on the
meta device, split by the operands' dtype.

torch.utils.flop_counter came with torch 2.1: on an older torch (Debian's 1.13)
the counting tests skip with a message, and one test checks that the figure
says why it is missing. Runs without pytest too (python3 test_flops.py), for a
GPU machine whose python has torch 2.x but no pytest.
"""
import os
import pathlib
import sys
import tempfile
import textwrap

try:
    import pytest
except ImportError:  # standalone run: see the bottom of this file
    pytest = None
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "evaluator" / "reference"))
import bridge  # noqa: E402
from ks_bridge import flops as bridge_flops  # noqa: E402

try:
    import torch.utils.flop_counter  # noqa: F401
    HAS_COUNTER = True
except ImportError:
    HAS_COUNTER = False
NO_COUNTER = "torch %s has no torch.utils.flop_counter (torch >= 2.1 counts FLOPs)" % torch.__version__


def needs_counter(fn):
    fn.needs_counter = True  # the standalone runner's skip
    if pytest is not None:
        return pytest.mark.skipif(not HAS_COUNTER, reason=NO_COUNTER)(fn)
    return fn


def count(tmp, source, seed=42):
    path = os.path.join(str(tmp), "problem.py")
    with open(path, "w") as f:
        f.write(textwrap.dedent(source))
    return bridge.count_flops(bridge.Problem(path).load(), seed)


MATMUL = """
import torch
M, K, N = 1024, 512, 2048
class Model(torch.nn.Module):
    def forward(self, a, b):
        return torch.matmul(a, b)
def get_inputs():
    return [torch.randn(M, K), torch.randn(K, N)]
def get_init_inputs():
    return []
"""


@needs_counter
def test_matmul_fp32(tmp_path):
    f = count(tmp_path, MATMUL)
    assert f["flops_source"] == "counted"
    assert f["flops"] == 2 * 1024 * 512 * 2048, f
    assert f["flops_by_class"] == {"fp32": 2 * 1024 * 512 * 2048}


@needs_counter
def test_linear_with_activation_counts_the_gemm(tmp_path):
    f = count(tmp_path, """
        import torch
        class Model(torch.nn.Module):
            def __init__(self, i, o):
                super().__init__()
                self.fc = torch.nn.Linear(i, o)
            def forward(self, x):
                return torch.relu(self.fc(x)) * 2.0
        def get_inputs():
            return [torch.randn(128, 4096)]
        def get_init_inputs():
            return [4096, 1024]
    """)
    assert f["flops"] == 2 * 128 * 4096 * 1024, f
    assert set(f["flops_by_class"]) == {"fp32"}


@needs_counter
def test_conv2d(tmp_path):
    f = count(tmp_path, """
        import torch
        class Model(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv = torch.nn.Conv2d(3, 64, kernel_size=3, padding=1, groups=1)
            def forward(self, x):
                return self.conv(x)
        def get_inputs():
            return [torch.randn(8, 3, 32, 32)]
        def get_init_inputs():
            return []
    """)
    # 2 x batch x C_out x C_in x kh x kw x H_out x W_out
    assert f["flops"] == 2 * 8 * 64 * 3 * 3 * 3 * 32 * 32, f
    assert f["flops_by_class"] == {"fp32": f["flops"]}


@needs_counter
def test_bmm_bf16(tmp_path):
    f = count(tmp_path, """
        import torch
        class Model(torch.nn.Module):
            def forward(self, a, b):
                return torch.bmm(a, b)
        def get_inputs():
            return [torch.randn(16, 256, 128, dtype=torch.bfloat16), torch.randn(16, 128, 64, dtype=torch.bfloat16)]
        def get_init_inputs():
            return []
    """)
    assert f["flops"] == 2 * 16 * 256 * 128 * 64, f
    assert f["flops_by_class"] == {"bf16": f["flops"]}


@needs_counter
def test_attention_fp16(tmp_path):
    f = count(tmp_path, """
        import torch
        import torch.nn.functional as F
        class Model(torch.nn.Module):
            def forward(self, q, k, v):
                return F.scaled_dot_product_attention(q, k, v)
        def get_inputs():
            shape = (2, 8, 512, 64)
            return [torch.randn(*shape, dtype=torch.float16) for _ in range(3)]
        def get_init_inputs():
            return []
    """)
    # QK^T and PV: 2 x b x h x s_q x s_k x (d_qk + d_v)
    assert f["flops"] == 2 * 2 * 8 * 512 * 512 * (64 + 64), f
    # fp16, not the fp32 of the math fallback that runs attention off a GPU.
    assert f["flops_by_class"] == {"fp16": f["flops"]}, f


@needs_counter
def test_elementwise_counts_zero(tmp_path):
    f = count(tmp_path, """
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return torch.nn.functional.gelu(x) + 1.0
        def get_inputs():
            return [torch.randn(4096, 4096)]
        def get_init_inputs():
            return []
    """)
    assert f["flops_source"] == "counted"
    assert f["flops"] == 0 and f["flops_by_class"] == {}


@needs_counter
def test_declared_flops_override_the_count(tmp_path):
    f = count(tmp_path, MATMUL + "\nFLOPS = 123456789\n")
    assert f["flops_source"] == "FLOPS"
    assert f["flops"] == 123456789
    assert "counted: %d" % (2 * 1024 * 512 * 2048) in f["flops_note"]
    assert sum(f["flops_by_class"].values()) == 123456789


@needs_counter
def test_forward_that_cannot_run_on_meta_says_so(tmp_path):
    f = count(tmp_path, """
        import torch
        class Model(torch.nn.Module):
            def forward(self, x):
                return x * float(x.sum().item())
        def get_inputs():
            return [torch.randn(64)]
        def get_init_inputs():
            return []
    """)
    assert f["flops"] is None and f["flops_source"] is None
    assert "meta device" in f["flops_note"]


@needs_counter
def test_signature_subcommand_carries_the_count(tmp_path):
    path = os.path.join(str(tmp_path), "problem.py")
    with open(path, "w") as f:
        f.write(MATMUL)

    class Args:
        seed = 42
        device = "cpu"
    sig = bridge.cmd_signature(bridge.Problem(path).load(), Args())
    assert sig["flops"] == 2 * 1024 * 512 * 2048 and sig["flops_source"] == "counted"


def test_without_the_counter_the_figure_says_why(tmp_path):
    if HAS_COUNTER:
        # Simulate the old torch: the counter class is what decides.
        saved = bridge_flops._flop_counter_class
        bridge_flops._flop_counter_class = lambda: None
        try:
            f = count(tmp_path, MATMUL)
        finally:
            bridge_flops._flop_counter_class = saved
    else:
        f = count(tmp_path, MATMUL)
    assert f["flops"] is None and f["flops_source"] is None
    assert "torch.utils.flop_counter" in f["flops_note"]
    g = count(tmp_path, MATMUL + "\nFLOPS = 7\n")
    assert g["flops"] == 7 and g["flops_source"] == "FLOPS"


if __name__ == "__main__":
    failed = 0
    for name, fn in sorted(globals().items()):
        if not name.startswith("test_") or not callable(fn):
            continue
        if getattr(fn, "needs_counter", False) and not HAS_COUNTER:
            print("SKIP %s: %s" % (name, NO_COUNTER))
            continue
        with tempfile.TemporaryDirectory() as d:
            try:
                fn(pathlib.Path(d))
                print("PASS %s" % name)
            except Exception as e:  # noqa: BLE001
                failed += 1
                print("FAIL %s: %s: %s" % (name, type(e).__name__, e))
    sys.exit(1 if failed else 0)
