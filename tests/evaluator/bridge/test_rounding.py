"""pytest for the bridge's measurement of PyTorch's own float32 rounding
(evaluator/reference/bridge.py: measure_rounding and what uses it), on CPU torch."""
import math
import os
import pathlib
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "evaluator" / "reference"))
import bridge  # noqa: E402
from ks_bridge import compile_helper as bridge_compile_helper  # noqa: E402

FIXTURES = ROOT / "tests" / "evaluator" / "fixtures"
CPU = torch.device("cpu")


def load(name):
    return bridge.Problem(str(FIXTURES / name)).load()


def first_set(problem, seed=42):
    model = problem.build_model(seed, CPU)
    inputs = problem.inputs(seed + 1, CPU)
    return model, inputs, problem.forward(model, inputs)


def test_cancelling_sum_rounding_matches_a_float64_sum():
    problem = load("cancelling_sum.py")
    model, inputs, outputs = first_set(problem)
    errors, note = bridge.measure_rounding(problem, model, 43, CPU, outputs, inputs, 0.01, 0)
    assert note is None
    (x,) = inputs
    exact = x.double().sum(1)
    d = outputs[0][1].double() - exact
    assert errors["out"]["rms"] == pytest.approx(math.sqrt(float((d * d).mean())), rel=1e-9)
    assert errors["out"]["rel_norm"] == pytest.approx(float(d.norm() / exact.norm()), rel=1e-9)
    assert 1e-5 < errors["out"]["rel_norm"] < bridge.MAX_ROUNDING_REL_NORM


def test_model_and_integer_inputs_are_left_as_they_are():
    class Gather(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.randn(10, 4))
            self.register_buffer("steps", torch.zeros((), dtype=torch.int64))

        def forward(self, idx, scale):
            assert idx.dtype == torch.int64
            return self.w[idx] * scale

    model = Gather()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    copy = bridge._float64_copy(model)
    assert copy.w.dtype == torch.float64 and copy.steps.dtype == torch.int64
    assert model.w.dtype == torch.float32
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())

    class FakeProblem:
        def inputs(self, seed, device):
            torch.manual_seed(seed)
            return [torch.randint(0, 10, (6,)), 2.0]

        def _outputs(self, result):
            return [("out", result)]

    p = FakeProblem()
    inputs = p.inputs(1, CPU)
    out = [("out", model(*inputs).detach())]
    errors, note = bridge.measure_rounding(p, model, 1, CPU, out, inputs, 0.001, 0)
    assert note is None
    # w[idx] * 2 is exact in float32: no rounding at all.
    assert errors == {"out": {"rms": 0.0, "rel_norm": 0.0}}


def test_skipped_when_too_slow_and_says_so(monkeypatch):
    problem = load("cancelling_sum.py")
    model, inputs, outputs = first_set(problem)
    monkeypatch.setenv("KS_FP64_CHECK_MAX_S", "0.5")
    errors, note = bridge.measure_rounding(problem, model, 43, CPU, outputs, inputs, 1.0, 0)
    assert errors == {}
    assert "skipped" in note and "$KS_FP64_CHECK_MAX_S" in note


def test_forward_that_refuses_float64_is_a_note():
    problem = load("float32_only.py")
    model, inputs, outputs = first_set(problem)
    errors, note = bridge.measure_rounding(problem, model, 43, CPU, outputs, inputs, 0.001, 0)
    assert errors == {}
    assert "failed (TypeError: float32 only)" in note


def test_non_float32_outputs_are_not_measured():
    class Half(torch.nn.Module):
        def forward(self, x):
            return x.half() * 2

    class P:
        def inputs(self, seed, device):
            return [torch.randn(4, 4)]

        def _outputs(self, result):
            return [("out", result)]

    inputs = P().inputs(0, CPU)
    out = [("out", Half()(*inputs))]
    assert bridge.measure_rounding(P(), Half(), 0, CPU, out, inputs, 0.001, 0) == ({}, None)


