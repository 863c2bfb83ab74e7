"""HTML reports (issue 17): what they say, and how they look in a real browser.

The content tests always run: the verdict and reason, the first diverging op with its source line, the SVG
drawing with the diverging node in red, the values per rank (checked against an independent run of the
reference interpreter), the hints; for UNKNOWN the near-miss rule and its failed condition; for VERIFIED the
certificate digest (checked against the certificate file); progress on stderr and its silence under -q / --json;
the module path of a traced op.

The browser test renders one report per verdict in headless Chromium (Debian's ``chromium``) at 1280x900,
measures in the page (a probe script added to a copy of the report) that nothing scrolls horizontally and that
the key elements are visible above the fold, and saves screenshots under build/report-screenshots/.  It is
skipped, saying so, when Chromium is not installed (``make test`` installs it).
"""
from __future__ import annotations

import hashlib
import html as htmlmod
import json
import os
import re
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tvcert.cli import main
from tvcert.engine.verify import verify
from tvcert.interp import run_plan
from tvcert.plan import load_plan
from tvcert.report_html import draw, render_report

ROOT = Path(__file__).resolve().parents[1]
EX = ROOT / "examples"
SHOTS = ROOT / "build" / "report-screenshots"
CASES = {  # verdict -> bundled example
    "VERIFIED": "mlp_tp2",
    "REFUTED": "mlp_tp2_no_allreduce",
    "UNKNOWN": "ring_attention_cp2_shift_backwards",
}


def _report(tmp_path: Path, example: str, *extra: str) -> tuple[str, object]:
    out = tmp_path / f"{example}.html"
    r = CliRunner().invoke(main, ["verify", str(EX / f"{example}.json"), "--report", str(out), *extra])
    assert r.exit_code in (0, 1, 2), r.output
    assert f"report written to {out}" in r.stdout
    return out.read_text(), r


def _by_id(page: str, ident: str) -> str:
    m = re.search(rf"<(\w+)[^>]*\bid='{ident}'[^>]*>(.*?)</\1>", page, re.S)
    assert m, f"no element #{ident}"
    return htmlmod.unescape(re.sub(r"<[^>]+>", "", m.group(2)))


def _self_contained(page: str) -> None:
    assert "<script" not in page.lower()
    assert not re.search(r"<(link|img|iframe|object|embed)\b", page, re.I)
    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.I)
    assert "url(http" not in page and "@import" not in page


# ============================================================================================ content
def test_refuted_report_names_the_op_its_line_and_draws_it(tmp_path):
    page, _ = _report(tmp_path, "mlp_tp2_no_allreduce")
    _self_contained(page)
    assert _by_id(page, "verdict") == "REFUTED"
    assert "'add' producing 'y'" in _by_id(page, "reason")
    assert _by_id(page, "div-op") == "add"
    assert _by_id(page, "src") == "mlp_tp.py:23"
    assert '"name": "y"' in _by_id(page, "plan-entry")
    assert "is a reduction missing before this op?" in _by_id(page, "hints")
    # the drawing: both sides, the diverging node red, its input edge carrying the Partial(sum) fact
    svg = page[page.index("<svg"):page.index("</svg>")]
    assert "logical (single device)" in svg and "parallel: program" in svg
    red = re.findall(r"<g[^>]*class=\"node tvcert_red\">(.*?)</g>", svg, re.S)  # Graphviz or our own layout
    assert len(red) == 1 and "add → y" in htmlmod.unescape(red[0]) and "mlp_tp.py:23" in red[0]
    assert draw.RED in red[0]
    assert "Partial(sum)" in htmlmod.unescape(svg)


def test_refuted_report_values_match_the_interpreter(tmp_path):
    """The per-rank max |diff| shown is the one an independent run of the same seed gives."""
    page, _ = _report(tmp_path, "mlp_tp2_no_allreduce")
    plan = load_plan(EX / "mlp_tp2_no_allreduce.json")
    run = run_plan(plan, seed=0)
    table = page[page.index("<table id='values'"):]
    table = table[:table.index("</table>")]
    rows = re.findall(r"<tr><td class='num'>tp=(\d+)</td>(.*?)</tr>", table, re.S)
    assert [r for r, _ in rows] == ["0", "1"]
    for r, row in rows:
        local = run.parallel.values["tp"][(int(r),)]["y"]
        want = float(np.max(np.abs(local - run.logical["y"])))
        shown = float(re.findall(r"<b class='red'>([^<]+)</b>", row)[0])
        assert want > 0 and abs(shown - want) <= 1e-5 * max(1.0, want)
        assert f"{local.flat[0]:.6g}" in row
    # the full values behind a fold: every entry of rank 0's local y
    fold = page[page.index("<details><summary>rank tp=0"):]
    first = htmlmod.unescape(re.search(r"<pre>(.*?)</pre>", fold[:fold.index("</details>")], re.S).group(1))
    assert first.startswith("parallel y on rank tp=0 [4, 8]:")
    nums = [float(x) for x in re.findall(r"-?\d+\.\d+(?:e[-+]?\d+)?", first.split(":", 1)[1])]
    np.testing.assert_allclose(nums, run.parallel.values["tp"][(0,)]["y"].ravel(), rtol=1e-7, atol=1e-8)


