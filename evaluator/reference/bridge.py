#!/usr/bin/env python3
"""The reference bridge: trusted Python that turns a problem file into data.

A problem file is in the KernelBench format (DESIGN.md, contract 1):
`class Model(torch.nn.Module)`, `get_inputs()`, `get_init_inputs()`, and the
optional module-level names TOLERANCE, FLOPS and DESCRIPTION.

Subcommands (each prints exactly one JSON object on stdout; anything the
problem prints goes to stderr so it cannot corrupt that object):

  signature PROBLEM.py [--device D]
      the signature (names, dtypes, shapes) that SignatureFromJson in
      evaluator/signature.cc reads.
  reference PROBLEM.py --out DIR --sets K --seed S [--device D] [--time] [--precision high|medium]
      reference inputs, parameters and outputs as raw little-endian bytes, and
      DIR/manifest.json (written last, atomically); prints the manifest. A
      set's floating output holds the model's float64 result in the output's
      dtype (its "truth"; PyTorch's own output where float64 could not run),
      and "<output>@<level>" (level highest, high, medium) the float32
      per-block bounds of PyTorch's own error at that precision
      (ks_bridge/truth.py, judge.py).
  reference PROBLEM.py --resident --sets K --seed S --device cuda [--time]
      the same data kept on the GPU in this process, not written anywhere: the
      manifest's sets name each tensor's CUDA IPC handle, offset and size, for
      the evaluator to map (a multi-GB problem needs no disk and no copy
      through the host). After printing the manifest the bridge holds the
      tensors until its stdin is closed, then exits. With
      --resident-min-bytes N, a problem whose sets hold fewer bytes is not
      kept: the answer is {"resident": false, "signature": ...}.
      With --keep S --keep-socket PATH the bridge stays after its caller
      closes stdin: later commands lease the same reference at PATH, and it
      exits S seconds after the last lease ends (ks_bridge/keeper.py). The
      manifest's "kept" says where it is served, or why not; "pid" is ours.
  reference PROBLEM.py [--resident ...] --then-files --sets K --seed S [--device D]
      one process for a reference that goes to files: after shape inference
      the bridge prints {"resident": false, "signature": ...} (unless it
      keeps the problem on the GPU, as above), reads one line
      {"out": DIR, "sets": K, "time": bool} from stdin (the caller has sized
      and made room for the cache entry meanwhile), writes DIR as
      reference --out does and prints the manifest. EOF instead of the line
      ends it quietly.
      With --signature-from FILE (a cached manifest of this problem, made by
      the same bridge: the caller's cache key says so), its "signature" is
      used instead of shape inference and FLOP counting, which cost seconds
      of torch imports on every command; an unreadable FILE means shape
      inference as before.
      With --practice-sets P --practice-seed Q (any of the forms above), P
      more get_inputs() sets follow the K judging sets, drawn from seeds
      Q+1..Q+P and marked "practice" in the manifest: an agent's practice
      sets (search/agent.h), which the judge never uses. They are always
      kept; where the device is short, judging sets beyond two and the
      distribution-shifted sets make way.
      With --time and --device cuda, torch.compile's timing is done by a
      helper started at once (time-compiled, below). With --precision LEVEL
      (a precision contract, high or medium) eager and torch.compile are
      timed with torch.set_float32_matmul_precision(LEVEL) and cuDNN TF32 on,
      the manifest's "timing_precision" saying so ("default" otherwise).
  time-compiled PROBLEM.py --seed S --sets K --device cuda [--precision LEVEL]
      the helper of CompileHelper: compiles torch.compile(model) while the
      reference is computed, prints {"compiled": true}, waits for a line on
      stdin, then times the compiled model (timing.py) and prints the figures.
  check PROBLEM.py [--sets K] [--seed S] [--device D]
      {"warnings": [...]}: outputs that would let a wrong kernel pass.
  peaks [--index I] [--n N] [--runs R]
      measured dense-matmul TFLOP/s of CUDA device I per compute class
      (fp32, tf32, bf16, fp16; see peaks.py); needs a GPU.

A bad problem file prints {"error": {"kind", "message", "detail"}} and exits
with status 2. Runs on torch 1.13 (CPU) and torch 2.x (GPU).

This file is the command line only; the work is in the package ks_bridge/,
one module per concern (ks_bridge/__init__.py lists them).
"""

