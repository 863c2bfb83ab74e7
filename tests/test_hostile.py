"""Hostile input (issue 18): one regression test per class of the issue, and a CI sample of the hostile-input
suite (``make hostile N=10000`` is the full run; bench/fuzz_results.md records one).

``TVCERT_HOSTILE_SUITE`` (default 96) sizes the sample."""
from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tvcert.cli import main

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
SUITE = int(os.environ.get("TVCERT_HOSTILE_SUITE", "96"))


def cli(*args, input=None):
    return CliRunner().invoke(main, [str(a) for a in args], input=input)


def error_line(r) -> str:
    lines = [ln for ln in r.output.splitlines() if ln.startswith(("error:", "Error:"))]
    assert lines, r.output
    return lines[-1]


def plan(name="mlp_tp2") -> dict:
    return json.loads((EX / f"{name}.json").read_text())


@pytest.fixture(scope="module")
def cert_file(tmp_path_factory):
    d = tmp_path_factory.mktemp("cert")
    c = d / "mlp.cert.json"
    r = cli("verify", EX / "mlp_tp2.json", "--emit-cert", c, "-q")
    assert r.exit_code == 0, r.output
    return c


# ------------------------------------------------------------------ files
@pytest.mark.parametrize("cmd", ["verify", "run", "check"])
def test_special_files_are_refused_without_blocking(tmp_path, cmd):
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for p in (fifo, "/dev/zero", "/dev/urandom"):
        t0 = time.monotonic()
        r = cli(cmd, p)
        assert r.exit_code == 3, r.output
        assert "regular file" in error_line(r) and "$" in error_line(r)
        assert time.monotonic() - t0 < 10


def test_check_plan_special_file_and_depth(tmp_path, cert_file):
    r = cli("check", cert_file, "--plan", "/dev/zero")
    assert r.exit_code == 3 and "regular file" in r.output
    deep = tmp_path / "deep.json"
    s = json.dumps(plan())
    i = s.index('"description"')
    deep.write_text(s[:i] + '"zz": ' + "[" * 1_500_000 + "]" * 1_500_000 + ", " + s[i:])
    r = cli("check", cert_file, "--plan", deep)
    assert r.exit_code == 3 and "nested too deeply" in r.output, r.output


def test_size_limit_checked_before_reading(tmp_path, monkeypatch):
    import tvcert.plan as P

    monkeypatch.setattr(P, "MAX_PLAN_BYTES", 1000)
    p = tmp_path / "p.json"
    p.write_text(json.dumps(plan()))
    with pytest.raises(P.PlanError, match="larger than the 1000-byte limit"):
        P.read_json_file(p, "plan", 1000)


def test_stdin_dash_is_read():
    r = cli("verify", "-", "-q", input=(EX / "mlp_tp2.json").read_text())
    assert r.exit_code == 0, r.output


# ------------------------------------------------------------------ literals and names
@pytest.mark.parametrize("where,lit,path", [
    ("dim", "1e999", "$.dims.b"),
    ("dim", "100000000000000000000000000000", "$.dims.b"),
    ("dim", "-9223372036854775809", "$.dims.b"),
    ("attr", "NaN", "$.logical.nodes[0].attrs.k"),
    ("attr", "-Infinity", "$.logical.nodes[0].attrs.k"),
])
def test_out_of_range_literals_exit_3_naming_the_path(tmp_path, where, lit, path):
    d = plan()
    if where == "dim":
        d["dims"]["b"] = "@@"
    else:
        d["logical"]["nodes"][0]["attrs"] = {"k": "@@"}
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d).replace('"@@"', lit))
    r = cli("verify", f, "-q")
    assert r.exit_code == 3, r.output
    assert path in error_line(r)