def test_unknown_report_names_the_near_miss_rule_and_condition(tmp_path):
    page, _ = _report(tmp_path, "ring_attention_cp2_shift_backwards")
    _self_contained(page)
    assert _by_id(page, "verdict") == "UNKNOWN"
    assert "not a success" in _by_id(page, "reason")
    assert _by_id(page, "near-rule") == "ring_attention_online_softmax"
    assert "shift=-1" in _by_id(page, "failed-condition")
    assert _by_id(page, "src") == "ring.py:30"
    assert "<svg" in page and draw.AMBER in page and 'class="node tvcert_amber"' in page


def test_verified_report_shows_rules_and_the_certificate_digest(tmp_path):
    cert = tmp_path / "c.json"
    page, _ = _report(tmp_path, "mlp_tp2", "--emit-cert", str(cert))
    _self_contained(page)
    assert _by_id(page, "verdict") == "VERIFIED"
    assert _by_id(page, "digest") == "sha256:" + hashlib.sha256(cert.read_bytes()).hexdigest()
    rules = _by_id(page, "rules")
    assert "matmul_row_parallel" in rules and "TVCert.Matmul.matmul_row_parallel" in rules
    assert "NOT IN MANIFEST" not in rules


def test_drawing_without_graphviz_is_our_own_svg(tmp_path, monkeypatch):
    monkeypatch.setattr(draw.shutil, "which", lambda name: None)
    res = verify(load_plan(EX / "mlp_tp2_no_allreduce.json"))
    page = render_report(res)
    assert "built-in layout (Graphviz dot not found)" in page
    svg = page[page.index("<svg"):page.index("</svg>")]
    assert 'viewBox="0 0 ' in svg and f'stroke="{draw.RED}"' in svg and "add → y" in svg
    assert 'class="node tvcert_red"' in svg


def test_report_is_written_atomically(tmp_path):
    out = tmp_path / "r.html"
    out.write_text("old")
    r = CliRunner().invoke(main, ["verify", str(EX / "mlp_tp2.json"), "-q", "--report", str(out)])
    assert r.exit_code == 0
    assert out.read_text().startswith("<!doctype html>")
    assert [p.name for p in tmp_path.iterdir()] == ["r.html"]  # no temp file left behind


def test_progress_on_stderr_silent_with_q_and_json(tmp_path):
    plan = str(EX / "mlp_tp2_no_allreduce.json")
    r = CliRunner().invoke(main, ["verify", plan])
    assert "[tvcert] loading" in r.stderr and "[tvcert] no proof; searching for a counterexample" in r.stderr
    assert "[tvcert]" not in r.stdout
    r = CliRunner().invoke(main, ["verify", plan, "-q"])
    assert r.stderr == "" and "REFUTED" in r.stdout
    r = CliRunner().invoke(main, ["verify", plan, "--json", "--report", str(tmp_path / "r.html")])
    assert r.stderr == "" and json.loads(r.stdout)["report"] == str(tmp_path / "r.html")


SPEC = '''
import torch


class Down(torch.nn.Module):
    def forward(self, h, w):
        return h @ w


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.down_proj = Down()

    def forward(self, x, w1, w2):
        return self.down_proj(torch.tanh(x @ w1), w2)


class Head(torch.nn.Module):
    def forward(self, y):
        return (y ** 2).sum()


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.mlp = Mlp()
        self.head = Head()

    def forward(self, x, w1, w2):
        return self.head(self.mlp(x, w1, w2))


BLOCK = Block()


def logical(x, w1, w2):
    return BLOCK(x, w1, w2)


def parallel(ctx, x, w1, w2):
    return BLOCK(x, w1, w2)           # BUG: the row-parallel down_proj output is never all-reduced


def tvcert_trace():
    return dict(logical=logical, parallel=parallel, mesh={"tp": 2}, name="module_mlp",
                inputs={"x": {"shape": [2, 4]}, "w1": {"shape": [4, 8], "placement": {"tp": "Shard(1)"}},
                        "w2": {"shape": [8, 4], "placement": {"tp": "Shard(0)"}}})
'''


