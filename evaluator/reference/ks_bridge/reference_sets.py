"""Reference data: the input sets a problem's reference is made of (files or
resident tensors), the checks on them, the distribution-shifted sets
(transforms.py), the eager and torch.compile timing, and the manifest.

Each set's reference output is its float64 truth (truth.py) where float64
runs, with the per-block bounds of PyTorch's own error beside it under
"<output>@<level>" (files, or resident tensors); the checks on a reference
(degenerate outputs, determinism) look at PyTorch's own output."""

import hashlib
import json
import os

from ks_bridge.checks import WarningLog, _tolerance_for, check_deterministic, degenerate_reasons, near_degenerate_notes, output_stats
from ks_bridge.compile_helper import _COMPILE_HELPER
from ks_bridge.errors import BridgeError
from ks_bridge.flops import count_flops
from ks_bridge.problem_file import _restore_state, _seed_everything, _state_snapshot, resolve_device
from ks_bridge.resident import _fingerprint, _keep_inputs_pristine, _same_data, _with_scalars
from ks_bridge.rounding import measure_default_precision, timing_precision
from ks_bridge.signature import _dtype_name, input_specs, make_signature, output_specs, parameter_specs
from ks_bridge.truth import compute_truth, ill_conditioned_note, rounding_notes


def _host_array(t):
    """A contiguous numpy array of t's bytes (bf16 viewed as int16: numpy has no bf16)."""
    import torch
    t = t.detach()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return t.contiguous().cpu().numpy()


def store_tensor(t, path):
    """Writes t to path (when given) and returns the SHA-1 of its bytes."""
    arr = _host_array(t)
    if path is not None:
        arr.tofile(path)
    digest = hashlib.sha1(arr.reshape(-1).view("uint8")).hexdigest() if arr.size else hashlib.sha1().hexdigest()
    del arr
    return digest


def _store_named(named, set_dir, index, files):
    """Writes a set's (name, tensor) pairs to set_dir and names them in files;
    a tensor named twice (a precision level's bounds that are highest's) is
    written once, both names pointing to its file."""
    written = {}
    for name, t in named:
        if id(t) not in written:
            written[id(t)] = "set%d/%s.bin" % (index, name)
            store_tensor(t, os.path.join(set_dir, name + ".bin"))
        files[name] = written[id(t)]


def _export_named(resident, named):
    """{name: CUDA IPC entry} of a set's (name, tensor) pairs, a tensor named twice exported once."""
    exported, out = {}, {}
    for name, t in named:
        if id(t) not in exported:
            exported[id(t)] = resident.export(t)
        out[name] = exported[id(t)]
    return out


def _copies(inputs):
    """forward's arguments with every tensor copied."""
    import torch
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in inputs]


def _fits_for_timing(kept_bytes, new_bytes, device):
    """Whether another input set may stay on the device for timing (the first always does)."""
    import torch
    if kept_bytes == 0:
        return True
    try:
        free, _ = torch.cuda.mem_get_info(device)
    except Exception:  # noqa: BLE001 - old torch: keep one set only
        return False
    return kept_bytes + new_bytes <= 0.3 * free


def run_reference(problem, out_dir, sets, seed, device_name, do_time, resident=None, transform_room=None,
                  timing_level=None, practice=None, flops=None):
    """Builds the model, runs K input sets, writes them when out_dir is given,
    or keeps them on the GPU when `resident` (a _Resident) is given; then up
    to `transform_room` distribution-shifted sets (transforms.py,
    add_transformed_sets), after the K sets, each marked with its transform.

    Returns the manifest dict (without "files" when out_dir is None; with "ipc"
    per set when resident). torch.compile is timed by the CompileHelper
    when one runs (reference --time), else here; both baselines under
    `timing_level` ("high", "medium": rounding.timing_precision; None:
    PyTorch's defaults), which the manifest names ("timing_precision").
    `practice` = (P, Q): P more get_inputs() sets after the K, from seeds
    Q+1..Q+P, marked "practice" (an agent's practice sets; never judged);
    they take part in nothing a judging set decides (the checks of set 0,
    the timing, the shifted sets' origin).
    `flops`: the FLOP keys of a cached signature of this problem (the
    manifest's, instead of counting again), or None.
    """
    import torch  # noqa: F401 - as before the split: torch first, then the arguments
    if sets < 1:
        raise BridgeError("bad_arguments", "--sets must be at least 1")
    run = _ReferenceRun(problem, out_dir, sets, seed, do_time, resident, timing_level, practice)
    run.known_flops = flops
    run.build_model(device_name)
    for i in range(run.sets):
        run.run_set(i)
    run.check_sets_differ()
    # What makes the reference unable to judge (the GPU side of a search stops on
    # these), apart from the timing warnings that follow.
    degenerate = run.warnings.messages(run.sets)
    run.add_shifted_sets(transform_room)
    run.time()
    run.export_resident()
    return run.manifest(degenerate)


