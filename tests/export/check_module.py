"""The Python side of the export gpu tests (export_gpu_test, search_gpu_test):
loads an exported module, builds the problem's Model and ModelNew with the same
weights, and compares them (torch.allclose) at each shape given. Prints
EXPORT_MATCHES or EXPORT_DIFFERS. argv: module dir, JSON list of input shapes,
atol, rtol.
"""
import json, sys
import torch
sys.path.insert(0, sys.argv[1])
import kernel_module
problem = kernel_module._problem
shapes = json.loads(sys.argv[2])
atol, rtol = float(sys.argv[3]), float(sys.argv[4])
torch.manual_seed(0)
ref = problem.Model(*problem.get_init_inputs()).cuda().eval()
torch.manual_seed(0)
new = kernel_module.ModelNew(*problem.get_init_inputs()).cuda().eval()
assert isinstance(new, problem.Model)
new.load_state_dict(ref.state_dict())  # same keys: a drop-in
ok = True
for shape in shapes:
    for trial in range(2):  # the second call runs the already-loaded module
        x = torch.randn(*shape, device="cuda")
        with torch.no_grad():
            want = ref(x)
        got = new(x)
        torch.cuda.synchronize()
        same = got.shape == want.shape and got.dtype == want.dtype and torch.allclose(got, want, atol=atol, rtol=rtol)
        err = (got.float() - want.float()).abs().max().item() if got.shape == want.shape else float("inf")
        print(json.dumps({"shape": shape, "trial": trial, "match": bool(same), "max_abs": err}))
        ok = ok and same
print("EXPORT_MATCHES" if ok else "EXPORT_DIFFERS")