import argparse
import errno
import json
import os
import sys
import time

_STARTED = time.monotonic()  # before ks_bridge's imports: --verbose's setup phases start here
_SETUP_PHASES = []  # (name, seconds) before the reference's own phases, in order

from ks_bridge.compile_helper import CompileHelper, _COMPILE_HELPER, cmd_time_compiled
from ks_bridge.errors import (BridgeError, EXIT_BAD_PROBLEM, EXIT_INTERNAL, _ANSWER, _answer_line, _first_line,
                              _traceback_tail)
from ks_bridge.flops import FLOP_KEYS, count_flops
from ks_bridge.problem_file import Problem, resolve_device
from ks_bridge.reference_sets import run_reference, write_manifest
from ks_bridge.resident import _Resident, _fingerprint, _spec_bytes, fit_resident
from ks_bridge.rounding import TIMING_LEVELS
from ks_bridge.signature import _signature_on_meta, input_specs, make_signature, output_specs, parameter_specs

# What the tests (tests/evaluator/bridge) reach through this module.
from ks_bridge.checks import DEFAULT_TOLERANCE, _tolerance_for  # noqa: F401
from ks_bridge.flops import _flop_counter_class  # noqa: F401
from ks_bridge.rounding import MAX_ROUNDING_REL_NORM, ROUNDING_FACTOR, _float64_copy  # noqa: F401
from ks_bridge.truth import compute_truth, measure_rounding  # noqa: F401


def cmd_signature(problem, args):
    meta = _signature_on_meta(problem, args.seed)
    if meta is not None:
        model, inputs, result = meta
        outputs = problem._outputs(result)
        how = "meta"
    else:
        device = resolve_device(problem, args.device)
        model = problem.build_model(args.seed, device)
        inputs = problem.inputs(args.seed + 1, device)
        outputs = problem.forward(model, inputs)
        how = "forward on %s" % device.type
    sig = make_signature(problem, input_specs(problem, model, inputs), parameter_specs(problem, model),
                         output_specs(problem, outputs))
    sig.update(count_flops(problem, args.seed))
    # How the shapes were found, for `--verbose` and the tests; SignatureFromJson ignores it.
    sig["inferred_by"] = how
    return sig


def _files_request():
    """reference --then-files: the caller's one-line request on stdin after
    the signature: {"out": DIR, "sets": K, "time": bool, "transform_sets": T
    (room for T distribution-shifted sets; absent: none)}, or None when it
    closed stdin (it found what it needed elsewhere, or gave up)."""
    line = sys.stdin.readline()
    if not line.strip():
        return None
    try:
        req = json.loads(line)
        return str(req["out"]), int(req["sets"]), bool(req.get("time", False)), int(req.get("transform_sets", 0))
    except (ValueError, KeyError, TypeError) as e:
        raise BridgeError("bad_arguments", "bridge.py: bad request after the signature: %s: %r" % (e, line[:200]))


def _practice(args):
    """(P, Q): --practice-sets and --practice-seed, or None without practice sets."""
    if not args.practice_sets:
        return None
    if args.practice_sets < 0 or args.practice_seed is None:
        raise BridgeError("bad_arguments", "--practice-sets P needs P >= 0 and --practice-seed")
    return args.practice_sets, args.practice_seed


_RESIDENT = None  # reference --resident: what the evaluator maps, alive until stdin closes


def _cached_signature(path):
    """The signature of a cached manifest (--signature-from), or None when there
    is none to use: then shape inference runs, as without the flag."""
    if not path:
        return None
    try:
        with open(path) as f:
            sig = json.load(f).get("signature")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(sig, dict) or not all(isinstance(sig.get(k), list) for k in ("inputs", "outputs", "parameters")):
        return None
    return sig