def test_traced_report_has_module_path_and_progress(tmp_path):
    pytest.importorskip("torch")
    spec = tmp_path / "module_mlp.py"
    spec.write_text(SPEC)
    out = tmp_path / "t.html"
    r = CliRunner().invoke(main, ["trace", str(spec), "--verify", "--report", str(out)])
    assert r.exit_code == 1, r.output
    # off a terminal a progress line is written at most once a second: a quick rank's line may give way to the next
    assert re.search(r"\[tvcert\] (tracing rank [12]/2|checking the 2 ranks)", r.stderr), r.stderr
    assert "[tvcert] verifying" in r.stderr
    page = out.read_text()
    assert _by_id(page, "verdict") == "REFUTED"
    assert _by_id(page, "module") == "head"  # the square of the partial sum, in Head.forward
    assert _by_id(page, "src").startswith("module_mlp.py:")
    lines = SPEC.splitlines()
    assert "** 2" in lines[int(_by_id(page, "src").split(":")[1]) - 1]
    svg = htmlmod.unescape(page[page.index("<svg"):page.index("</svg>")])
    assert "mlp.down_proj" in svg  # the matmul drawn above it, with its module
    assert "traced from" in page
    r = CliRunner().invoke(main, ["trace", str(spec), "--verify", "-q", "--report", str(out)])
    assert r.stderr == ""
    r = CliRunner().invoke(main, ["trace", str(spec), "--report", str(out)])
    assert r.exit_code == 3 and "--report needs --verify" in r.output  # a usage error is bad input
    out2 = tmp_path / "v.html"
    r = CliRunner().invoke(main, ["verify", "--torch", str(spec), "-q", "--report", str(out2)])
    assert r.exit_code == 1 and r.stderr == ""
    page = out2.read_text()
    assert _by_id(page, "module") == "head" and "traced from" in page


