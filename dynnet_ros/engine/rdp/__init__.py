"""RDP: sound symbolic rank/dimension propagation for ONNX models (SoD² §3).

``analyze(model_or_path, input_shapes=None)`` returns an :class:`AnalysisResult`
whose ``to_json()`` follows the JSON described in docs/rdp.md.  Depends only on onnx+numpy.
"""
from .analyze import analyze
from .expr import Expr, eval_str, parse
from .fixpoint import RDPWarning, TransferError
from .lattice import TensorInfo
from .regions import Region
from .registry import CATEGORIES, REGISTRY
from .result import AnalysisResult, SymbolInfo

__all__ = ["analyze", "AnalysisResult", "SymbolInfo", "TensorInfo", "Region", "Expr", "parse", "eval_str",
           "RDPWarning", "TransferError", "REGISTRY", "CATEGORIES"]