def test_widened_atol_matches_the_evaluators_rule():
    problem = load("cancelling_sum.py")
    e = {"rms": 0.03, "rel_norm": 2.5e-4}
    assert bridge._tolerance_for(problem, "float32", e) == (1e-4 + bridge.ROUNDING_FACTOR * 0.03, 1e-4)
    assert bridge._tolerance_for(problem, "float16", e) == bridge.DEFAULT_TOLERANCE["float16"]
    beyond = {"rms": 3.0, "rel_norm": 2 * bridge.MAX_ROUNDING_REL_NORM}
    assert bridge._tolerance_for(problem, "float32", beyond) == (1e-4, 1e-4)


def test_reference_manifest_carries_it(tmp_path):
    manifest = bridge.run_reference(load("cancelling_sum.py"), str(tmp_path), 2, 42, "cpu", False)
    err = manifest["signature"]["reference_error"]["out"]
    assert err["rms"] > 0 and 0 < err["rel_norm"] < bridge.MAX_ROUNDING_REL_NORM
    assert "float64 truth" in dict(manifest["phases"])


def test_compile_helper_that_cannot_compile_says_why_and_the_reference_times_itself():
    import subprocess
    if hasattr(torch, "compile"):
        pytest.skip("this torch compiles: the skip path needs one without torch.compile")
    proc = subprocess.Popen([sys.executable, bridge.__file__, "time-compiled", str(FIXTURES / "matmul.py"),
                             "--device", "cpu"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    ready, note = bridge.CompileHelper(proc).wait_compiled()
    assert not ready
    assert "timed in this process" in note and "no torch.compile" in note
    assert proc.returncode is not None


def test_compile_helper_protocol_compiled_then_timing_on_go():
    import subprocess
    speaker = ("import json, sys\n"
               "print(json.dumps({'compiled': True}), flush=True)\n"
               "assert sys.stdin.readline().strip() == 'go'\n"
               "print(json.dumps({'timing': {'median_ms': 1.5, 'runs': 10}}), flush=True)\n")
    proc = subprocess.Popen([sys.executable, "-c", speaker], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    helper = bridge.CompileHelper(proc)
    assert helper.wait_compiled() == (True, None)
    assert helper.time_compiled() == ({"median_ms": 1.5, "runs": 10}, None)
    assert proc.returncode == 0


def test_time_compiled_builds_the_same_model_and_sets_and_times_the_compiled_one(monkeypatch):
    """cmd_time_compiled on CPU torch with torch.compile, the GPU's memory and
    the timer stood in for: the model and input sets are the reference's (same
    seeds), compiled once before the go, then measured."""
    import io
    import timing as ks_timing
    calls = []
    monkeypatch.setattr(torch, "compile", lambda m: (calls.append("compile"), m)[1], raising=False)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda d=None: (64 << 30, 80 << 30))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda d=None: None)
    monkeypatch.setattr(bridge_compile_helper, "resolve_device", lambda p, d: CPU)

    class FakeTimer:
        def __init__(self, device):
            pass

        def measure(self, fn, arg_sets):
            calls.append(("measure", len(arg_sets), [a[0].sum().item() for a in arg_sets]))
            return {"median_ms": 2.0}

    monkeypatch.setattr(ks_timing, "Timer", FakeTimer)
    lines = []
    monkeypatch.setattr(bridge_compile_helper, "_answer_line", lambda obj: lines.append(obj))
    monkeypatch.setattr(sys, "stdin", io.StringIO("go\n"))
    problem = load("matmul.py")
    args = type("A", (), {"seed": 42, "sets": 3, "device": "cuda"})()
    out = bridge.cmd_time_compiled(problem, args)
    assert out == {"timing": {"median_ms": 2.0}}
    assert lines == [{"compiled": True}]
    want = [problem.inputs(43 + i, CPU)[0].sum().item() for i in range(2)]
    assert calls[0] == "compile" and calls[-1] == ("measure", 2, want)