def test_lone_surrogates_exit_3_naming_the_path(tmp_path, cert_file):
    d = plan()
    d["logical"]["nodes"][0]["name"] = "a\ud800"
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d))
    for args in (["verify", f, "-q"], ["verify", f, "--json"], ["run", f]):
        r = cli(*args)
        assert r.exit_code == 3, r.output
        assert "$.logical.nodes[0].name" in r.output and "surrogate" in r.output
    c = json.loads(cert_file.read_text())
    c["plan"]["content"]["name"] = "\udc00"
    g = tmp_path / "c.json"
    g.write_text(json.dumps(c))
    r = cli("check", g)
    assert r.exit_code == 3 and "$.plan.content.name" in r.output, r.output


def test_big_integer_in_certificate(tmp_path, cert_file):
    c = json.loads(cert_file.read_text())
    c["steps"][0]["node"] = "@@"
    g = tmp_path / "c.json"
    g.write_text(json.dumps(c).replace('"@@"', "1" + "0" * 40))
    r = cli("check", g)
    assert r.exit_code == 3 and "$.steps[0].node" in r.output and "64-bit" in r.output, r.output


def test_certificate_parse_error_names_the_json_path(tmp_path, cert_file):
    text = cert_file.read_text()
    i = text.rindex('"steps"') + 40  # the top level's (the nested size_checks certificates come first)
    g = tmp_path / "c.json"
    g.write_text(text[:i])
    r = cli("check", g)
    assert r.exit_code == 3
    assert "$.steps[" in error_line(r), r.output


def test_deeply_nested_dim_expression(tmp_path):
    d = plan()
    d["logical"]["inputs"][0]["shape"][0] = "-" * 400 + "b"
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d))
    r = cli("verify", f, "-q")
    assert r.exit_code == 3 and "$.logical.inputs[0].shape[0]" in r.output and "nested" in r.output, r.output


def test_messages_do_not_echo_huge_values(tmp_path):
    d = plan()
    d["logical"]["nodes"][0]["op"] = "z" * 5_000_000
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d))
    r = cli("verify", f, "-q")
    assert r.exit_code == 3
    assert len(error_line(r).encode()) < 1024


def test_reshape_shape_expression_evaluating_to_minus_one_is_refused(tmp_path):
    d = plan("heads_ok")
    for g in [d["logical"], *d["parallel"]]:
        for n in g["nodes"]:
            if n["op"] == "reshape":
                n["attrs"]["shape"][2] = "nh-nh-1"
    f = tmp_path / "p.json"
    f.write_text(json.dumps(d))
    r = cli("verify", f, "-q")
    assert r.exit_code == 3 and "evaluates to -1" in r.output, r.output
    assert cli("verify", EX / "heads_ok.json", "-q").exit_code == 0  # the literal shape still verifies


# ------------------------------------------------------------------ exit codes
@pytest.mark.parametrize("args", [
    ["verify", "{ex}", "--bogus"], ["run", "{ex}", "--seed", "abc"], ["verify", "{tmp}"], ["nosuchcommand"],
    ["run", "{ex}", "--dims", "h=0"], ["check", "{ex}", "--solver", "yices"], ["verify"],
])
def test_usage_errors_exit_3(tmp_path, args):
    r = cli(*[a.format(ex=EX / "mlp_tp2.json", tmp=tmp_path) for a in args])
    assert r.exit_code == 3, r.output


def test_plan_with_zero_dim_is_not_written(tmp_path):
    out = tmp_path / "p.json"
    r = cli("plan", "llama3-8b", "--layers", "1", "--dims", "h=0", "-o", out)
    assert r.exit_code == 3 and not out.exists()
    r = cli("plan", "llama3-8b", "--layers", "1", "--tp", "3", "-o", out)  # shards that do not divide
    assert r.exit_code == 3 and not out.exists(), r.output


