"""Who runs when on this device: the compute gate that orders steps by class (`ComputeGate`: real-time, interactive,
batch), dynamic batching of concurrent requests (`Batcher`, `batch_support`, `BatchingConfig`), and the scheduler's
account of each slot's queue and compute time (`SlotTimer`, shaped like the core message `SlotTiming`)."""

from edgefleet.agent.schedule.batcher import Batcher, BatchingConfig, BatchSupport, batch_support
from edgefleet.agent.schedule.gate import CLASSES, ComputeGate, SlotClass
from edgefleet.agent.schedule.timing import SlotTimer, Summary, TimingWindow

__all__ = [
    "CLASSES",
    "BatchSupport",
    "Batcher",
    "BatchingConfig",
    "ComputeGate",
    "SlotClass",
    "SlotTimer",
    "Summary",
    "TimingWindow",
    "batch_support",
]
