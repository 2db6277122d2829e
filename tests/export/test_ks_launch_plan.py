"""export/ks_launch_plan.py on its own: the launch-plan rules of
evaluator/plan/launch_plan.cc, in pure Python (no torch). That the two agree on many
plans is export_test's (PythonPlanRulesAgreeWithTheEvaluator and
PythonPlanRulesAgreeOnGeneratedPlans)."""
import pytest

import ks_launch_plan as lp


@pytest.fixture
def env():
    e = lp.Env()
    e.add_tensor("x", (8, 1000))
    e.add_tensor("ln.weight", (1000,))
    e.add_scalar("n", 7, False)
    e.add_scalar("alpha", 0.5, True)
    e.add_tensor("out", (8, 1000))
    return e


@pytest.mark.parametrize("expr,value", [
    ("1 + 2 * 3", 7),
    ("(1 + 2) * 3", 9),
    ("-7 / 2", -3),      # C: truncates toward zero
    ("7 / -2", -3),
    ("-7 % 3", -1),      # C: the dividend's sign
    ("7 % -3", 1),
    ("+3 - -2", 5),
    ("cdiv(1000, 256)", 4),
    ("cdiv(0, 256)", 0),
    ("min(5, 3, 9)", 3),
    ("max(5, 3, 9)", 9),
    ("x.shape[0]", 8),
    ("x.shape[-1]", 1000),
    ("x.shape[ 1 ] * 2", 2000),
    ("x.numel", 8000),
    ("ln.weight.numel", 1000),
    ("n * 2", 14),
    ("9223372036854775807", 2**63 - 1),
])
def test_expressions(env, expr, value):
    assert lp.eval_int(expr, env) == value


@pytest.mark.parametrize("expr,message", [
    ("1 / 0", "division by zero"),
    ("1 % (n - 7)", "division by zero"),
    ("x.numel * 4611686018427387904", "integer overflow"),
    ("9223372036854775808", "too large"),
    ("1.5 + 2", "float literal"),
    ("alpha * 2", "is a float"),
    ("x + 1", "is a tensor"),
    ("y.numel", "unknown tensor"),
    ("x.shape[2]", "out of range"),
    ("cdiv(n, 0)", "non-positive"),
    ("cdiv(0 - 1, 2)", "negative"),
    ("cdiv(1)", "two arguments"),
    ("nope", "unknown name"),
    ("(1", "expected ')'"),
    ("1 2", "unexpected '2'"),
])
def test_expression_errors(env, expr, message):
    with pytest.raises(lp.PlanError, match=message.replace("(", r"\(").replace(")", r"\)")):
        lp.eval_int(expr, env)


def test_long_expressions_are_refused(env):
    with pytest.raises(lp.PlanError, match="4096"):
        lp.eval_int("1+" * 2048 + "1", env)


def test_the_first_of_a_name_wins():
    e = lp.Env()
    e.add_tensor("x", (4,))
    e.add_tensor("x", (5,))
    e.add_scalar("x", 3, False)
    assert lp.eval_int("x.numel", e) == 4


@pytest.mark.parametrize("arg,kind,want", [
    ("x", "b64", {"kind": "tensor", "name": "x"}),
    ("x.shape[1]", "b32", {"kind": "i32", "value": 1000}),
    ("x.numel", "b64", {"kind": "i64", "value": 8000}),
    ("x.numel", "f64", {"kind": "f64", "value": 8000.0}),
    ("n", "f32", {"kind": "f32", "value": 7.0}),
    ("alpha", "f64", {"kind": "f64", "value": 0.5}),
    ("0.00001", "f32", {"kind": "f32", "value": 1e-05}),
    ("1e-5", "f64", {"kind": "f64", "value": 1e-05}),
    (3, "b32", {"kind": "i32", "value": 3}),
    (-4, "b64", {"kind": "i64", "value": -4}),
    (2.5, "f32", {"kind": "f32", "value": 2.5}),
    ("4294967295", "b32", {"kind": "i32", "value": 4294967295}),
    ("-2147483648", "b32", {"kind": "i32", "value": -2147483648}),
])
def test_arguments(env, arg, kind, want):
    assert lp.resolve_arg(arg, kind, env, set()) == want