class _ReferenceRun:
    """One reference in the making: run_reference's phases, in order, and what
    they share (the model, the signature found so far, the sets, warnings)."""

    def __init__(self, problem, out_dir, sets, seed, do_time, resident, timing_level=None, practice=None):
        import time
        self.problem, self.out_dir, self.seed = problem, out_dir, seed
        # The judging sets, then the practice ones: self.sets counts both
        # (every per-set step runs on each), set_seed(i) tells them apart.
        self.judging = sets
        self.practice_seed = practice[1] if practice else None
        self.sets = sets + (practice[0] if practice else 0)
        self.do_time, self.resident = do_time, resident
        self.timing_level = timing_level
        self.timing_precision = "default"  # what the baselines were timed under, once they are
        self.phases = {}
        self._clock = time.monotonic()
        self.files_params, self.ipc_params = {}, {}
        self.warnings, self.notes = WarningLog(), WarningLog()
        self.sig_inputs = self.sig_outputs = None
        self.scalars = {}
        self.manifest_sets = []
        self.input_hashes, self.output_hashes = [], []
        self.input_prints = []  # resident: fingerprints of each set's tensor inputs before forward
        self.bounds_kept = []  # resident: each set's [(output@level, bounds tensor)]
        self.timing_sets, self.kept_bytes = [], 0
        self.base_nonfinite = {}  # output name -> NaN/Inf elements in set 0's reference
        self.transform_info, self.t_kept = [], []
        self.timing = {"eager": None, "compiled": None}
        self.known_flops = None  # a cached signature's FLOP keys (run_reference's `flops`)

    def phase(self, name):
        """Adds the wall time since the previous mark to `name`: --verbose shows what dominates."""
        import time
        now = time.monotonic()
        self.phases[name] = self.phases.get(name, 0.0) + now - self._clock
        self._clock = now

    def build_model(self, device_name):
        """The device, the model in full fp32 and its state before any forward,
        given to the candidate and restored per set (files, or resident tensors)."""
        import torch
        problem = self.problem
        self.device = device = resolve_device(problem, device_name)
        # Reference outputs in full fp32: cuDNN convolutions default to TF32 on
        # Ampere and later, whose 10-bit mantissa would make an exact fp32 kernel
        # look wrong. PyTorch's defaults come back for the eager and torch.compile
        # timing, so that the speed baseline is what users run.
        self.tf32_defaults = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32)
        torch.backends.cudnn.allow_tf32 = False
        torch.backends.cuda.matmul.allow_tf32 = False
        self.model = model = problem.build_model(self.seed, device)
        self.params = parameter_specs(problem, model)
        self.snapshot = _state_snapshot(model)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.phase("model build")
        if self.resident is not None:
            if device.type != "cuda":
                raise BridgeError("bad_arguments", "--resident keeps the reference on a GPU: it needs --device cuda")
            for k, v in self.snapshot.items():
                self.ipc_params[k] = self.resident.export(v)
        if self.out_dir is not None:
            os.makedirs(os.path.join(self.out_dir, "params"), exist_ok=True)
            # Written before any forward: a forward that updates buffers (BatchNorm in
            # training mode) must not change what the candidate is given.
            for k, v in model.state_dict().items():
                rel = "params/%s.bin" % k
                store_tensor(v, os.path.join(self.out_dir, rel))
                self.files_params[k] = rel

    def set_seed(self, i):
        """Set i's seed: judging sets from seed+1, practice sets from practice_seed+1."""
        if i < self.judging:
            return self.seed + 1 + i
        return self.practice_seed + 1 + (i - self.judging)

    def run_set(self, i):
        """Input set i: its inputs kept (written, or fingerprinted) before
        forward can change them, forward, set 0's checks, its outputs checked
        for degeneracy and kept."""
        import torch
        problem, device = self.problem, self.device
        set_seed = self.set_seed(i)
        self.phase("writing files")  # the parameters, before the first set
        inputs = problem.inputs(set_seed, device)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        self.phase("input generation")
        specs = input_specs(problem, self.model, inputs)
        if self.sig_inputs is None:
            self.sig_inputs = specs
            self.scalars = {s["name"]: s["value"] for s in specs if s["kind"] == "scalar"}
        elif specs != self.sig_inputs:
            raise problem.fail("inputs_vary", "get_inputs() returns different names, dtypes, shapes or scalar "
                               "values for seeds %d and %d; only tensor values may change" % (self.seed + 1, set_seed))
        set_dir = None
        if self.out_dir is not None:
            set_dir = os.path.join(self.out_dir, "set%d" % i)
            os.makedirs(set_dir, exist_ok=True)
        files = dict(self.files_params)
        self._keep_inputs(i, specs, inputs, set_dir, files)
        # The float64 truth and the lower precision levels run on these inputs
        # again: copies made before forward (which may change them in place)
        # cost less than get_inputs() once more. A resident (multi-GB) set
        # makes them again instead.
        pristine = _copies(inputs) if self.resident is None else None
        self.phase("writing files")

        _restore_state(self.model, self.snapshot)
        _seed_everything(set_seed)  # randomness inside forward, if any, is seeded per set too
        if i == 0 and device.type == "cuda":
            allocated = torch.cuda.memory_allocated(device)
            torch.cuda.reset_peak_memory_stats(device)
        outputs = problem.forward(self.model, inputs)
        self.phase("forward")
        if i == 0:
            peak_forward = torch.cuda.max_memory_allocated(device) - allocated if device.type == "cuda" else 0
            truth = self._check_first_set(set_seed, inputs, outputs, peak_forward, pristine)
        else:
            truth = self._truth(i, set_seed, outputs, inputs, pristine)
        del pristine
        self._keep_outputs(i, set_seed, outputs, truth, set_dir, files)
        del outputs
        entry = dict({"seed": set_seed, "files": files}, **truth.manifest_fields())
        if i >= self.judging:
            entry["practice"] = True
        self.manifest_sets.append(entry)
        truth.release()
        if self.resident is not None:
            _keep_inputs_pristine(problem, specs, self.input_hashes, self.input_prints, i, set_seed, device)
            self.phase("input fingerprints")
            self.timing_sets.append(self.input_hashes[i] if len(self.timing_sets) < 2 and i < self.judging else None)
            del inputs
            return
        if self.do_time and device.type == "cuda" and i < self.judging:
            nbytes = sum(v.numel() * v.element_size() for v in inputs if isinstance(v, torch.Tensor))
            if _fits_for_timing(self.kept_bytes, nbytes, device):
                self.timing_sets.append(inputs)
                self.kept_bytes += nbytes
        del inputs

    def _keep_inputs(self, i, specs, inputs, set_dir, files):
        """Set i's tensor inputs, before forward runs (it may change them in
        place): written with their digests, or kept and fingerprinted."""
        hashes, prints = [], []
        for spec, v in zip(specs, inputs):
            if spec["kind"] != "tensor":
                continue
            if self.resident is not None:
                v = v.contiguous()
                hashes.append(v)
                prints.append(_fingerprint(v))
                continue
            path = os.path.join(set_dir, spec["name"] + ".bin") if set_dir else None
            hashes.append(store_tensor(v, path))
            if path:
                files[spec["name"]] = "set%d/%s.bin" % (i, spec["name"])
        self.input_hashes.append(hashes)
        self.input_prints.append(prints)

    def _check_first_set(self, set_seed, inputs, outputs, peak_forward, pristine):
        """Input set 0 only: determinism, its truth, whose float32 outputs give
        PyTorch's float32 rounding (Signature::reference_error), and the
        distance of PyTorch's default precision (TF32). Returns the truth."""
        problem, model, device = self.problem, self.model, self.device
        self.peak_forward = peak_forward
        self.forward_s = check_deterministic(problem, model, self.snapshot, set_seed, device, outputs)
        self.phase("determinism check")
        truth = self._truth(0, set_seed, outputs, inputs, pristine)
        self.rounding = truth.rounding({name: _dtype_name(t) for name, t in outputs})
        for note in rounding_notes(self.rounding):
            self.notes.add_plain(note)
        self.default_error, note = measure_default_precision(problem, model, self.snapshot, set_seed, device,
                                                             outputs, self.tf32_defaults)
        if note:
            self.notes.add_plain(note)
        self.phase("PyTorch's default precision (TF32) check")
        return truth

    def _truth(self, i, set_seed, outputs, inputs, pristine):
        """Input set i's truth (truth.compute_truth) from the pre-forward state,
        on copies of `pristine` (None: get_inputs() again); why float64 could
        not make it is a note (once, naming the sets)."""
        model, snapshot = self.model, self.snapshot
        truth = compute_truth(self.problem, model, set_seed, self.device, outputs, inputs, self.forward_s,
                              self.peak_forward, prepare=lambda: _restore_state(model, snapshot),
                              make_inputs=None if pristine is None else lambda: _copies(pristine))
        _restore_state(model, snapshot)
        if truth.note:
            self.notes.add(("truth", truth.note.split(" (")[0]), truth.note, i)
        self.phase("float64 truth")
        return truth

    def _keep_outputs(self, i, set_seed, outputs, truth, set_dir, files):
        """Set i's outputs: the same specs as set 0's, PyTorch's checked for
        degeneracy; their truth (or PyTorch's, where float64 made none) and
        the bounds written with their digests, or kept."""
        problem = self.problem
        ospecs = output_specs(problem, outputs)
        if self.sig_outputs is None:
            self.sig_outputs = ospecs
        elif ospecs != self.sig_outputs:
            raise problem.fail("inputs_vary", "forward() returns different output shapes or dtypes for seeds "
                               "%d and %d" % (self.seed + 1, set_seed))
        ohashes, bounds = [], []
        for (name, t), spec in zip(outputs, ospecs):
            atol, rtol = _tolerance_for(problem, spec["dtype"], self.rounding.get(name))
            st = output_stats(t, atol, rtol)
            if i == 0:
                self.base_nonfinite[name] = st["nan"] + st["inf"]
            for key, msg in degenerate_reasons(name, st, atol, rtol):
                self.warnings.add((name, key), msg, i)
            for key, msg in near_degenerate_notes(name, st):
                self.notes.add((name, key), msg, i)
            ref = truth.reference(name, t)
            bounds += truth.bound_tensors(name)
            if self.resident is not None:
                ohashes.append(ref.detach().contiguous())
                continue
            path = os.path.join(set_dir, name + ".bin") if set_dir else None
            ohashes.append(store_tensor(ref, path))
            if path:
                files[name] = "set%d/%s.bin" % (i, name)
        if self.resident is not None:
            self.bounds_kept.append(bounds)
        elif set_dir:
            _store_named(bounds, set_dir, i, files)
        self.output_hashes.append(ohashes)
        self.phase("writing files")  # with the degenerate-output statistics

    def check_sets_differ(self):
        """Input sets that are all the same, or an output that is the same for
        every set although the inputs differ, cannot tell kernels apart."""
        sets, seed, input_hashes, output_hashes = self.sets, self.seed, self.input_hashes, self.output_hashes
        if sets <= 1:
            return
        if all(len(h) == len(input_hashes[0]) and all(_same_data(a, b) for a, b in zip(h, input_hashes[0]))
               for h in input_hashes[1:]):
            if input_hashes[0]:
                self.warnings.add_plain("get_inputs() returns the same tensors for seeds %d..%d: the input sets "
                                        "do not differ (does it draw from torch's random generator?)"
                                        % (seed + 1, seed + sets))
        else:
            for j, spec in enumerate(self.sig_outputs):
                if all(_same_data(h[j], output_hashes[0][j]) for h in output_hashes[1:]):
                    self.warnings.add_plain("output '%s' is identical for all %d input sets although the inputs "
                                            "differ: it does not depend on the inputs" % (spec["name"], sets))

    def add_shifted_sets(self, transform_room):
        self.transform_info, self.t_kept = add_transformed_sets(
            self.problem, self.model, self.snapshot, self.sig_inputs, self.sig_outputs, self.seed, self.device,
            self.out_dir, self.resident, self.sets, transform_room, self.base_nonfinite, self.manifest_sets,
            self.files_params, self.notes, self.forward_s, self.peak_forward)
        self.phase("distribution-shifted input sets")

    def time(self):
        """Eager and torch.compile timing at PyTorch's default precision, or
        under the precision contract's level (timing_level: high or medium, the
        helper told the same by bridge.py), and eager in fp32 too where the
        defaults differ, on a GPU when asked."""
        import time
        import torch
        if self.do_time and self.device.type == "cuda":
            import timing as ks_timing
            device, model, phases = self.device, self.model, self.phases
            torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self.tf32_defaults
            _restore_state(model, self.snapshot)
            self.phase("writing files")
            helper = _COMPILE_HELPER[0]
            ready = False
            if helper is not None:
                ready, note = helper.wait_compiled()
                if note:
                    self.notes.add_plain(note)
                self.phase("waiting for torch.compile in the helper process")
            if self.resident is not None:
                # The kept inputs themselves, with the scalars in their places.
                self.timing_sets = [_with_scalars(self.problem, self.sig_inputs, t) for t in self.timing_sets
                                    if t is not None]
            timing_sets = self.timing_sets
            with timing_precision(self.timing_level):
                eager, compiled, timing_warnings = ks_timing.time_model(model, timing_sets, device,
                                                                        compile_model=not ready, phases=phases)
                if ready:
                    # The helper measures while this process waits: the GPU is one
                    # process's at a time whenever something is timed.
                    t0 = time.monotonic()
                    compiled, note = helper.time_compiled()
                    phases["torch.compile timing (helper process, compiled before)"] = time.monotonic() - t0
                    if note:  # it failed after compiling: timed here, as without a helper
                        self.notes.add_plain(note)
                        eager, compiled, timing_warnings = ks_timing.time_model(model, timing_sets, device,
                                                                                phases=phases)
            self.timing_precision = self.timing_level or "default"
            eager_fp32 = None
            if self.default_error:
                # The defaults compute in TF32 here: eager at the precision the
                # candidate is held to as well, so that a speedup can name either.
                torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
                t0 = time.monotonic()
                with torch.no_grad():
                    eager_fp32 = ks_timing.Timer(device).measure(model, timing_sets)
                phases["eager timing with TF32 off"] = time.monotonic() - t0
                torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = self.tf32_defaults
            self._clock = time.monotonic()
            self.timing = {"eager": eager, "compiled": compiled, "eager_fp32": eager_fp32}
            for w in timing_warnings:
                self.warnings.add_plain(w)
        self.timing_sets = None

    def export_resident(self):
        """Resident: the kept inputs checked once more (timing ran forward on
        them), then every set's tensors exported for the evaluator to map."""
        import torch
        resident, sets = self.resident, self.sets
        if resident is None:
            return
        for i in range(sets):
            _keep_inputs_pristine(self.problem, self.sig_inputs, self.input_hashes, self.input_prints, i,
                                  self.set_seed(i), self.device)
        torch.cuda.empty_cache()
        names = [spec["name"] for spec in self.sig_inputs if spec["kind"] == "tensor"]
        for i, entry in enumerate(self.manifest_sets[:sets]):
            ipc = dict(self.ipc_params)
            for name, t in zip(names, self.input_hashes[i]):
                ipc[name] = resident.export(t)
            for spec, t in zip(self.sig_outputs, self.output_hashes[i]):
                ipc[spec["name"]] = resident.export(t)
            ipc.update(_export_named(resident, self.bounds_kept[i]))
            entry["ipc"] = ipc
        for entry, (t_inputs, t_outputs) in zip(self.manifest_sets[sets:], self.t_kept):
            ipc = dict(self.ipc_params)
            for name, t in t_inputs.items():
                ipc[name] = resident.export(t)
            ipc.update(_export_named(resident, t_outputs.items()))
            entry["ipc"] = ipc
        self.input_hashes = self.output_hashes = self.t_kept = self.bounds_kept = None
        self.phase("export (CUDA IPC)")

    def manifest(self, degenerate):
        import torch
        problem, device, sets = self.problem, self.device, self.sets
        m = {
            "signature": dict(make_signature(problem, self.sig_inputs, self.params, self.sig_outputs),
                              # PyTorch's own float32 rounding by output (measure_rounding): widens its tolerance.
                              reference_error=self.rounding,
                              **(self.known_flops if self.known_flops else count_flops(problem, self.seed))),
            "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__,
            "sets": self.manifest_sets,
            "timing": self.timing,
            # What eager and torch.compile were timed under: "high" or "medium"
            # (torch.set_float32_matmul_precision(level), cuDNN TF32 on), else "default".
            "timing_precision": self.timing_precision,
            "warnings": self.warnings.messages(sets),
            "degenerate": degenerate,
            "notes": self.notes.messages(sets),
            # The precision contract: how far PyTorch's defaults (TF32 in cuDNN convolutions)
            # are from the full-fp32 reference, by float32 output; {} where they give the same bits.
            "default_precision": {"tf32_defaults": list(self.tf32_defaults), "errors": self.default_error},
            # Other shapes (get_inputs_variants()): how many the problem declares
            # (each is a reference of its own, bridge.py reference --variant I), or
            # which one this reference is.
            "shape_variants": problem.variant_count() if problem.variant is None else 0,
            "shape_variant": problem.variant,
            # Each transform of transforms.TRANSFORMS: its set's index, or why it has none.
            "transforms": self.transform_info,
            "scalars": self.scalars,
        }
        self.phase("manifest (FLOP count, warnings)")
        # Wall seconds per phase of this bridge run, in order (not part of any result).
        m["phases"] = [[k, round(v, 3)] for k, v in self.phases.items()]
        return m


