"""The agent's /metrics page: latency histograms and counters, written in the Prometheus and OpenMetrics text
formats.
"""
