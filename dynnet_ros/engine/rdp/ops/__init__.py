"""Transfer functions, one module per operator family (importing registers them)."""
from .. import control_flow  # noqa: F401
from . import (  # noqa: F401
    elementwise,
    extra_domains,
    misc,
    nn,
    ort_contrib,
    ort_legacy,
    ort_quant,
    ort_transformer,
    sequence,
    shape_ops,
)