def _shifted_state(model, snapshot, name, seed, params_too):
    """The model as a shifted set runs it: the pre-forward state, its float32
    parameters transformed by `name` when params_too (transforms.py)."""
    import transforms
    _restore_state(model, snapshot)
    if params_too:
        transforms.apply_to_parameters(name, model, seed)


def _shifted_forward(problem, model, inputs, sig_outputs, base_nonfinite):
    """forward on a shifted set: (outputs, None), or (outputs or None, why the
    set cannot judge: forward raised, other shapes, NaN/Inf where set 0 has none)."""
    import transforms
    try:
        outputs = problem.forward(model, inputs)
    except BridgeError as e:
        return None, "forward() raised on these inputs (%s)" % e.message.split(" raised ", 1)[-1][:300]
    if output_specs(problem, outputs) != sig_outputs:
        return outputs, "forward() returns other output shapes or dtypes on these inputs"
    for (oname, t) in outputs:
        bad, before = transforms.nonfinite_count(t), base_nonfinite.get(oname, 0)
        if bad > before:
            return outputs, ("PyTorch's output '%s' has %d NaN/Inf elements on these inputs where input set 0's has "
                             "%d (outside the operator's domain or range)" % (oname, bad, before))
    return outputs, None


def _not_checked(name, wanted, no_floats, no_room):
    """(note, tell the user) for a transform that gets no set here, or None."""
    if name not in wanted:
        return "not checked: the problem's INPUT_TRANSFORMS leaves it out", False
    if no_floats:
        return "not checked: the problem has no floating-point input tensor to transform", False
    if no_room:
        return ("not checked: no room for another input set (the cache cap, the free disk or the GPU's free "
                "memory)"), True
    return None