@pytest.mark.parametrize("arg,kind", [
    ("x", "b32"),               # a pointer into a 32-bit parameter
    ("alpha", "b32"),           # a float into an integer
    (2.5, "b32"),
    ("1e-5", "b64"),
    ("4294967296", "b32"),      # does not fit 32 bits
    (True, "b32"),              # JSON true is not a number
    ("x.numel", "bytes"),       # a by-value struct cannot be filled
])
def test_argument_errors(env, arg, kind):
    with pytest.raises(lp.PlanError):
        lp.resolve_arg(arg, kind, env, set())


def test_scratch_is_a_pointer(env):
    assert lp.resolve_arg("partial", "b64", env, {"partial"}) == {"kind": "scratch", "name": "partial"}
    with pytest.raises(lp.PlanError, match="pointer"):
        lp.resolve_arg("partial", "b32", env, {"partial"})


def test_looks_like_float():
    assert lp.looks_like_float("0.5") and lp.looks_like_float("1e-5") and lp.looks_like_float("-2.")
    assert not lp.looks_like_float("12") and not lp.looks_like_float("x.numel") and not lp.looks_like_float("e")


LAYERNORM = {
    "launches": [
        {"kernel": "row_stats", "grid": ["x.shape[0]"], "block": [256], "shared_bytes": "0",
         "args": ["x", "stats", "x.shape[1]", "0.00001"]},
        {"kernel": "normalize", "grid": ["cdiv(x.numel, 256)"], "block": [256],
         "args": ["x", "stats", "ln.weight", "out", "x.numel", "x.shape[1]"]},
    ],
    "scratch": [{"name": "stats", "bytes": "x.shape[0] * 8"}],
}
LAYERNORM_KERNELS = {"row_stats": ["b64", "b64", "b32", "f32"],
                     "normalize": ["b64", "b64", "b64", "b64", "b64", "b32"]}


def test_a_plan_resolves(env):
    r = lp.resolve_plan(LAYERNORM, LAYERNORM_KERNELS, env)
    assert r["scratch"] == [{"name": "stats", "bytes": 64}]
    first, second = r["launches"]
    assert first["grid"] == [8, 1, 1] and first["block"] == [256, 1, 1] and first["shared"] == 0
    assert first["cluster"] is None
    assert first["args"][3] == {"kind": "f32", "value": 1e-05}
    assert second["grid"] == [32, 1, 1]
    assert second["args"][4] == {"kind": "i64", "value": 8000}


def test_a_plan_follows_the_shapes():
    e = lp.Env()
    for name, shape in (("x", (1000, 1024)), ("ln.weight", (1024,)), ("out", (1000, 1024))):
        e.add_tensor(name, shape)
    r = lp.resolve_plan(LAYERNORM, LAYERNORM_KERNELS, e)
    assert r["scratch"] == [{"name": "stats", "bytes": 8000}]
    assert r["launches"][1]["grid"] == [4000, 1, 1]


def test_env_from_signature():
    e = lp.env_from_signature({
        "inputs": [{"name": "x", "kind": "tensor", "dtype": "float32", "shape": [2, 3]},
                   {"name": "eps", "kind": "scalar", "dtype": "float32", "value": 0.1},
                   {"name": "k", "kind": "scalar", "dtype": "int64", "value": 4}],
        "parameters": [], "outputs": [{"name": "out", "kind": "tensor", "dtype": "float32", "shape": [2]}]})
    assert lp.eval_int("x.numel + k + out.shape[0]", e) == 12
    with pytest.raises(lp.PlanError, match="is a float"):
        lp.eval_int("eps", e)


def launch(**kw):
    base = {"kernel": "k", "grid": [1], "block": [32], "args": []}
    base.update(kw)
    return {"launches": [base]}


