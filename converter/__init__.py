"""The host-side converter: ONNX model in, one signed bundle per hardware profile out.

Never imported by the agent (a test proves it).
"""
