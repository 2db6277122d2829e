"""export_test's comparison: resolves each case's plan with export/ks_launch_plan.py.

argv: the folder of ks_launch_plan.py, cases.json ([{"plan": text, "kernels":
{name: [kinds]}}]), signature.json. Prints a JSON list: {"ok": resolved plan}
or {"error": message} per case, for the C++ side to compare with ResolvePlan.
"""
import json, sys
sys.path.insert(0, sys.argv[1])
import ks_launch_plan as lp
cases = json.load(open(sys.argv[2]))
env = lp.env_from_signature(json.load(open(sys.argv[3])))
results = []
for c in cases:
    try:
        results.append({"ok": lp.resolve_plan(lp.parse_plan(c["plan"]), c["kernels"], env)})
    except lp.PlanError as e:
        results.append({"error": str(e)})
print(json.dumps(results))
