"""torch.compile timed by a helper process (bridge.py time-compiled) that
compiles while the reference is computed; CompileHelper drives it."""

import json
import os
import sys

from ks_bridge.errors import _answer_line, _first_line, _human
from ks_bridge.problem_file import resolve_device
from ks_bridge.resident import _spec_bytes, fit_resident
from ks_bridge.rounding import timing_precision
from ks_bridge.signature import _signature_on_meta, input_specs, output_specs, parameter_specs


# The command line the helper runs (bridge.py time-compiled), beside this package.
_BRIDGE_PY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bridge.py")

_COMPILE_HELPER = [None]  # reference --time on a GPU: the CompileHelper, started by main before torch loads


class CompileHelper:
    """torch.compile timed by a helper process that compiles while this one
    computes the reference.

    torch.compile's first call costs 10-20 s (dynamo, inductor, Triton), on
    the CPU mostly. The helper (bridge.py time-compiled) starts with this
    process, imports torch alongside it, builds the same model from the same
    seed on the same device and the timing input sets from the same seeds,
    and compiles torch.compile(model) with one call, while this process
    computes and writes the reference. Then the timings are taken one process
    at a time, so that nothing else runs on the GPU while either measures:
    this process waits for the helper's "compiled", times eager, and waits
    while the helper times the compiled model by timing.py's method (the same
    Timer.measure, warm-up included; compilation was never inside a measured
    call). Where the helper skips (too little GPU memory beside the
    reference, no torch.compile) or fails, this process compiles and times as
    it would without it. The helper dies with this process. Under a
    precision contract's level (reference --precision high/medium) it
    compiles and times with that level's settings (rounding.timing_precision),
    as this process times eager.
    """

    def __init__(self, proc):
        self._proc = proc

    @staticmethod
    def start(args):
        import subprocess
        if os.environ.get("KS_NO_COMPILE_HELPER"):
            return None

        def die_with_parent():
            import ctypes
            try:
                ctypes.CDLL(None).prctl(1, 9)  # PR_SET_PDEATHSIG, SIGKILL
            except Exception:  # noqa: BLE001
                pass

        try:
            level = ["--precision", args.precision] if getattr(args, "precision", None) else []
            proc = subprocess.Popen([sys.executable, _BRIDGE_PY, "time-compiled", args.problem,
                                     "--seed", str(args.seed), "--sets", str(args.sets), "--device", "cuda"] + level,
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, preexec_fn=die_with_parent)
        except OSError:
            return None
        return CompileHelper(proc)

    def _read(self):
        line = self._proc.stdout.readline()
        try:
            return json.loads(line) if line.strip() else {"skip": "the helper ended without an answer"}
        except ValueError:
            return {"skip": "the helper answered %r" % line[:200]}

    def _give_up(self, why):
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        return "torch.compile was timed in this process, not in the helper: %s" % why

    def wait_compiled(self):
        """(ready, note): waits until the helper has compiled (or given up)."""
        msg = self._read()
        if msg.get("compiled") is True:
            return True, None
        return False, self._give_up(msg.get("skip") or msg.get("error", {}).get("message") or str(msg)[:300])

    def time_compiled(self):
        """(stats, note): lets the helper time, waits for its figures."""
        try:
            self._proc.stdin.write(b"go\n")
            self._proc.stdin.flush()
        except OSError as e:
            return None, self._give_up("it went away (%s)" % e)
        msg = self._read()
        self._proc.wait()
        if isinstance(msg.get("timing"), dict):
            return msg["timing"], None
        return None, self._give_up(msg.get("skip") or msg.get("error", {}).get("message") or str(msg)[:300])


def cmd_time_compiled(problem, args):
    """The helper of CompileHelper (see there): {"skip": why} when it does
    not fit beside the reference or torch cannot compile; else
    {"compiled": true} as an intermediate line, then, after a line on stdin,
    {"timing": timing.py's figures for torch.compile(model)}, compiled and
    timed under --precision's level when one is given."""
    import torch
    import timing as ks_timing
    if not hasattr(torch, "compile"):
        return {"skip": "torch %s has no torch.compile" % torch.__version__}
    meta = _signature_on_meta(problem, args.seed)
    if meta is None:
        return {"skip": "the problem's sizes are not known without running it"}
    device = resolve_device(problem, args.device)
    model, inputs, result = meta
    sig = {"inputs": input_specs(problem, model, inputs), "parameters": parameter_specs(problem, model),
           "outputs": output_specs(problem, problem._outputs(result))}
    del model, inputs, result
    par, inp, out = _spec_bytes(sig["parameters"]), _spec_bytes(sig["inputs"]), _spec_bytes(sig["outputs"])
    free, _ = torch.cuda.mem_get_info(device)
    # What the reference process will hold (fit_resident's rule, whichever
    # path it takes) comes first; the helper takes what is left, with margin.
    # (The judging sets and the distribution-shifted ones, transforms.py.)
    main_sets, _ = fit_resident(sig, args.sets + 4, int(0.9 * free))
    spare = 0.9 * free - (4 * par + 2 * out + max(main_sets, 1) * (3 * inp + out))
    k = min(2, args.sets)
    while k > 1 and par + k * inp + 2 * out > 0.5 * spare:
        k -= 1
    if par + k * inp + 2 * out > 0.5 * spare:
        return {"skip": "its copy of the model and an input set (%s) would not fit beside the reference"
                % _human(par + k * inp + 2 * out)}
    model = problem.build_model(args.seed, device)
    sets = [problem.inputs(args.seed + 1 + i, device) for i in range(k)]
    with timing_precision(getattr(args, "precision", None)):
        try:
            compiled = torch.compile(model)
            with torch.no_grad():
                compiled(*sets[0])
            torch.cuda.synchronize(device)
        except Exception as e:  # noqa: BLE001 - the reference process compiles again and reports it
            return {"skip": "torch.compile failed here: %s: %s" % (type(e).__name__, _first_line(e, 200))}
        _answer_line({"compiled": True})
        if not sys.stdin.readline().strip():
            return {"skip": "cancelled"}
        with torch.no_grad():
            stats = ks_timing.Timer(device).measure(compiled, sets)
    return {"timing": stats}
