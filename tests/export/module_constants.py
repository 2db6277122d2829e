"""export_test: the constants of an exported kernel_module.py, read without
importing it (no torch needed). argv: the module file; prints them as JSON."""
import ast, json, sys
tree = ast.parse(open(sys.argv[1]).read())
consts = {}
for node in tree.body:
    if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        v = node.value
        if isinstance(v, ast.Call) and getattr(v.func, "attr", "") == "loads":
            consts[node.targets[0].id] = json.loads(ast.literal_eval(v.args[0]))
        elif isinstance(v, ast.Constant):
            consts[node.targets[0].id] = v.value
print(json.dumps(consts))
