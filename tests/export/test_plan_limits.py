"""Issue 31 in export/ks_launch_plan.py: every arithmetic edge of an expression
and every limit on a plan (evaluator/plan/launch_plan.h) is a PlanError, as it
is an invalid_plan in the evaluator; never a crash, a RecursionError or a
value the evaluator's int64 would not hold."""
import json
import pathlib
import re

import pytest

import ks_launch_plan as lp

MIN = "(-9223372036854775807 - 1)"
ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def env():
    e = lp.Env()
    e.add_tensor("x", (8, 1000))
    e.add_scalar("n", 7, False)
    return e


@pytest.mark.parametrize("expr,value", [
    (MIN, -(1 << 63)),
    (MIN + " / 1", -(1 << 63)),
    (MIN + " / -2", 1 << 62),
    (MIN + " % 2", 0),
    ("cdiv(9223372036854775807, 1)", (1 << 63) - 1),
    ("cdiv(9223372036854775807, 2)", 1 << 62),
    ("9223372036854775807", (1 << 63) - 1),
    ("(" * 30 + "1" + ")" * 30, 1),
    ("-" * 30 + "1", 1),
], ids=lambda v: str(v)[:40])
def test_values_at_the_edges(env, expr, value):
    assert lp.eval_int(expr, env) == value


@pytest.mark.parametrize("expr,message", [
    (MIN + " / -1", "integer overflow"),      # the red team's SIGFPE in the evaluator
    (MIN + " % -1", "integer overflow"),      # mathematically 0, but it traps in C++ too
    (MIN + " / (0 - 1)", "integer overflow"),
    ("5 % 0", "division by zero"),
    (MIN + " - 1", "integer overflow"),
    ("9223372036854775807 + 1", "integer overflow"),
    ("-" + MIN, "integer overflow"),
    ("0 - " + MIN, "integer overflow"),
    ("4611686018427387904 * 2", "integer overflow"),
    (MIN + " * -1", "integer overflow"),
    ("max(1, 9223372036854775807 + 1)", "integer overflow"),
    ("min(1, " + MIN + " - 1)", "integer overflow"),
    ("cdiv(9223372036854775807 * 2, 3)", "integer overflow"),
    ("9223372036854775808", "too large"),
    ("-9223372036854775808", "too large"),
    ("9" * 40, "too large"),
    ("(" * 32 + "1" + ")" * 32, "nested deeper than 32"),
    ("(" * 2000 + "1" + ")" * 2000, "nested deeper than"),   # no RecursionError
    ("-" * 32 + "1", "nested deeper than"),
    ("-" * 4000 + "1", "nested deeper than"),
    ("max(" * 40 + "1" + ", 0)" * 40, "nested deeper than"),
    ("1" * 4097, "longer than 4096"),
], ids=lambda v: v if len(v) < 40 else v[:20] + "...")
def test_edges_are_plan_errors(env, expr, message):
    with pytest.raises(lp.PlanError, match=re.escape(message)):
        lp.eval_int(expr, env)


def test_numel_overflow_is_an_error():
    e = lp.Env()
    e.add_tensor("big", (1 << 32, 1 << 32))
    with pytest.raises(lp.PlanError, match="integer overflow"):
        lp.eval_int("big.numel", e)


def plan_text(args=("x", 1), extra="", launches=1):
    one = json.dumps({"kernel": "k", "grid": [1], "block": [32], "args": list(args)})
    return '{"launches": [%s]%s}' % (", ".join([one] * launches), extra)


def resolve(text, kinds=("b64", "b32"), env=None):
    if env is None:
        env = lp.Env()
        env.add_tensor("x", (8, 1000))
    return lp.resolve_plan(lp.parse_plan(text), {"k": list(kinds)}, env)


def test_a_plan_within_the_limits_resolves():
    r = resolve(plan_text())
    assert r["launches"][0]["args"][1] == {"kind": "i32", "value": 1}
    assert len(resolve(plan_text(launches=lp.MAX_LAUNCHES))["launches"]) == lp.MAX_LAUNCHES


def test_the_red_team_plans_are_plan_errors():
    with pytest.raises(lp.PlanError, match="integer overflow"):
        resolve(plan_text(args=("x", MIN + " / -1")))
    with pytest.raises(lp.PlanError, match="integer overflow"):
        resolve(plan_text(args=("x", MIN + " % -1")))
    deep = "[" * 150000 + "]" * 150000
    text = '{"launches": [{"kernel": "k", "grid": [1], "block": [32], "args": ["x", %s]}]}' % deep
    with pytest.raises(lp.PlanError, match="bytes; the limit is"):
        resolve(text)
    with pytest.raises(lp.PlanError, match="deeper than"):  # within the size limit: the depth
        resolve(text.replace(deep, "[" * 20000 + "]" * 20000))
    with pytest.raises(lp.PlanError, match="deeper than"):  # resolve_plan parses text with the limits
        lp.resolve_plan("[" * 30000, {"k": ["b64"]}, lp.Env())


