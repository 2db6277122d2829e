"""The Python side of export_gpu_test's compile, capture and training tests
(issue 34). Loads an exported module and shows, on the GPU, that ModelNew
- is one PyTorch operator: torch._dynamo.explain finds one graph and no graph
  break (with and without grad), and torch.compile(fullgraph=True) runs it at
  every shape given, bit for bit the eager call (the same kernel);
- has a fake implementation whose shapes (meta tensors) are the problem's;
- runs under CUDA graph capture: torch.cuda.CUDAGraph replays, and
  mode="reduce-overhead" (no cudagraph skipped), equal eager calls on new data;
- trains: check_backward()'s gradients (eager, torch.compile, reduce-overhead)
  pass the judge's rule against the problem's float64 gradients, and a whole
  training step captured in a CUDA graph (PyTorch's recipe, on a copy with
  fresh parameters) replays the eager step's gradients;
- check() and benchmark() take the compiled model (reduce-overhead too);
  benchmark() times a training step beside the forward.
Prints one JSON line per check, then EXPORT_COMPILES, or EXPORT_COMPILE_FAILED
with the checks that failed. argv: module dir, JSON list of input shapes (of
the problem's one input; the first is the problem's own).
"""
import copy
import gc
import json
import sys
import time
import traceback

import torch

sys.path.insert(0, sys.argv[1])
import kernel_module as km  # noqa: E402

problem = km._problem
shapes = json.loads(sys.argv[2])
failed = []


def report(name, ok, **figures):
    print(json.dumps(dict(check=name, ok=bool(ok), **figures), default=str), flush=True)
    if not ok:
        failed.append(name)


def check(name, fn):
    """Runs fn() -> (ok, figures); an exception fails the check with its traceback."""
    start = time.time()
    try:
        ok, figures = fn()
    except Exception as e:  # noqa: BLE001 - reported, and the other checks still run
        ok, figures = False, {"error": "%s: %s" % (type(e).__name__, e), "traceback": traceback.format_exc()}
    figures["seconds"] = round(time.time() - start, 2)
    report(name, ok, **figures)


def outs(v):
    return list(v) if isinstance(v, (tuple, list)) else [v]


def max_abs(a, b):
    return max(float((x.double() - y.double()).abs().max()) if x.numel() else 0.0 for x, y in zip(outs(a), outs(b)))


def same(a, b):
    return all(x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(outs(a), outs(b)))


def randn(shape):
    return torch.randn(*shape, device="cuda")


def cudagraph_skips():
    from torch._dynamo.utils import counters
    return int(counters["inductor"]["cudagraph_skips"])


torch.manual_seed(0)
model = km.ModelNew(*problem.get_init_inputs()).cuda()
x0 = randn(shapes[0])
report("setup", km.OP is not None, torch=torch.__version__, device=torch.cuda.get_device_name(),
       op=km.OP_NAME, note=km.OP_NOTE)
if km.OP is None:
    print("EXPORT_COMPILE_FAILED: no custom operator: " + km.OP_NOTE)
    sys.exit(0)


def eager_check():
    c = km.check(model, x0)
    return c["ok"], {"outputs": c["outputs"]}


def explain():
    figures = {}
    ok = True
    for mode, grad in (("no_grad", False), ("grad", True)):
        torch._dynamo.reset()
        with torch.set_grad_enabled(grad):
            e = torch._dynamo.explain(model)(x0)
        figures[mode] = {"graph_count": e.graph_count, "graph_break_count": e.graph_break_count,
                         "break_reasons": [str(r) for r in e.break_reasons]}
        ok = ok and e.graph_count == 1 and e.graph_break_count == 0
    return ok, figures


def compiled_at_every_shape():
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    rows = []
    for shape in shapes:
        for trial in range(2):
            x = randn(shape)
            with torch.no_grad():
                got, want = compiled(x), model(x)
            rows.append({"shape": shape, "trial": trial, "equal": same(got, want), "max_abs": max_abs(got, want)})
    return all(r["equal"] for r in rows), {"runs": rows}


def fake_shapes():
    meta = copy.deepcopy(model).to("meta")
    rows = []
    for shape in shapes:
        with torch.no_grad():
            got = outs(meta(torch.empty(*shape, device="meta")))
        want = km._reference(model, [randn(shape)])
        rows.append({"shape": shape, "fake": [list(o.shape) for o in got], "problem": [list(o.shape) for o in want],
                     "dtypes": [str(o.dtype) for o in got],
                     "ok": [list(o.shape) for o in got] == [list(o.shape) for o in want]
                     and all(a.dtype == b.dtype and a.device.type == "meta" for a, b in zip(got, want))})
    return all(r["ok"] for r in rows), {"shapes": rows}


def cuda_graph_forward():
    static_x = x0.clone()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side), torch.no_grad():
        for _ in range(3):  # warm-up, as capture asks
            model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(graph):
        static_out = model(static_x)
    rows = []
    for replay in range(3):
        x = randn(shapes[0])
        static_x.copy_(x)
        graph.replay()
        torch.cuda.synchronize()
        with torch.no_grad():
            want = model(x)
        rows.append({"replay": replay, "equal": same(static_out, want), "max_abs": max_abs(static_out, want)})
    return all(r["equal"] for r in rows), {"replays": rows}


