"""The parts of bench/serve.py: the shared setup (bundles, interleaving, the agent's API in-process), the minimal
clients, the footprint (RSS, first answer in a fresh process), model-quality costs and multi-client throughput."""
