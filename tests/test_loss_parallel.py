"""torchtitan's loss parallel (examples/vocab_parallel_loss.json): random edits of the parallel program
are never wrongly VERIFIED.  The three loss patterns are tried at many ops (one of them even where every
input already has a fact), so a near miss that slips through a premise check would show up here."""
from __future__ import annotations

import copy
import json
import random
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from soundness_check import assert_not_wrongly_verified
from tvcert.engine.verify import verify
from tvcert.fuzz.ring import edit_body
from tvcert.plan import load_plan

EX = Path(__file__).resolve().parents[1] / "examples"
RAW = json.loads((EX / "vocab_parallel_loss.json").read_text())


def test_the_unedited_loss_verifies():
    res = verify(load_plan(copy.deepcopy(RAW)), refute=False)
    assert res.verdict == "VERIFIED", res.reasons
    used = {r for s in res.prop.steps for r in s.rules}
    assert {"vocab_parallel_log_softmax", "vocab_parallel_nll_loss", "vocab_parallel_nll_backward"} <= used


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.integers(0, 10**9), st.integers(1, 3))
def test_edited_loss_parallel_is_never_wrongly_verified(seed, edits):
    rng = random.Random(seed)
    bad = copy.deepcopy(RAW)
    prog = bad["parallel"][0]
    body = {"inputs": [i["name"] for i in prog["inputs"]], "nodes": prog["nodes"], "outputs": prog["outputs"]}
    what = []
    for _ in range(edits):
        try:
            what.append(edit_body(body, rng))
        except IndexError:  # a ppermute edit: this program has none
            continue
    prog["outputs"] = body["outputs"]
    assert_not_wrongly_verified(bad, what)
