"""Who runs when on this device: dynamic batching of concurrent requests (`Batcher`, `batch_support`,
`BatchingConfig`), and the scheduler's account of each slot's queue and compute time (`SlotTimer`, shaped like the core
message `SlotTiming`)."""

from edgefleet.agent.schedule.batcher import Batcher, BatchingConfig, BatchSupport, batch_support
from edgefleet.agent.schedule.timing import SlotTimer, Summary, TimingWindow

__all__ = ["BatchSupport", "Batcher", "BatchingConfig", "SlotTimer", "Summary", "TimingWindow", "batch_support"]
