"""Moving bundle bytes over MQTT: retained blocks or content-addressed chunks, resumable, each verified; the link's cap
and window.

Other rooms use: `open_download` (a resumable, verified fetch of an offered bundle), `resolve_index` (an offer's
chunk list when it travels in pages), `write_index` (which chunks an installed bundle holds, for later deltas),
`LinkPacer` (the device link's cap and report priority) and `TransferError` (transient: retry later).
"""

from edgefleet.agent.transfer.blocks import TransferError
from edgefleet.agent.transfer.chunk_index import write_index
from edgefleet.agent.transfer.chunk_pages import resolve_index
from edgefleet.agent.transfer.chunks import open_download
from edgefleet.agent.transfer.link import LinkPacer

__all__ = ["LinkPacer", "TransferError", "open_download", "resolve_index", "write_index"]
