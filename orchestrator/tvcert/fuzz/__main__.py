"""``python -m tvcert.fuzz --pairs N --seed S``: the differential soundness fuzzer."""
from .cli_fuzz import fuzz

if __name__ == "__main__":  # pragma: no cover
    fuzz(prog_name="python -m tvcert.fuzz")
