"""pytest for export/ (the Python files `kernelsearch export` writes).

EXPORT_DIR is the source tree's export/ (or $KS_EXPORT_DIR); render() fills
kernel_module.py's placeholders by the two rules of search/export.cc's
RenderModuleTemplate, so that the template can be imported and tested here.
"""
import importlib.util
import json
import os
import pathlib
import re
import shutil
import sys

EXPORT_DIR = pathlib.Path(os.environ.get("KS_EXPORT_DIR") or pathlib.Path(__file__).resolve().parents[2] / "export")
sys.path.insert(0, str(EXPORT_DIR))


def render(template, values):
    """"@@NAME@@" in quotes becomes a Python string literal of the value; a bare
    @@NAME@@ (in the docstring) the value as plain text."""
    def fill(m):
        value = values[m.group(2)]
        return json.dumps(value) if m.group(1) else value.replace('"', " ").replace("\\", " ").replace("\n", " ")
    return re.sub(r'("?)@@([A-Z_]+)@@\1', fill, template)


def build_module(directory, problem, plan, signature, kernels, source, name="kernel_module", candidate_id="42"):
    """An export in `directory` (problem.py, ks_launch_plan.py and the rendered
    kernel_module.py for `plan`, `signature`, `kernels` and `source`), imported as
    `name`: what `kernelsearch export` writes, without a store or NVRTC."""
    directory = pathlib.Path(directory)
    shutil.copy(EXPORT_DIR / "ks_launch_plan.py", directory / "ks_launch_plan.py")
    (directory / "problem.py").write_text(problem)
    import ks_launch_plan as lp
    resolved = lp.resolve_plan(plan, kernels, lp.env_from_signature(signature))
    values = {"ID": candidate_id, "PROBLEM": 'ln "small"', "SPEEDUP": "correct, 1.50x over PyTorch eager",
              "SOURCE": source,
              "PLAN": json.dumps(plan), "SIGNATURE": json.dumps(signature),
              "KERNELS": json.dumps(kernels), "RESOLVED": json.dumps(resolved),
              "NVRTC_OPTIONS": json.dumps(["--std=c++17"]), "PRELUDE_NAME": "ks_prelude.h",
              "PRELUDE": "#define KS 1\n", "CUDA_HOME": "/nonexistent/cuda", "TARGET": "sm_90a",
              "ROBUSTNESS": json.dumps({"specialised": False, "broken_by": "", "checks": []}),
              "JUDGE": json.dumps({"contract": "highest", "factor": 16.0, "highest_factor": 16.0, "bound_block": 256,
                                   "kernelbench_atol": 0.01, "kernelbench_rtol": 0.01})}
    (directory / "kernel_module.py").write_text(render((EXPORT_DIR / "kernel_module.py").read_text(), values))
    spec = importlib.util.spec_from_file_location(name, directory / "kernel_module.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