def _keep_shifted_inputs(tensor_specs, inputs, resident, set_dir, index, files):
    """A shifted set's tensor inputs: written (files[name] set), or kept
    (resident) with their fingerprints. Returns ({name: kept tensor}, prints)."""
    import torch
    t_inputs, prints = {}, []
    for spec, v in zip(tensor_specs, [v for v in inputs if isinstance(v, torch.Tensor)]):
        if resident is not None:
            t_inputs[spec["name"]] = v.contiguous()
            prints.append(_fingerprint(t_inputs[spec["name"]]))
        elif set_dir:
            store_tensor(v, os.path.join(set_dir, spec["name"] + ".bin"))
            files[spec["name"]] = "set%d/%s.bin" % (index, spec["name"])
    return t_inputs, prints


def _keep_shifted_tensors(named, keep, resident, set_dir, index, files):
    """A shifted set's (name, tensor) pairs: written (files[name] set), or,
    resident, kept as keep(tensor). Returns {name: kept tensor}; a tensor
    named twice is written, or kept, once."""
    if resident is None:
        if set_dir:
            _store_named(named, set_dir, index, files)
        return {}
    kept, by_id = {}, {}
    for name, t in named:
        if id(t) not in by_id:
            by_id[id(t)] = keep(t)
        kept[name] = by_id[id(t)]
    return kept


