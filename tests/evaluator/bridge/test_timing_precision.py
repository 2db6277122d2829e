"""pytest for the precision a reference's baselines are timed under (issue 36:
reference --precision high|medium, rounding.timing_precision, the helper's
command line, the manifest's "timing_precision"), on CPU torch: the timing
itself needs a GPU, so timing.py is replaced by a fake that records the
settings it runs under."""
import pathlib
import subprocess
import sys
import types

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "evaluator" / "reference"))
import bridge  # noqa: E402
from ks_bridge import compile_helper as bridge_compile_helper  # noqa: E402
from ks_bridge import reference_sets as bridge_reference_sets  # noqa: E402
from ks_bridge import rounding as bridge_rounding  # noqa: E402
from ks_bridge.errors import BridgeError  # noqa: E402

FIXTURES = ROOT / "tests" / "evaluator" / "fixtures"


def settings():
    return (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32,
            torch.backends.cuda.matmul.allow_tf32)


@pytest.fixture
def pristine_settings():
    """PyTorch's defaults here (matmul highest, cuDNN TF32 on), whatever a test leaves behind."""
    saved = settings()
    torch.set_float32_matmul_precision("highest")
    torch.backends.cudnn.allow_tf32 = True
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]
    torch.backends.cuda.matmul.allow_tf32 = saved[2]


@pytest.mark.parametrize("level", ["high", "medium"])
def test_level_sets_matmul_precision_and_cudnn_tf32_then_restores(pristine_settings, level):
    torch.backends.cudnn.allow_tf32 = False  # restored to what it was, not to PyTorch's default
    before = settings()
    with bridge_rounding.timing_precision(level):
        assert torch.get_float32_matmul_precision() == level
        assert torch.backends.cudnn.allow_tf32 is True
        assert torch.backends.cuda.matmul.allow_tf32 is True
    assert settings() == before


def test_settings_restored_when_the_timing_raises(pristine_settings):
    before = settings()
    with pytest.raises(RuntimeError):
        with bridge_rounding.timing_precision("high"):
            raise RuntimeError("timing failed")
    assert settings() == before


def test_no_level_changes_nothing(pristine_settings):
    before = settings()
    with bridge_rounding.timing_precision(None):
        assert settings() == before
    assert settings() == before


def test_unknown_level_is_refused_before_anything_changes(pristine_settings):
    before = settings()
    with pytest.raises(BridgeError):
        with bridge_rounding.timing_precision("highest"):
            pass
    assert settings() == before


def test_reference_and_helper_take_the_level():
    p = bridge._parser()
    assert p.parse_args(["reference", "p.py", "--out", "d"]).precision is None
    assert p.parse_args(["reference", "p.py", "--then-files", "--precision", "high"]).precision == "high"
    assert p.parse_args(["time-compiled", "p.py", "--precision", "medium"]).precision == "medium"
    for bad in ("highest", "kernelbench", "tf32"):
        with pytest.raises(bridge._ArgumentError):
            p.parse_args(["reference", "p.py", "--precision", bad])


def test_bad_level_answers_bad_arguments(capfd):
    assert bridge.main(["reference", str(FIXTURES / "matmul.py"), "--precision", "fast"]) == bridge.EXIT_BAD_PROBLEM


@pytest.mark.parametrize("level", [None, "high"])
def test_compile_helper_is_told_the_level(monkeypatch, level):
    seen = []

    class FakePopen:
        def __init__(self, argv, **kwargs):
            seen.append(argv)

    monkeypatch.delenv("KS_NO_COMPILE_HELPER", raising=False)
    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    args = bridge._parser().parse_args(["reference", "p.py", "--then-files", "--time", "--device", "cuda"] +
                                       (["--precision", level] if level else []))
    assert bridge_compile_helper.CompileHelper.start(args) is not None
    (argv,) = seen
    assert argv[2:4] == ["time-compiled", "p.py"]
    if level:
        assert argv[argv.index("--precision") + 1] == level
    else:
        assert "--precision" not in argv


def _run_with_fake_gpu_timing(monkeypatch, level):
    """A reference of matmul.py made on the CPU, then timed as on a GPU with
    timing.py faked: (the settings time_model ran under, the manifest)."""
    seen = []

    def time_model(model, arg_sets, device=None, compile_model=True, phases=None):
        seen.append(settings())
        return {"median_ms": 1.0}, {"median_ms": 0.5}, []

    monkeypatch.setitem(sys.modules, "timing", types.SimpleNamespace(time_model=time_model))
    assert bridge_compile_helper._COMPILE_HELPER[0] is None  # no helper: compiled and timed "here"
    problem = bridge.Problem(str(FIXTURES / "matmul.py")).load()
    run = bridge_reference_sets._ReferenceRun(problem, None, 2, 42, True, None, level)
    run.build_model("cpu")
    for i in range(2):
        run.run_set(i)
    cpu = run.device
    run.device = types.SimpleNamespace(type="cuda")
    run.default_error = {}
    run.time()
    run.device = cpu
    return seen, run.manifest([])


def test_manifest_names_the_level_the_baselines_were_timed_under(monkeypatch, pristine_settings):
    seen, manifest = _run_with_fake_gpu_timing(monkeypatch, "high")
    assert seen[0][:2] == ("high", True)
    assert manifest["timing_precision"] == "high"
    assert manifest["timing"]["eager"] == {"median_ms": 1.0}
    # Restored: the reference's own runs after timing are PyTorch's (tf32_defaults) again.
    assert torch.get_float32_matmul_precision() == "highest"


def test_without_a_level_the_baselines_are_timed_at_the_defaults(monkeypatch, pristine_settings):
    seen, manifest = _run_with_fake_gpu_timing(monkeypatch, None)
    assert seen[0][0] == "highest"
    assert manifest["timing_precision"] == "default"


def test_untimed_reference_says_default(tmp_path):
    problem = bridge.Problem(str(FIXTURES / "matmul.py")).load()
    manifest = bridge_reference_sets.run_reference(problem, None, 2, 42, "cpu", True, timing_level="high")
    assert manifest["timing"]["eager"] is None
    assert manifest["timing_precision"] == "default"
