#!/usr/bin/env python3
"""Benchmark (issue 26): the floor fraction of the KernelBench-scale kernels
recomputed with the compute floor.

For each row of a kernelbench_scale results file (JSON lines: problem, level,
median_ms, fraction_of_floor as measured then, against the memory floor
alone), counts the problem's FLOPs with the bridge (count_flops: torch's FLOP
counter on the meta device, by dtype) and recomputes the floor as the
evaluator now does (evaluator/profile/roofline.cc): max(memory floor, compute floor),
the compute floor being sum over classes of FLOPs / measured peak, with fp32
at the faster of the fp32 peak and a third of the TF32 peak (3xTF32). The
memory floor is the one the row was judged against (its bandwidth is implied
by bytes / (fraction x median)), so only the compute part is new. Needs
torch >= 2.1 (the counter); no GPU.

  python3 bench/compute_floor.py --results bench/results/kernelbench_scale_2026-11-23b.jsonl \
      --kernelbench KB_DIR --peaks bench/results/peaks_h100.json [--json OUT.json] > OUT.md
KB_DIR holds level1/ and level2/ (or KernelBench/level1 ...) problem files.
"""
import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "evaluator", "reference"))
import bridge  # noqa: E402


def find_problem(kb, level, name):
    for d in (os.path.join(kb, level), os.path.join(kb, "KernelBench", level)):
        p = os.path.join(d, name + ".py")
        if os.path.exists(p):
            return p
    return None


def minimum_bytes(problem, seed=42):
    """Inputs, parameters and outputs once (Signature::MinimumBytes), from shapes on meta."""
    import torch
    meta = bridge._signature_on_meta(problem, seed)
    if meta is None:
        return None
    model, inputs, result = meta
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)] + list(model.state_dict().values())
    tensors += [t for _, t in problem._outputs(result)]
    return sum(t.numel() * t.element_size() for t in tensors)


def class_peak(peaks, cls):
    if cls == "fp32":
        fp32, tf32 = peaks.get("fp32", 0), peaks.get("tf32", 0) / 3
        return (tf32, "3xTF32") if tf32 > fp32 else (fp32, "fp32")
    return peaks.get(cls, 0), cls


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--results", required=True)
    ap.add_argument("--kernelbench", required=True)
    ap.add_argument("--peaks", required=True, help="bridge.py peaks output (JSON with 'tflops')")
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    peaks = json.load(open(a.peaks))["tflops"]
    rows = {}
    for line in open(a.results):
        if line.strip():
            r = json.loads(line)
            rows[(r["level"], r["problem"])] = r
    out = []
    for (level, name), r in sorted(rows.items()):
        path = find_problem(a.kernelbench, level, name)
        row = {"problem": name, "level": level, "median_ms": r.get("median_ms"),
               "old_fraction": r.get("fraction_of_floor"), "commit": r.get("commit")}
        if path is None or not r.get("median_ms") or not r.get("fraction_of_floor"):
            row["note"] = "no problem file or no measurement"
            out.append(row)
            continue
        problem = bridge.Problem(path).load()
        f = bridge.count_flops(problem, 42)
        nbytes = minimum_bytes(problem)
        median = r["median_ms"]
        memory_floor = r["fraction_of_floor"] * median  # what the row was judged against
        compute_floor, paths = 0.0, []
        for cls, n in (f["flops_by_class"] or {}).items():
            peak, path_name = class_peak(peaks, cls)
            if peak > 0:
                compute_floor += n / (peak * 1e12) * 1e3
                paths.append("%s at %.0f TFLOP/s (%s)" % (cls, peak, path_name))
        floor = max(memory_floor, compute_floor)
        row.update(flops=f["flops"], flops_source=f["flops_source"], flops_by_class=f["flops_by_class"],
                   flops_note=f["flops_note"], bytes=nbytes,
                   implied_gbps=nbytes / (memory_floor * 1e-3) / 1e9 if nbytes else None,
                   memory_floor_ms=memory_floor, compute_floor_ms=compute_floor, floor_ms=floor,
                   bound="compute" if compute_floor > memory_floor else "memory",
                   new_fraction=floor / median, peaks_used=paths,
                   achieved_tflops=(f["flops"] or 0) / (median * 1e-3) / 1e12)
        out.append(row)
    print("| problem | level | median ms | FLOPs counted | TFLOP/s achieved | floor before (memory only) | "
          "floor now | bound | compute path |")
    print("|---|---|---:|---:|---:|---:|---:|---|---|")
    for row in out:
        if "new_fraction" not in row:
            print("| %s | %s | - | - | - | - | - | - | %s |" % (row["problem"], row["level"], row.get("note", "")))
            continue
        print("| %s | %s | %.3f | %.3g | %.1f | %.1f%% | %.1f%% | %s | %s |" % (
            row["problem"], row["level"], row["median_ms"], row["flops"] or 0, row["achieved_tflops"],
            100 * row["old_fraction"], 100 * row["new_fraction"], row["bound"], "; ".join(row["peaks_used"]) or "-"))
    print("\ntorch %s; peaks %s" % (torch.__version__, json.dumps(peaks)))
    if a.json:
        with open(a.json, "w") as fh:
            json.dump(out, fh, indent=1)


if __name__ == "__main__":
    main()