def test_unwritable_report_is_bad_input(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = CliRunner().invoke(main, ["verify", str(EX / "mlp_tp2.json"), "-q", "--report", str(blocker / "r.html")])
    assert r.exit_code == 3 and "Traceback" not in r.output
    assert "--report" in r.stderr and "r.html" in r.stderr and "not a directory" in r.stderr


# ============================================================================================ browser
PROBE = """<script>
(function () {
  function box(el) { if (!el) return null; var r = el.getBoundingClientRect();
    return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, width: r.width, height: r.height}; }
  var keys = %s, out = {scrollWidth: document.documentElement.scrollWidth,
    clientWidth: document.documentElement.clientWidth, innerWidth: window.innerWidth,
    innerHeight: window.innerHeight, boxes: {}};
  keys.forEach(function (k) { out.boxes[k] = box(document.querySelector(k)); });
  var widest = 0; document.querySelectorAll('main *').forEach(function (e) {
    var r = e.getBoundingClientRect(); if (r.width > 0 && r.right > widest) widest = r.right; });
  out.widestRight = widest;
  var pre = document.createElement('pre'); pre.id = 'tvcert-probe';
  pre.textContent = JSON.stringify(out); document.body.appendChild(pre);
})();
</script>"""

ABOVE_FOLD = {  # what a person must see without scrolling, per verdict
    "REFUTED": ["#verdict", "#reason", "#div-op", "#src", "#hints", "svg.graph", "svg.graph g.node.tvcert_red"],
    "UNKNOWN": ["#verdict", "#reason", "#div-op", "#src", "#near-rule", "#failed-condition", "svg.graph"],
    "VERIFIED": ["#verdict", "#reason", "#proved", "#digest"],
}


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        p = shutil.which(name)
        if p:
            return p
    return None


def _browser(exe: str, page: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           "--disable-extensions", f"--user-data-dir={page.parent / '.chromium-profile'}", "--window-size=1280,900",
           *args, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=90, env={**os.environ, "HOME": str(page.parent)})


def _png_size(p: Path) -> tuple[int, int]:
    head = p.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", head[16:24])


NO_CHROMIUM = ("headless Chromium not installed (apt-get install -y chromium; `make test` installs it): browser "
               "rendering not checked")


def _in_browser(tmp_path: Path, page: str, name: str, keys: list[str], top_only=("svg.graph", "#proved")) -> dict:
    """Screenshot ``page`` at 1280x900 into build/report-screenshots/NAME.png, measure it with the probe, and
    check: no horizontal scrolling, every key element visible, inside the width and above the fold (wholly, or
    for the large ones in ``top_only`` starting above it)."""
    exe = _chromium()
    SHOTS.mkdir(parents=True, exist_ok=True)
    plain = tmp_path / f"{name}.html"
    plain.write_text(page)
    shot = SHOTS / f"{name}.png"
    r = _browser(exe, plain, f"--screenshot={shot}")
    assert r.returncode == 0 and shot.exists(), r.stderr[-2000:]
    assert _png_size(shot) == (1280, 900)
    probed = tmp_path / f"{name}_probe.html"
    probed.write_text(page.replace("</body>", PROBE % json.dumps(keys) + "</body>"))
    r = _browser(exe, probed, "--virtual-time-budget=3000", "--dump-dom")
    m = re.search(r"<pre id=\"tvcert-probe\">(.*?)</pre>", r.stdout, re.S)
    assert m, (r.stdout[-1500:], r.stderr[-1500:])
    got = json.loads(htmlmod.unescape(m.group(1)))
    (SHOTS / f"{name}_metrics.json").write_text(json.dumps(got, indent=1))
    print(f"\n{name}: screenshot {shot}; scrollWidth {got['scrollWidth']} (viewport {got['innerWidth']}x"
          f"{got['innerHeight']}); " + ", ".join(f"{k} top={b['top']:.0f} bottom={b['bottom']:.0f}"
                                                 for k, b in got["boxes"].items() if b))
    assert got["innerWidth"] == 1280
    fold = min(900, got["innerHeight"])  # the visible height of a 1280x900 window (headless: its inner height)
    assert got["scrollWidth"] <= 1280, f"horizontal scrolling: the page is {got['scrollWidth']} px wide"
    assert got["widestRight"] <= 1280 + 0.5
    for key, b in got["boxes"].items():
        assert b is not None, f"{key} is not in the page"
        assert b["width"] > 0 and b["height"] > 0, f"{key} is not visible"
        assert b["left"] >= 0 and b["right"] <= 1280, f"{key} is cut off horizontally: {b}"
        assert b["top"] >= 0 and b["top"] < fold, f"{key} is below the fold ({fold} px): {b}"
        if key not in top_only:  # small elements: wholly above the fold
            assert b["bottom"] <= fold, f"{key} is cut by the fold ({fold} px): {b}"
    return got


@pytest.mark.skipif(_chromium() is None, reason=NO_CHROMIUM)
@pytest.mark.parametrize("verdict", list(CASES))
def test_report_in_headless_chromium(tmp_path, verdict):
    page, _ = _report(tmp_path, CASES[verdict])
    _in_browser(tmp_path, page, f"{verdict.lower()}_{CASES[verdict]}", ABOVE_FOLD[verdict])


# ============================================================================================ Hugging Face
def test_hf_llama_doubled_all_reduce_report(tmp_path):
    """The issue's case: transformers' own TP plan for a tiny Llama plus an extra ``all_reduce`` on the MLP (the
    down_proj output is reduced twice).  The report names the residual add of modeling_llama.py and its module,
    says why (a reduction applied twice), draws it, and shows it all above the fold in Chromium."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "hf.html"
    r = CliRunner().invoke(main, ["trace", str(EX / "torch" / "hf_llama_tp.py"), "--set", "layers=1", "--set",
                                  'tp_plan={"model.layers.*.mlp": "all_reduce"}', "--verify", "--report", str(out)])
    assert r.exit_code == 1, r.output[-3000:]
    assert re.search(r"\[tvcert\] (tracing rank [12]/2|checking the 2 ranks)", r.stderr), r.stderr  # throttled progress
    page = out.read_text()
    _self_contained(page)
    assert _by_id(page, "verdict") == "REFUTED"
    src = _by_id(page, "src")
    assert src.startswith("modeling_llama.py:"), src
    llama = Path(transformers.__file__).parent / "models" / "llama" / "modeling_llama.py"
    line = llama.read_text().splitlines()[int(src.split(":")[1]) - 1]
    assert "residual" in line and "+" in line, line  # the residual add after the MLP
    assert _by_id(page, "module") == "model.layers.0"
    hint = _by_id(page, "hints")
    assert "applied twice" in hint and "model.layers.0.mlp" in hint
    svg = htmlmod.unescape(page[page.index("<svg"):page.index("</svg>")])
    assert svg.count("all_reduce →") >= 2 and "model.layers.0.mlp" in svg
    if _chromium() is not None:
        _in_browser(tmp_path, page, "refuted_hf_llama_doubled_all_reduce",
                    ["#verdict", "#reason", "#div-op", "#src", "#module", "#hints", "svg.graph",
                     "svg.graph g.node.tvcert_red"], top_only=("svg.graph", "svg.graph g.node.tvcert_red"))
    else:
        print(NO_CHROMIUM)


def test_refutation_seen_only_at_the_read_back_points_at_the_output(tmp_path):
    """When no op diverges before the read-back (the localizer found none), the report points at the first
    differing output's tensor and the op producing it, and keeps the hints the terminal printed."""
    res = verify(load_plan(EX / "mlp_tp2_no_allreduce.json"))
    res.counterexample["first_divergence"] = None
    page = render_report(res, hints=["hint: gradient gw2 is read back as Replicate but its local values differ"])
    assert "Where it shows" in page and _by_id(page, "div-op") == "loss"
    assert "gradient gw2 is read back as Replicate" in _by_id(page, "hints")
    assert "<svg" in page and draw.RED in page