def cmd_reference(problem, args):
    global _RESIDENT
    known_flops = None  # the cached signature's FLOP keys: not counted again
    if args.resident or args.then_files:
        if args.out:
            raise BridgeError("bad_arguments", "reference takes --out DIR, or --resident / --then-files, not both")
        sets, warning = args.sets, None
        if args.resident_min_bytes is not None or args.device_budget or args.then_files:
            # The caller has no signature yet: shape inference here, in the
            # process that has torch imported already, decides.
            t0 = time.monotonic()
            sig = _cached_signature(args.signature_from)
            if sig is None:
                sig = cmd_signature(problem, args)
                _SETUP_PHASES.append(("signature (shape inference, FLOP count)", time.monotonic() - t0))
            else:
                _SETUP_PHASES.append(("signature (from the cache)", time.monotonic() - t0))
                known_flops = {k: sig[k] for k in FLOP_KEYS if k in sig}
            total = _spec_bytes(sig["parameters"]) + args.sets * (_spec_bytes(sig["inputs"]) +
                                                                  _spec_bytes(sig["outputs"]))
            stays = args.resident and (args.resident_min_bytes is None or total >= args.resident_min_bytes)
            if not stays and not args.then_files:
                return {"resident": False, "signature": sig}
            if not stays:
                # Too small to keep on the GPU: the caller sizes the file
                # cache entry from the signature and asks this process, which
                # has torch imported already, to write it (one python start,
                # not two).
                _answer_line({"resident": False, "signature": sig})
                req = _files_request()
                if req is None:
                    return None
                out, sets, do_time, room = req
                manifest = run_reference(problem, out, sets, args.seed, args.device, do_time, transform_room=room,
                                         timing_level=args.precision, practice=_practice(args), flops=known_flops)
                write_manifest(out, manifest)
                return manifest
            practice = args.practice_sets
            plain, why = fit_resident(sig, args.sets + practice, args.device_budget)
            if plain < min(args.sets, 2) + practice:
                raise BridgeError("out_of_memory", "%s: %s" % (problem.path, why))
            # The distribution-shifted sets share the room: where it is short,
            # judging sets beyond two make way for them (PrepareReference's
            # rule). Practice sets are kept whole: they were asked for.
            total, why_all = fit_resident(sig, args.sets + practice + args.transform_sets, args.device_budget,
                                          args.transform_sets)
            sets = min(args.sets, max(min(args.sets, 2), total - practice - args.transform_sets))
            room = max(0, min(args.transform_sets, total - practice - sets))
            if sets < args.sets:
                warning = "using %d of the %d input sets asked for%s: %s" % (
                    sets, args.sets, " (and %d distribution-shifted set(s) in the room of the others)" % room
                    if sets + practice < plain else "", why or why_all)
        else:
            room = args.transform_sets
        _RESIDENT = _Resident()
        manifest = run_reference(problem, None, sets, args.seed, args.device, args.time, resident=_RESIDENT,
                                 transform_room=room, timing_level=args.precision, practice=_practice(args),
                                 flops=known_flops)
        manifest["resident"] = True
        manifest["pci_bus_id"] = _RESIDENT.pci_bus_id()
        if args.keep > 0:
            manifest["pid"] = os.getpid()
            manifest["kept"] = _start_keeping(problem, args)
        if warning:
            manifest["warnings"].insert(0, warning)
        return manifest
    if not args.out:
        raise BridgeError("bad_arguments", "reference needs --out DIR (or --resident / --then-files)")
    manifest = run_reference(problem, args.out, args.sets, args.seed, args.device, args.time,
                             transform_room=args.transform_sets, timing_level=args.precision,
                             practice=_practice(args))
    write_manifest(args.out, manifest)
    return manifest


_KEEPER = [None]  # reference --resident --keep: the kept reference's serving loop (ks_bridge/keeper.py)


