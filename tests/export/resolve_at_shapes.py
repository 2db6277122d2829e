"""export_test: resolves a plan at shapes other than the signature's (argv: the
folder of ks_launch_plan.py, the plan as JSON text); prints the resolved plan."""
import json, sys
sys.path.insert(0, sys.argv[1])
import ks_launch_plan as lp
env = lp.Env()
for name, shape in (("x", (1000, 1024)), ("ln.weight", (1024,)), ("ln.bias", (1024,)), ("out", (1000, 1024))):
    env.add_tensor(name, shape)
r = lp.resolve_plan(json.loads(sys.argv[2]), {"row_stats": ["b64", "b64", "b32", "f32"],
                    "normalize": ["b64", "b64", "b64", "b64", "b64", "b64", "b32"]}, env)
print(json.dumps(r))
