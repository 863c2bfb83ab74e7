"""Soundness evidence: differential fuzzing of the verifier against the exact interpreter,
and hostile-input fuzzing of the plan / certificate front doors.

``python -m tvcert.fuzz --pairs N --seed S`` (or ``tvcert fuzz``) runs the differential
fuzzer; see :mod:`tvcert.fuzz.runner`.  Modules: :mod:`.gen` (program generator),
:mod:`.mutate` (mutation operators), :mod:`.oracle` (exact interpreter oracle),
:mod:`.runner` (the measuring loop, minimizer, certificate round trip), :mod:`.hostile`
(malformed inputs through the CLI).
"""