def _start_keeping(problem, args):
    """--keep S --keep-socket PATH: after this command the reference stays on
    the GPU for later commands (ks_bridge/keeper.py). Returns the manifest's
    "kept" entry: where it is served, or why it is not (another bridge
    serves this key)."""
    import torch
    from ks_bridge.keeper import Keeper, claim
    if not args.keep_socket:
        raise BridgeError("bad_arguments", "--keep needs --keep-socket PATH")
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the float64 truth's and the checks' temporaries: not kept
    listener, why = claim(args.keep_socket)
    if listener is None:
        return {"declined": why}
    tensors = _RESIDENT.tensors

    def fingerprint():
        prints = [_fingerprint(t) for t in tensors]
        torch.cuda.empty_cache()
        return prints

    keeper = Keeper(listener, args.keep_socket, args.keep, fingerprint, lease_fd=0,
                    gpu_bytes=lambda: int(torch.cuda.memory_reserved()))
    _KEEPER[0] = keeper
    return {"socket": args.keep_socket, "keep_s": args.keep, "pid": os.getpid(), "gpu_bytes": keeper.gpu_bytes(),
            "problem": problem.path}


def hold_resident():
    """After the manifest: keep the tensors until the caller closes our stdin
    (it has copied or mapped them; it is also how the caller ends us)."""
    if _RESIDENT is None:
        return
    try:
        while sys.stdin.buffer.read(4096):
            pass
    except (OSError, ValueError):
        pass


def cmd_check(problem, args):
    manifest = run_reference(problem, None, max(args.sets, 2), args.seed, args.device, False)
    return {"warnings": manifest["warnings"], "notes": manifest["notes"]}


def cmd_peaks(args):
    import torch
    import peaks
    if not torch.cuda.is_available():
        raise BridgeError("device_error", "measuring peaks needs a GPU, but torch %s sees no CUDA device"
                          % torch.__version__)
    count = torch.cuda.device_count()
    if not 0 <= args.index < count:
        raise BridgeError("device_error", "there is no CUDA device %d (torch sees %d)" % (args.index, count))
    if args.n < 256 or args.runs < 1:
        raise BridgeError("bad_arguments", "peaks needs --n >= 256 and --runs >= 1")
    return peaks.matmul_peaks(torch, args.index, args.n, args.runs)


class _ArgumentError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise _ArgumentError(message)


def _parser():
    p = _Parser(prog="bridge.py", description="kernelsearch reference bridge")
    sub = p.add_subparsers(dest="command")
    for name in ("signature", "reference", "check", "time-compiled"):
        s = sub.add_parser(name)
        s.add_argument("problem")
        s.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
        s.add_argument("--seed", type=int, default=42)
        s.add_argument("--sets", type=int, default=3 if name == "reference" else 2)
        if name == "reference":
            s.add_argument("--out")
            s.add_argument("--time", action="store_true")
            s.add_argument("--resident", action="store_true")
            s.add_argument("--then-files", action="store_true")
            s.add_argument("--resident-min-bytes", type=int, default=None)
            s.add_argument("--device-budget", type=int, default=0)
            s.add_argument("--signature-from", default=None)
            # --resident: stay this many seconds after the last lease ends, served at --keep-socket (keeper.py).
            s.add_argument("--keep", type=float, default=0)
            s.add_argument("--keep-socket", default=None)
            # Room for this many distribution-shifted sets (transforms.py); 0: none.
            s.add_argument("--transform-sets", type=int, default=4)
            s.add_argument("--practice-sets", type=int, default=0)
            s.add_argument("--practice-seed", type=int, default=None)
        if name in ("reference", "time-compiled"):
            # Eager and torch.compile timed under a precision contract's level
            # (torch.set_float32_matmul_precision(level), cuDNN TF32 on); absent: PyTorch's defaults.
            s.add_argument("--precision", default=None, choices=list(TIMING_LEVELS))
        if name in ("signature", "reference"):
            # The problem's input list I of get_inputs_variants() instead of get_inputs() (other shapes).
            s.add_argument("--variant", type=int, default=None)
    s = sub.add_parser("peaks")
    s.add_argument("--index", type=int, default=0)
    s.add_argument("--n", type=int, default=8192)
    s.add_argument("--runs", type=int, default=10)
    return p