@pytest.mark.parametrize("plan,message", [
    (launch(grid=[0]), "grid.x = 0"),
    (launch(block=[2048]), "block.x = 2048"),
    (launch(block=[64, 32]), "1024"),
    (launch(shared_bytes="0 - 4"), "negative"),
    (launch(kernel="nope"), "no extern"),
    (launch(stream=1), 'unknown key "stream"'),
    (launch(grid=[3], cluster=[2]), "multiple of the cluster"),
    (launch(grid=[32], cluster=[32]), "cluster of 32 blocks"),
    (launch(args=["x"]), "1 args given"),
    ({"launches": []}, "non-empty"),
    ({"launches": [launch()["launches"][0]] * 65}, "limit is 64"),
    (dict(launch(), tensor_map=[]), 'unknown key "tensor_map"'),
    (dict(launch(args=["tm"]), tensor_maps=[{"name": "tm", "tensor": "x", "box": [512]}]), "box"),
    (dict(launch(), scratch=[{"name": "x", "bytes": 8}]), "collides"),
    (dict(launch(), scratch=[{"name": "s", "bytes": 0}]), "positive"),
    (dict(launch(), scratch=[{"name": "s", "bytes": 8}, {"name": "s", "bytes": 8}]), "duplicate"),
    (dict(launch(), scratch=[{"name": "s", "bytes": str(17 << 30)}]), "scratch limit"),
    ([], "JSON object"),
])
def test_plan_errors(env, plan, message):
    with pytest.raises(lp.PlanError, match=message):
        lp.resolve_plan(plan, {"k": []}, env)


def test_clusters_and_scalar_dims(env):
    r = lp.resolve_plan(launch(grid="x.shape[0]", block=32, cluster=[2, 1, 1]), {"k": []}, env)
    assert r["launches"][0]["grid"] == [8, 1, 1]
    assert r["launches"][0]["block"] == [32, 1, 1]
    assert r["launches"][0]["cluster"] == [2, 1, 1]


# ---- TMA tensor maps (the evaluator's tensor_map.cc; export_test compares the two) ----

def _sig_env():
    env = lp.Env()
    env.add_tensor("A", (256, 512), "bfloat16")
    env.add_tensor("out", (256, 128), "float32")
    return env


def test_a_tensor_map_takes_its_defaults_from_the_tensor():
    m = lp.resolve_tensor_map({"name": "tmA", "tensor": "A", "box": [64, 128], "swizzle": "128B"}, _sig_env(), {})
    assert m == {"name": "tmA", "tensor": "A", "scratch": False, "target_bytes": 256 * 512 * 2, "dtype": 9,
                 "dims": [512, 256], "byte_strides": [1024], "box": [64, 128], "element_strides": [1, 1],
                 "interleave": 0, "swizzle": 3, "l2_promotion": 0, "oob_fill": 0}


@pytest.mark.parametrize("entry,message", [
    ({"name": "t", "tensor": "A", "box": [64, 512]}, r"box\[1\] = 512 is outside 1..256"),
    ({"name": "t", "tensor": "A", "box": [128, 64], "swizzle": "128B"}, "wider than the 128B swizzle span"),
    ({"name": "t", "tensor": "A", "box": [4, 64]}, "not a multiple of 16 bytes"),
    ({"name": "t", "tensor": "A", "dims": [512, 255], "byte_strides": [1000], "box": [64, 64]},
     r"byte_strides\[0\] = 1000 is not a multiple of 16"),
    ({"name": "t", "tensor": "A", "dims": [512, 257], "box": [64, 64]}, "stay inside the tensor"),
    ({"name": "t", "tensor": "A", "dtype": "float32", "box": [8, 8]}, "is 4 bytes but 'A' is bfloat16"),
    ({"name": "t", "tensor": "s", "box": [8]}, 'give "dtype" and "dims"'),
    ({"name": "t", "tensor": "A", "box": [8, 8], "swizle": "none"}, 'unknown key "swizle"'),
])
def test_each_tensor_map_rule_is_named(entry, message):
    with pytest.raises(lp.PlanError, match=message):
        lp.resolve_tensor_map(entry, _sig_env(), {"s": 4096})


def test_a_tensor_map_argument_needs_a_128_byte_parameter():
    plan = {"tensor_maps": [{"name": "tm", "tensor": "A", "box": [64, 64]}],
            "launches": [{"kernel": "k", "grid": [1], "block": [128], "args": ["tm", "out"]}]}
    r = lp.resolve_plan(plan, {"k": ["bytes128", "b64"]}, _sig_env())
    assert r["launches"][0]["args"][0] == {"kind": "tensor_map", "name": "tm"}
    assert r["tensor_maps"][0]["name"] == "tm"
    with pytest.raises(lp.PlanError, match="CUtensorMap"):
        lp.resolve_plan(plan, {"k": ["b64", "b64"]}, _sig_env())
