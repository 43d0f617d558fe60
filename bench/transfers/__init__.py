"""The parts of bench/transfer.py: the trials' flow (publisher, device process, raw baseline), the device process
itself (device.py, run as a script, as on another machine) and the deltas between versions on real models."""
