"""How near the hardware's limit a candidate runs: the work per inference read from its graph (MACs by operator and
precision, bytes of weights and activations), this machine's limits measured at a thread count (each runtime's
large-GEMM rate per precision, memory bandwidth; cached), and the roofline that sets one against the other."""

from edgefleet.converter.roofline.candidates import Artifact, effective_hint, judge, rooflines, work_of
from edgefleet.converter.roofline.limits import LimitsMeter, MachineLimits, machine_limits, remember
from edgefleet.converter.roofline.roofline import Roofline, roofline
from edgefleet.converter.roofline.work import Work, onnx_work, openvino_work

__all__ = [
    "Artifact",
    "LimitsMeter",
    "MachineLimits",
    "Roofline",
    "Work",
    "effective_hint",
    "judge",
    "machine_limits",
    "onnx_work",
    "openvino_work",
    "remember",
    "roofline",
    "rooflines",
    "work_of",
]
