"""Judging outputs: per-output golden rules, task metrics, SQNR slices, detections and drift statistics."""
