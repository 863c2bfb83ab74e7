"""HTML reports of verification results (:func:`render_report`): one self-contained file, no network."""
from .render import render_report

__all__ = ["render_report"]
