"""Choosing the execution provider by measurement: the policy (a pure function), trials, the time-bounded worker
process, the decision cache.
"""
