"""Op kinds: importing this package registers every op in ``REGISTRY``."""
from . import elementwise, linalg, reduce, layout, indexing, nn, collectives, loop  # noqa: F401
from .base import REGISTRY, Ctx, OpSpec, ShapeError, AttrError, get_op, resolve_attrs, concrete_attrs  # noqa: F401
