"""edgefleet: take a trained ONNX model to a fleet of edge devices and keep it fast and accurate there."""

__version__ = "0.1.0"
