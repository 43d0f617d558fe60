"""Custom-operator packages as both sides load them, and the renamed model copy onnxruntime-extensions needs."""