@pytest.mark.parametrize("text,message", [
    (plan_text() + " " * lp.MAX_PLAN_BYTES, "bytes; the limit is"),
    (plan_text(args=("x", json.loads("[" * 6 + "]" * 6))), "deeper than 8"),
    ("{" * 9, "deeper than 8"),
    (plan_text(launches=lp.MAX_LAUNCHES + 1), '"launches" has 65 entries; the limit is 64'),
    (plan_text(args=["x"] + [1] * lp.MAX_ARGS_PER_LAUNCH), '"args" has 129 entries; the limit is 128'),
    (plan_text(extra=', "scratch": [%s]' % ", ".join(['{"name": "s%d", "bytes": 4}' % i for i in range(33)])),
     '"scratch" has 33'),
    (plan_text(extra=', "tensor_maps": [%s]' % ", ".join(["{}"] * 33)), '"tensor_maps" has 33'),
    (plan_text(args=("x", 9223372036854775808)), "too large"),
    (plan_text(args=("x", 18446744073709551615)), "too large"),
    ('{"launches": [{"kernel": "k", "grid": [18446744073709551615], "block": [1], "args": ["x", 1]}]}',
     "too large"),
    (plan_text(args=("x", "NaN")), "unknown name"),
    ('{"launches": NaN}', "not valid JSON"),
    ('{"launches": [', "not valid JSON"),
    (plan_text(args=("x", 1)).replace(", 1]", ", 1e999]"), "number overflow"),   # nlohmann refuses it too
    (plan_text(args=("x", 1)).replace(", 1]", ", -" + "1" * 400 + "]"), "number overflow"),
], ids=lambda v: v if len(v) < 40 else v[:20] + "...")
def test_plan_limits_are_plan_errors(text, message):
    if "deeper" not in message and "bytes" not in message:
        lp.check_plan_text(text)  # the text guard passes; a later rule refuses
    with pytest.raises(lp.PlanError, match=re.escape(message)):
        resolve(text)


def test_strings_do_not_count_as_nesting():
    lp.check_plan_text('{"a": "[[[[[[[[[[[[[[[[\\"[[[[[[[[[[[["}')
    lp.check_plan_text("]" * 100 + "[" * lp.MAX_PLAN_DEPTH)


def test_integers_as_the_evaluator_parses_them():
    # Beyond uint64 the evaluator's JSON parser makes a float: a float parameter takes it.
    r = resolve(plan_text(args=("x", 10 ** 30)).replace(str(10 ** 30), "1" + "0" * 30), kinds=("b64", "f32"))
    assert r["launches"][0]["args"][1] == {"kind": "f32", "value": 1e30}
    with pytest.raises(lp.PlanError, match="float value"):
        resolve(plan_text(args=("x", 10 ** 30)))
    with pytest.raises(lp.PlanError, match="float value"):
        resolve(plan_text(args=("x", 1)).replace(", 1]", ", -9223372036854775809]"))  # below int64: a float
    with pytest.raises(lp.PlanError, match="number overflow"):  # beyond double, and no int-digits limit hit
        resolve(plan_text(args=("x", 1)).replace(", 1]", ", " + "9" * 5000 + "]"), kinds=("b64", "f32"))


def test_the_limits_are_the_evaluators():
    header = (ROOT / "evaluator" / "plan" / "launch_plan.h").read_text()
    want = {"kMaxPlanBytes": lp.MAX_PLAN_BYTES, "kMaxPlanDepth": lp.MAX_PLAN_DEPTH, "kMaxLaunches": lp.MAX_LAUNCHES,
            "kMaxArgsPerLaunch": lp.MAX_ARGS_PER_LAUNCH, "kMaxScratchBuffers": lp.MAX_SCRATCH_BUFFERS,
            "kMaxTensorMaps": lp.MAX_TENSOR_MAPS, "kMaxExprChars": lp.MAX_EXPR_CHARS,
            "kMaxExprDepth": lp.MAX_EXPR_DEPTH}
    for name, value in want.items():
        m = re.search(r"constexpr \w+ %s = ([^;]+);" % name, header)
        assert m, name
        assert eval(m.group(1)) == value, name  # e.g. "64 << 10"
