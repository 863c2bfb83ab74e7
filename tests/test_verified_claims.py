"""The VERIFIED text names what each output's placement claims (H52): a Partial(sum) gradient is not a plain "ok"."""
import json

from click.testing import CliRunner

from tvcert.cli import main


def _plan(out_placement: dict) -> dict:
    """x Shard(0) over tp; logical s = sum(x); each tp rank sums its block (and, for Replicate, all-reduces)."""
    nodes = [{"name": "p", "op": "sum", "inputs": ["x"], "attrs": {"dims": [0]}}]
    if out_placement["tp"] == "Replicate":
        nodes.append({"name": "s", "op": "all_reduce", "inputs": ["p"], "attrs": {"axis": "tp", "reduce": "sum"}})
    return {"tvcert_plan": 1, "name": "partial_sum", "dims": {"n": 4, "tp": 2}, "mesh": {"tp": "tp"},
            "logical": {"inputs": [{"name": "x", "shape": ["n"], "dtype": "float"}],
                        "nodes": [{"name": "s", "op": "sum", "inputs": ["x"], "attrs": {"dims": [0]}}], "outputs": ["s"]},
            "parallel": [{"name": "tp", "inputs": [{"name": "x", "shape": ["n/tp"], "dtype": "float"}], "nodes": nodes,
                          "outputs": [nodes[-1]["name"]]}],
            "inputs": {"x": {"local": "x", "placement": {"tp": "Shard(0)"}}},
            "outputs": {"s": {"local": nodes[-1]["name"], "placement": out_placement}}}


def _verify(tmp_path, plan, *extra):
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(plan))
    return CliRunner().invoke(main, ["verify", str(f), "-q", *extra])


def test_verified_text_names_a_partial_sum_claim(tmp_path):
    r = _verify(tmp_path, _plan({"tp": "Partial(sum)"}))
    assert r.exit_code == 0, r.output
    assert "ok  s  Partial(sum) over tp: the sum over tp ranks equals the logical value" in r.output, r.output
    out = json.loads(_verify(tmp_path, _plan({"tp": "Partial(sum)"}), "--json").output)
    assert out["outputs"][0]["placement"] == {"tp": "Partial(sum)"}


def test_verified_text_names_a_replicated_claim(tmp_path):
    r = _verify(tmp_path, _plan({"tp": "Replicate"}))
    assert r.exit_code == 0, r.output
    assert "ok  s  Replicate: every rank holds the logical value" in r.output, r.output
    assert "Partial" not in r.output


def test_html_report_names_the_claim(tmp_path):
    r = _verify(tmp_path, _plan({"tp": "Partial(sum)"}), "--report", str(tmp_path / "r.html"))
    assert r.exit_code == 0, r.output
    assert "Partial(sum) over tp: the sum over tp ranks equals the logical value" in (tmp_path / "r.html").read_text()
