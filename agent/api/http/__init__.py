"""HTTP/1.1 for the local API: one I/O thread, a bounded pool of workers, strict request heads."""