def test_internal_error_exits_4_traceback_only_under_debug(monkeypatch):
    import tvcert.engine.verify as V

    def boom(*a, **k):
        raise ZeroDivisionError("planted")

    monkeypatch.setattr(V, "_finish", boom)
    r = CliRunner(mix_stderr=False).invoke(main, ["verify", str(EX / "mlp_tp2.json"), "-q"]) \
        if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else CliRunner().invoke(main, ["verify", str(EX / "mlp_tp2.json"), "-q"])
    assert r.exit_code == 4 and "Traceback" not in r.output
    err = getattr(r, "stderr", "") if hasattr(r, "stderr_bytes") and r.stderr_bytes is not None else r.output
    assert "planted" in err
    r = CliRunner().invoke(main, ["--debug", "verify", str(EX / "mlp_tp2.json"), "-q"])
    assert r.exit_code == 4


# ------------------------------------------------------------------ outputs
def test_no_output_path_is_an_input_path(tmp_path):
    p = tmp_path / "p.json"
    p.write_text((EX / "mlp_tp2.json").read_text())
    before = p.read_bytes()
    r = cli("verify", p, "--emit-cert", p, "-q")
    assert r.exit_code == 3 and "never writes over its input" in r.output
    assert p.read_bytes() == before
    r = cli("verify", p, "--emit-cert", tmp_path / "x.json", "--report", tmp_path / "x.json", "-q")
    assert r.exit_code == 3
    r = cli("mutate", p, "--bug", "missing_allreduce_w2", "-o", p)
    assert r.exit_code == 3 and p.read_bytes() == before


@pytest.mark.parametrize("out", ["{p}/x.json", "/proc/tvcert_x.json", "/proc/self/status", "{tmp}"])
@pytest.mark.parametrize("opt", ["--emit-cert", "--report"])
def test_unwritable_output_paths_exit_3_before_verifying(tmp_path, out, opt):
    p = tmp_path / "p.json"
    p.write_text((EX / "mlp_tp2_no_allreduce.json").read_text())  # REFUTED: --emit-cert would not be written
    r = cli("verify", p, opt, out.format(p=p, tmp=tmp_path), "-q")
    assert r.exit_code == 3, r.output
    assert "Traceback" not in r.output


def test_temp_files_removed_on_failure_interrupt_and_after_kill(tmp_path, monkeypatch):
    from tvcert import cli as C

    target = tmp_path / "out.json"

    def leftovers():
        return [q for q in tmp_path.iterdir() if C.TMP_TAG in q.name]

    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda a, b: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(C.WriteError):
        C.write_atomic(target, "x")
    assert not leftovers() and not target.exists()
    monkeypatch.setattr(os, "replace", lambda a, b: os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(SystemExit):
        C.write_atomic(target, "x")
    assert not leftovers() and not target.exists()
    monkeypatch.setattr(os, "replace", real_replace)
    pid = os.fork()  # a writer that dies without cleaning up (as after SIGKILL)
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)
    (tmp_path / f".out.json{C.TMP_TAG}{pid}.abcd").write_text("half")
    C.write_atomic(target, "x")
    assert target.read_text() == "x" and not leftovers()


# ------------------------------------------------------------------ bounded work
def _huge(name: str, tmp_path: Path, run_dims: bool) -> Path:
    d = plan(name)
    d["dims"].update(h=20000, f=40000)
    if run_dims:
        d["run_dims"] = {"b": 4, "h": 8, "f": 16, "tp": 2}
    f = tmp_path / f"{name}{'_rd' if run_dims else ''}.json"
    f.write_text(json.dumps(d))
    return f


def test_counterexample_search_is_bounded_by_the_element_budget(tmp_path):
    f = _huge("mlp_tp2_no_allreduce", tmp_path, run_dims=False)
    t0 = time.monotonic()
    r = cli("verify", f, "--json")
    assert r.exit_code == 2, r.output
    assert time.monotonic() - t0 < 30
    assert any("budget" in x for x in json.loads(r.output)["reasons"])
    r = cli("run", f)  # tvcert run refuses it ...
    assert r.exit_code == 3 and "budget" in r.output
    assert cli("run", f, "--dims", "h=8,f=16").exit_code == 1  # ... unless --dims brings it under
    # small run_dims: the same wrong plan is still refuted, the right one still verified
    assert cli("verify", _huge("mlp_tp2_no_allreduce", tmp_path, run_dims=True), "-q").exit_code == 1
    assert cli("verify", _huge("mlp_tp2", tmp_path, run_dims=True), "-q").exit_code == 0


