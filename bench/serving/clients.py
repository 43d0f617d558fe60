"""Clients for bench/serve.py: an OIP binary request, and a minimal keep-alive HTTP/1.1 client over a socket."""

from __future__ import annotations

import json
import socket

import numpy as np

OIP_TYPES = {"float32": "FP32", "float16": "FP16", "float64": "FP64", "int64": "INT64", "int32": "INT32",
             "uint8": "UINT8", "int8": "INT8", "bool": "BOOL"}  # fmt: skip


def oip_binary(model: str, feeds: dict[str, np.ndarray]) -> tuple[str, bytes, dict[str, str]]:
    """(path, body, headers) of an Open Inference Protocol request with binary inputs and binary outputs."""
    blobs = [np.ascontiguousarray(array).tobytes() for array in feeds.values()]
    inputs = [
        {"name": name, "shape": list(array.shape), "datatype": OIP_TYPES[str(array.dtype)],
         "parameters": {"binary_data_size": len(blob)}}
        for (name, array), blob in zip(feeds.items(), blobs, strict=True)
    ]  # fmt: skip
    header = json.dumps({"inputs": inputs, "parameters": {"binary_data_output": True}}).encode()
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(header))}
    return f"/v2/models/{model}/infer", b"".join([header, *blobs]), headers


class MinimalClient:
    """One keep-alive connection, requests written in one send, answers read by Content-Length."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.reader = self.sock.makefile("rb")

    def post(self, path: str, body: bytes, headers: dict[str, str]) -> bytes:
        lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)
        length, status = 0, self.reader.readline()
        while (line := self.reader.readline()) != b"\r\n":
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        answer = self.reader.read(length)
        if not status.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(f"{status!r}: {answer[:200]!r}")
        return answer

    def close(self) -> None:
        self.reader.close()
        self.sock.close()