def reduce_overhead_forward():
    torch._dynamo.reset()
    skips = cudagraph_skips()
    graphed = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    rows = []
    for call in range(4):  # warm-up, record, then replays
        x = randn(shapes[0])
        with torch.no_grad():
            got = [o.clone() for o in outs(graphed(x))]
            want = model(x)
        rows.append({"call": call, "equal": same(got, want), "max_abs": max_abs(got, want)})
    skipped = cudagraph_skips() - skips
    return all(r["equal"] for r in rows) and skipped == 0, {"calls": rows, "cudagraph_skips": skipped}


def gradients(report_):
    return [{k: f[k] for k in ("name", "ok", "max_abs", "mismatches", "rel_norm", "rel_norm_bound")}
            for f in report_["gradients"]]


def training_eager():
    c = km.check_backward(model, x0)
    return c["ok"] and len(c["gradients"]) > 0, {"truth": c["truth"], "contract": c["contract"],
                                                 "gradients": gradients(c)}


def training_compiled(mode):
    def run():
        torch._dynamo.reset()
        skips = cudagraph_skips()
        compiled = torch.compile(model, mode=mode, fullgraph=True)
        rows = []
        for step in range(3):  # compile, then (reduce-overhead) record and replay
            c = km.check_backward(compiled, x0 if step == 0 else randn(shapes[0]))
            rows.append({"step": step, "ok": c["ok"] and len(c["gradients"]) > 0, "gradients": gradients(c)})
        skipped = cudagraph_skips() - skips
        ok = all(r["ok"] for r in rows) and (mode != "reduce-overhead" or skipped == 0)
        return ok, {"steps": rows, "cudagraph_skips": skipped}
    return run


def training_step_in_a_cuda_graph():
    # PyTorch's recipe for capturing a whole training step: a parameter's gradient accumulator keeps the
    # stream it was made on, so the parameters must have none left from the checks above (made on the default
    # stream, possibly still held by a graph of theirs): a CUDA graph capture cannot make the default stream
    # wait on it (cudaErrorStreamCaptureImplicit). A copy of the model has fresh parameters, whose accumulators
    # the warm-up below makes and frees on its side stream.
    torch._dynamo.reset()
    gc.collect()
    net = copy.deepcopy(model)
    params = [p for p in net.parameters() if p.requires_grad]
    static_x = x0.clone().requires_grad_()
    with torch.no_grad():
        static_g = [torch.randn_like(o) for o in outs(net(x0))]

    def step():
        net.zero_grad(set_to_none=True)
        static_x.grad = None
        torch.autograd.backward(outs(net(static_x)), static_g)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    net.zero_grad(set_to_none=True)
    static_x.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.autograd.backward(outs(net(static_x)), static_g)
    static_grads = [static_x.grad] + [p.grad for p in params]
    rows = []
    for replay in range(2):
        x = randn(shapes[0])
        gs = [torch.randn_like(g) for g in static_g]
        with torch.no_grad():
            static_x.copy_(x)
            for s, g in zip(static_g, gs):
                s.copy_(g)
        graph.replay()
        torch.cuda.synchronize()
        leaf = x.clone().requires_grad_()
        want = torch.autograd.grad(outs(net(leaf)), [leaf] + params, gs)
        rows.append({"replay": replay, "max_abs": [max_abs(a, b) for a, b in zip(static_grads, want)],
                     "ok": all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(static_grads, want))})
    return all(r["ok"] for r in rows), {"replays": rows, "gradients": 1 + len(params)}


def check_and_benchmark_compiled():
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    c = km.check(compiled, x0)
    b = km.benchmark(compiled, x0, runs=20, warmup=3)
    e = km.benchmark(model, x0, runs=20, warmup=3)
    keys = ("kernel_ms", "eager_ms", "speedup", "train_kernel_ms", "train_eager_ms", "train_speedup")
    ok = c["ok"] and all(isinstance(r[k], float) and r[k] > 0 for r in (b, e) for k in keys)
    return ok, {"check_ok": c["ok"], "compiled": b, "eager": e}


def benchmark_reduce_overhead():
    # CUDA graph trees: benchmark() begins a step before each call and draws nothing random while timing.
    torch._dynamo.reset()
    skips = cudagraph_skips()
    graphed = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    b = km.benchmark(graphed, x0, runs=20, warmup=3)
    keys = ("kernel_ms", "eager_ms", "speedup", "train_kernel_ms", "train_eager_ms", "train_speedup")
    skipped = cudagraph_skips() - skips
    ok = all(isinstance(b[k], float) and b[k] > 0 for k in keys) and skipped == 0
    return ok, {"reduce_overhead": b, "cudagraph_skips": skipped}


check("eager: check() passes", eager_check)
check("torch._dynamo.explain: one graph, no break", explain)
check("torch.compile(fullgraph=True) equals eager at every shape", compiled_at_every_shape)
check("fake implementation: the problem's output shapes", fake_shapes)
check("torch.cuda.CUDAGraph: replays equal eager", cuda_graph_forward)
check("mode=reduce-overhead: equal eager, no cudagraph skipped", reduce_overhead_forward)
check("training, eager: check_backward() passes", training_eager)
check("training, torch.compile(fullgraph=True): check_backward() passes", training_compiled("default"))
check("training, mode=reduce-overhead: check_backward() passes, no cudagraph skipped",
      training_compiled("reduce-overhead"))
check("training step captured in a torch.cuda.CUDAGraph: replays equal eager gradients",
      training_step_in_a_cuda_graph)
check("check() and benchmark() take torch.compile'd models; benchmark() times a training step",
      check_and_benchmark_compiled)
check("benchmark() takes a mode=reduce-overhead model and times its training step", benchmark_reduce_overhead)
print("EXPORT_COMPILES" if not failed else "EXPORT_COMPILE_FAILED: " + "; ".join(failed))