def main(argv):
    # The JSON answer goes to the original stdout; everything else (the problem's
    # prints, torch's warnings, C extensions writing to fd 1) goes to stderr.
    answer = os.fdopen(os.dup(1), "w")
    _ANSWER[0] = answer
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # timing.py

    def emit(obj, code):
        answer.write(json.dumps(obj, allow_nan=False) + "\n")
        answer.flush()
        return code

    try:
        args = _parser().parse_args(argv)
        if args.command is None:
            raise _ArgumentError("a subcommand is required: signature, reference, check or peaks")
    except _ArgumentError as e:
        return emit({"error": {"kind": "bad_arguments", "message": "bridge.py: %s" % e, "detail": ""}},
                    EXIT_BAD_PROBLEM)
    if args.command == "reference" and args.time and args.device == "cuda":
        # Before torch loads here: the helper's own import runs alongside.
        _COMPILE_HELPER[0] = CompileHelper.start(args)
    try:
        import torch  # noqa: F401 - fail here, clearly, when torch is missing
    except ImportError as e:
        return emit({"error": {"kind": "no_torch", "message": "%s cannot import torch: %s" % (sys.executable, e),
                               "detail": ""}}, EXIT_INTERNAL)
    _SETUP_PHASES.append(("imports (torch, ks_bridge)", time.monotonic() - _STARTED))
    what = "peaks" if args.command == "peaks" else args.problem
    try:
        if args.command == "peaks":
            return emit(cmd_peaks(args), 0)
        t0 = time.monotonic()
        problem = Problem(args.problem).load()
        problem.variant = getattr(args, "variant", None)
        _SETUP_PHASES.append(("the problem file's import", time.monotonic() - t0))
        result = {"signature": cmd_signature, "reference": cmd_reference, "check": cmd_check,
                  "time-compiled": cmd_time_compiled}[args.command](
            problem, args)
        if result is None:  # the caller closed stdin instead of asking for more
            return 0
        if isinstance(result, dict) and isinstance(result.get("phases"), list):
            result["phases"] = [[k, round(v, 3)] for k, v in _SETUP_PHASES] + result["phases"]
        if _KEEPER[0] is not None:
            _KEEPER[0].answer_with(dict(result, problem=args.problem))
        code = emit(result, 0)
        if _KEEPER[0] is not None:
            _KEEPER[0].serve()
        else:
            hold_resident()
        return code
    except BridgeError as e:
        return emit({"error": {"kind": e.kind, "message": e.message, "detail": e.detail}}, EXIT_BAD_PROBLEM)
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            return emit({"error": {"kind": "internal", "message": "%s: reference bridge failed: %s: %s"
                                   % (what, type(e).__name__, _first_line(e)), "detail": _traceback_tail(e)}},
                        EXIT_INTERNAL)
        return emit({"error": {"kind": "disk_full", "message": "%s: the disk filled while writing the reference (%s); "
                               "lower the cache cap (--cache-cap) or free space" % (what, _first_line(e)),
                               "detail": _traceback_tail(e)}}, EXIT_BAD_PROBLEM)
    except MemoryError as e:
        return emit({"error": {"kind": "out_of_memory", "message": "%s: out of host memory" % what,
                               "detail": _traceback_tail(e)}}, EXIT_BAD_PROBLEM)
    except Exception as e:  # noqa: BLE001 - a bug here must still answer in JSON
        return emit({"error": {"kind": "internal", "message": "%s: reference bridge failed: %s: %s"
                               % (what, type(e).__name__, _first_line(e)), "detail": _traceback_tail(e)}},
                    EXIT_INTERNAL)


if __name__ == "__main__":
    status = main(sys.argv[1:])
    # The answer is out and the files are written: the interpreter's teardown
    # (CUDA, torch, inductor's compile workers) would only keep the caller waiting.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