def add_transformed_sets(problem, model, snapshot, sig_inputs, sig_outputs, seed, device, out_dir, resident, sets,
                         room, base_nonfinite, manifest_sets, files_params, notes, forward_s=0.0, peak_forward=0):
    """The distribution-shifted input sets (transforms.py), appended to
    manifest_sets after the K get_inputs() sets: at most `room` of them (None:
    not asked for, as by `check`), each input set 0 transformed, with
    its float64 truth as its reference (PyTorch's output where float64 did
    not run) and the bounds of PyTorch's error (truth.py); files in out_dir,
    or kept on the GPU (resident: exported by the caller). Returns (info,
    kept): info has one entry per transform, {"name", "set": its index or
    None, "note": what it does, or why it has no set, and "reference_error":
    PyTorch's own float32 rounding on that set, as set 0's, where float64
    ran}; kept, per set made (resident only), the ({input name: tensor},
    {output name or output@level: tensor}) to export. A set where PyTorch's
    own float32 result fails the element rule against float64 is kept (an
    ill-conditioned input: judged against float64, with the bound PyTorch
    needs there) and its note says so. Each set's float64 run has its own
    $KS_FP64_CHECK_MAX_S."""
    import torch
    import transforms
    info, kept = [], []
    if room is None:
        return info, kept
    wanted = transforms.chosen(problem.module)
    set_seed = seed + 1  # input set 0, transformed
    tensor_specs = [spec for spec in sig_inputs if spec["kind"] == "tensor"]

    def fresh(name):
        # Set 0's inputs made again and, on a GPU, transformed in place: one copy
        # of a multi-GB input in memory. There get_inputs() draws its tensors on
        # the device or they are moved there, a new tensor each call; on the CPU a
        # problem may hand back one module-level tensor every time, which must
        # not change under the other sets (they are small there: copied).
        return transforms.apply(name, problem.inputs(set_seed, device), set_seed, in_place=device.type == "cuda")

    no_floats = not any(spec["kind"] == "tensor" and spec["dtype"] in ("float32", "float16", "bfloat16", "float64")
                        for spec in sig_inputs)
    dtype_of = {spec["name"]: spec["dtype"] for spec in sig_outputs}
    p_wanted = transforms.parameters_chosen(problem.module)
    p_names = transforms.transformable_parameters(model)
    for name in transforms.TRANSFORMS:
        skipped = _not_checked(name, wanted, no_floats, len(manifest_sets) - sets >= room)
        if skipped:
            note, tell = skipped
            info.append({"name": name, "set": None, "note": note})
            if tell:
                notes.add_plain("transform '%s' %s" % (name, note))
            continue
        index = len(manifest_sets)
        inputs = fresh(name)
        files = dict(files_params)
        set_dir = os.path.join(out_dir, "set%d" % index) if out_dir is not None else None
        if set_dir:
            os.makedirs(set_dir, exist_ok=True)
        t_inputs, prints = _keep_shifted_inputs(tensor_specs, inputs, resident, set_dir, index, files)
        # The parameters change with the inputs where the problem has float32
        # ones; where PyTorch's output is then not finite (or forward raises),
        # the set is made again with the inputs alone.
        tries = [True, False] if (name in p_wanted and p_names) else [False]
        param_note = ("" if not p_names else "; parameters kept as they are: the problem's PARAMETER_TRANSFORMS "
                      "leaves it out" if name not in p_wanted else "")
        for params_too in tries:
            if not params_too and tries[0]:
                inputs = fresh(name)  # the first forward may have changed them in place
            _shifted_state(model, snapshot, name, set_seed, params_too)
            _seed_everything(set_seed)
            outputs, why = _shifted_forward(problem, model, inputs, sig_outputs, base_nonfinite)
            if why is None:
                break
            if params_too:
                param_note = "; parameters kept as they are: with them transformed too, %s" % why
                del outputs
        if why is not None:
            note = "dropped: %s" % why
            info.append({"name": name, "set": None, "note": note})
            notes.add_plain("transform '%s' (%s) %s" % (name, transforms.DESCRIPTIONS[name], note))
            if set_dir:
                import shutil
                shutil.rmtree(set_dir, ignore_errors=True)
            del outputs
            _restore_state(model, snapshot)
            continue
        t_params = {}
        if params_too:
            # The set's own parameters, as forward saw them.
            own = [(pname, v) for pname, v in model.state_dict().items() if pname in p_names]
            t_params = _keep_shifted_tensors(own, lambda v: v.detach().clone(), resident, set_dir, index, files)
        # A shifted set rounds differently from set 0 (outliers dominate a
        # variance, a scaled sum cancels otherwise, a scaled logit picks another
        # key): its own float64 truth, and PyTorch's error from it.
        truth = compute_truth(problem, model, set_seed, device, outputs, inputs, forward_s, peak_forward,
                              prepare=lambda: _shifted_state(model, snapshot, name, set_seed, params_too),
                              make_inputs=lambda: fresh(name))
        _restore_state(model, snapshot)
        named = [(oname, truth.reference(oname, t)) for oname, t in outputs]
        for oname, _ in outputs:
            named += truth.bound_tensors(oname)
        t_outputs = _keep_shifted_tensors(named, lambda t: t.detach().contiguous(), resident, set_dir, index, files)
        del outputs, named
        if resident is not None:
            # forward changed an input in place: the transform is deterministic, so make it again.
            if [_fingerprint(t) for t in t_inputs.values()] != prints:
                again = [v for v in fresh(name) if isinstance(v, torch.Tensor)]
                t_inputs = {spec["name"]: v.contiguous() for spec, v in zip(tensor_specs, again)}
            t_inputs.update(t_params)  # exported with the inputs, in place of the shared parameters
            kept.append((t_inputs, t_outputs))
        entry = dict({"seed": set_seed, "files": files, "transform": name}, **truth.manifest_fields())
        note = transforms.DESCRIPTIONS[name]
        if params_too:
            entry["parameters"] = list(p_names)
            note += "; the model's float32 parameters likewise (%s)" % ", ".join(p_names)
        note += param_note
        if truth.ill_conditioned():
            note += "; " + ill_conditioned_note(truth.ill_conditioned())
        manifest_sets.append(entry)
        info.append({"name": name, "set": index, "note": note, "reference_error": truth.rounding(dtype_of),
                     "parameters": list(p_names) if params_too else []})
        truth.release()
    return info, kept


def write_manifest(out_dir, manifest):
    # Written last and atomically: a directory without manifest.json is incomplete.
    path = os.path.join(out_dir, "manifest.json")
    tmp = path + ".tmp.%d" % os.getpid()
    with open(tmp, "w") as f:
        json.dump(manifest, f, indent=1, allow_nan=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
