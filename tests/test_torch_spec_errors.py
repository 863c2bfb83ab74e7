"""`tvcert trace SPEC` / `tvcert verify --torch SPEC` on a spec that is itself broken: exit 3 with one line that
names the file and the problem -- never a traceback, never 0 (VERIFIED), 1 (REFUTED) or 2 (UNKNOWN)."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from click.testing import CliRunner  # noqa: E402

from tvcert.cli import main  # noqa: E402

EX = Path(__file__).resolve().parents[1] / "examples" / "torch"

GOOD = (EX / "megatron_mlp.py").read_text()

SPECS = {
    "syntax": ("def tvcert_trace(:\n    pass\n", "syntax error"),
    "missing_package": ("import no_such_package_tvcert_xyz\n", "no_such_package_tvcert_xyz"),
    "exit_at_import": ("import sys\nsys.exit(0)\n", "sys.exit(0)"),
    "exit_in_function": ("import sys\ndef tvcert_trace():\n    sys.exit(1)\n", "sys.exit(1)"),
    "raises_at_import": ("x = 1\nraise RuntimeError('boom at import')\n", "boom at import"),
    "raises_in_function": ("def tvcert_trace():\n    return {}['nope']\n", "KeyError"),
    "no_function": ("X = 1\n", "defines no tvcert_trace()"),
    "returns_nonsense": ("def tvcert_trace():\n    return 42\n", "returned int"),
    "bad_trace_argument": ("def tvcert_trace():\n    return dict(logical=None, parallel=None, inputs={}, mesh={'tp': 2},"
                           " colour='red')\n", "colour"),
    "exit_in_traced_code": (GOOD.replace("def mlp(x, w1, b1, w2, b2, target):\n",
                                         "def mlp(x, w1, b1, w2, b2, target):\n    import sys; sys.exit(0)\n"),
                            "sys.exit(0)"),
}


def _one_error_line(r, name: str, needle: str):
    assert r.exit_code == 3, (r.exit_code, r.output)
    assert "Traceback" not in r.output
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1, r.output
    assert lines[0].startswith("error: ") and f"{name}.py" in lines[0] and needle in lines[0], lines[0]


@pytest.mark.parametrize("case", sorted(SPECS))
@pytest.mark.parametrize("cmd", ["trace", "verify"])
def test_broken_spec_exits_3_with_one_line(tmp_path, case, cmd):
    text, needle = SPECS[case]
    spec = tmp_path / f"{case}.py"
    spec.write_text(text)
    args = ["trace", str(spec), "--verify"] if cmd == "trace" else ["verify", "--torch", str(spec)]
    r = CliRunner().invoke(main, args)
    _one_error_line(r, case, needle)


@pytest.mark.parametrize("cmd", ["trace", "verify"])
def test_wrong_set_key_names_the_accepted_ones(cmd):
    spec = str(EX / "megatron_mlp.py")
    args = ["trace", spec, "--verify"] if cmd == "trace" else ["verify", "--torch", spec]
    r = CliRunner().invoke(main, args + ["--set", "bgu=no_allreduce"])
    _one_error_line(r, "megatron_mlp", "bgu")
    assert "takes bug" in r.output
    r = CliRunner().invoke(main, args + ["--set", "novalue"])
    assert r.exit_code == 3 and "KEY=VALUE" in r.output and "Traceback" not in r.output


def test_missing_file_and_json_output(tmp_path):
    r = CliRunner().invoke(main, ["trace", str(tmp_path / "nope.py"), "--verify"])
    assert r.exit_code == 3 and "no such file" in r.output
    bad = tmp_path / "syn.py"
    bad.write_text("def (:\n")
    r = CliRunner().invoke(main, ["trace", str(bad), "--verify", "--json"])
    assert r.exit_code == 3
    obj = json.loads(r.output)
    assert obj["verdict"] == "BAD_INPUT" and "syn.py:1" in obj["reason"]


def test_a_spec_that_extends_sys_path_keeps_it(tmp_path):
    """The spec's own sys.path entries stay (the CLI removes only the entry it added, by identity), and a
    sibling module imported lazily inside the spec function is found."""
    lib = tmp_path / "mylib"
    lib.mkdir()
    (lib / "tvcert_helper_mod_xyz.py").write_text("VALUE = 'ok'\n")
    (tmp_path / "sibling_mod_xyz.py").write_text(GOOD)
    spec = tmp_path / "extends_path.py"
    spec.write_text(
        "import os, sys\n"
        f"sys.path.insert(0, {str(lib)!r})\n"
        "import tvcert_helper_mod_xyz\n"
        "def tvcert_trace():\n"
        "    import sibling_mod_xyz\n"  # lazy import of a sibling module, at call time
        "    return sibling_mod_xyz.tvcert_trace()\n")
    before = list(sys.path)
    try:
        os.environ["TVCERT_SPEC_INPROCESS"] = "1"  # in-process tracing (the default runs the spec in a child)
        r = CliRunner().invoke(main, ["trace", str(spec), "--verify"])
        assert r.exit_code == 0, r.output
        assert str(lib) in sys.path  # the spec's entry is kept
        assert sys.path.count(str(tmp_path)) == before.count(str(tmp_path))  # ours is gone
        del os.environ["TVCERT_SPEC_INPROCESS"]
        for m in ("tvcert_helper_mod_xyz", "sibling_mod_xyz", "extends_path"):
            sys.modules.pop(m, None)
        sys.path.remove(str(lib))
        r = CliRunner().invoke(main, ["trace", str(spec), "--verify"])  # in the child: the same verdict, and the
        assert r.exit_code == 0, r.output  # spec's sys.path edits stay in the child
        assert str(lib) not in sys.path
    finally:
        os.environ.pop("TVCERT_SPEC_INPROCESS", None)
        while str(lib) in sys.path:
            sys.path.remove(str(lib))
        for m in ("tvcert_helper_mod_xyz", "sibling_mod_xyz", "extends_path"):
            sys.modules.pop(m, None)


def test_a_good_spec_still_gives_its_verdict():
    """The negative control: the same machinery passes verdicts through (0 VERIFIED, 1 REFUTED)."""
    spec = str(EX / "megatron_mlp.py")
    assert CliRunner().invoke(main, ["verify", "--torch", spec, "-q"]).exit_code == 0
    assert CliRunner().invoke(main, ["verify", "--torch", spec, "--set", "bug=no_allreduce", "-q"]).exit_code == 1
