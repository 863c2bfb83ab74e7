"""Rule conformance harness: for every rule id of the kernel, random instances that pass its Python side
conditions, checked on every rank against the reference semantics of the ops (``python -m tvcert.conform``)."""