def test_exact_work_budget_and_time_budget(monkeypatch):
    from tvcert.engine import verify as V
    from tvcert.interp import BudgetExceeded, check_budget
    from tvcert.plan import load_plan

    d = plan("mlp_tp2_no_allreduce")
    d["dims"].update(b=300, h=300, f=300)
    p = load_plan(d)
    check_budget(p, p.run_dims, "float64")  # 300^3 is cheap in float64 ...
    with pytest.raises(BudgetExceeded, match="arithmetic operations"):
        check_budget(p, p.run_dims, "exact")  # ... not with Python rationals
    res = V.verify(p)
    assert res.verdict == "UNKNOWN" and any("budget" in x for x in res.reasons)
    monkeypatch.setattr(V, "REFUTE_SECONDS", 0.0)
    res = V.verify(load_plan(EX / "mlp_tp2_no_allreduce.json"))
    assert res.verdict == "UNKNOWN" and any("time budget" in x for x in res.reasons), res.reasons


def test_smt_budget_gives_unknown_never_proved():
    from tvcert.kernel import smt

    big = "(set-logic QF_NRA)\n" + " " * (smt.SMT_MAX_TEXT + 1) + "(check-sat)\n"
    assert smt.solve_z3(big) == "unknown"
    assert smt.solve_z3("(set-logic QF_NRA)\n(declare-fun x () Real)\n(assert (< x 0.0))\n(check-sat)\n") == "sat"


# ------------------------------------------------------------------ torch specs in a child
@pytest.mark.parametrize("body,limit,expect", [
    ("while True:\n    pass\n", "seconds", "time budget"),
    ("import os\nos._exit(0)\n", None, "spec process exited"),
    ("x = bytearray(50 * 1024 ** 3)\n", None, "MemoryError"),
])
def test_torch_specs_that_loop_exit_or_allocate_are_bad_input(tmp_path, monkeypatch, body, limit, expect):
    pytest.importorskip("torch")
    from tvcert.frontends import cli_trace

    monkeypatch.delenv("TVCERT_SPEC_INPROCESS", raising=False)
    monkeypatch.setattr(cli_trace, "SPEC_SECONDS", 4.0)
    s = tmp_path / "spec.py"
    s.write_text(body)
    t0 = time.monotonic()
    r = cli("verify", "--torch", s, "-q")
    assert r.exit_code == 3, r.output
    assert expect in r.output
    assert time.monotonic() - t0 < 60


# ------------------------------------------------------------------ the suite
def test_hostile_suite_sample():
    from tvcert.fuzz.hostile import run_suite

    res = run_suite(SUITE, seed=1)
    assert len(res.cases) == SUITE
    assert not res.problems, res.table()
    kinds = {c.kind for c in res.cases}
    assert kinds == {"schema", "example_struct", "example_text", "special_file", "literal", "deep", "usage",
                     "output_path"}
    assert sum(c.exit_code == 3 for c in res.cases) > SUITE // 2


def test_suite_catches_a_planted_traceback(monkeypatch):
    """The suite is not vacuous: an exception planted in the loader is reported as a problem."""
    import tvcert.plan as P
    from tvcert.fuzz.hostile import run_suite

    real = P.parse_plan_text

    def broken(text):
        raw = real(text)
        if isinstance(raw, dict) and "dims" in raw:
            raise KeyError("planted")
        return raw

    monkeypatch.setattr(P, "parse_plan_text", broken)
    res = run_suite(8, seed=2)
    assert res.problems
