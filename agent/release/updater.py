"""Fetching, verifying and staging an agent release, then handing over to the launcher; reporting its decisions.

One thread. It wakes on every desired-state change and reconnect, and every few seconds to read the launcher's state:
- The release wanted is the `agent_release` of the signed desired documents in force (the highest counter among the
  slots'). Nothing happens when this agent is that version, when the release failed its health gate here before
  (the launcher never tries it again: a new release id is a new decision), or when the agent was not started by the
  launcher (it says so).
- Before a byte is fetched: the offer's one signature by a delegated RELEASE key over the manifest and the layout
  (a bundle or ops key cannot sign one), the document's exact release, this Python and platform, the agent floor
  (the highest agent version committed here, or this one's) unless the document's `allow_downgrade_to` names the
  release, a possible layout under `max_release_bytes`. A refusal is reported once and not retried.
- The release travels as a bundle does (agent/transfer): resumable content-addressed chunks, each checked against
  its signed name, under the link's cap; chunks a release installed before holds (its unpacked wheels, indexed
  like a bundle's files) are read locally, so a release that changed only the edgefleet wheel fetches only that.
- Unpacked against the signed manifest (every wheel's size and sha256), its environment built offline
  (agent/release/environment.py), the hand-over request is written whole; the launcher stops this agent and starts
  the new one on trial.
- Each decision the launcher records (committed, rolled back and why) is reported once as an event, and the
  latest is in the device's status (`agent_update`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import shutil
import threading
from collections.abc import Callable
from pathlib import Path

from edgefleet import __version__
from edgefleet.agent.install import DesiredState, InstallContext
from edgefleet.agent.release.environment import build_environment
from edgefleet.agent.telemetry import Reporter
from edgefleet.agent.transfer import TransferError, open_download, resolve_index, write_index
from edgefleet.core.durable import atomic_write, fsync_dir
from edgefleet.core.errors import BrokerError, SignatureError
from edgefleet.core.launcher_files import envs_dir, read_json, read_state, write_request
from edgefleet.core.messages import AgentRelease, MessageError, ReleaseOffer, decode
from edgefleet.core.release import (
    ReleaseError,
    ReleaseRefused,
    check_release_ref,
    parse_release_manifest,
    transfer_carrier,
    unpack_release,
    verify_release_offer,
    version_key,
)
from edgefleet.core.transfer.blocks import LayoutError, check_layout

log = logging.getLogger(__name__)

RELEASES_DIR = "agent-releases"
REPORTED_NAME = "reported.json"
POLL_S = 2.0
DEFAULT_MAX_RELEASE_BYTES = 512 * 2**20


class ReleaseUpdater:
    def __init__(
        self,
        ctx: InstallContext,
        desired: DesiredState,
        reporter: Reporter,
        state_dir: Path,
        launcher: Path | None,
        *,
        on_change: Callable[[], None],
        retry_delay_s: float = 10.0,
        max_release_bytes: int = DEFAULT_MAX_RELEASE_BYTES,
    ) -> None:
        self.ctx, self.desired, self.reporter = ctx, desired, reporter
        self.state_dir, self.launcher, self.on_change = state_dir, launcher, on_change
        self.retry_delay_s, self.max_release_bytes = retry_delay_s, max_release_bytes
        self.releases = state_dir / RELEASES_DIR
        self._wake: queue.Queue[None] = queue.Queue()
        self._refused: dict[str, str] = {}  # release id -> why (a permanent refusal is reported once)
        self._handed_over: str | None = None
        self._status: str | None = None
        self._lock = threading.Lock()

    # --- any thread
    def wake(self) -> None:
        self._wake.put(None)

    def status_text(self) -> str | None:
        with self._lock:
            return self._status

    def _set_status(self, text: str | None) -> None:
        with self._lock:
            changed, self._status = text != self._status, text
        if changed:
            self.on_change()

    # --- the thread
    def run(self, stop: threading.Event) -> None:
        """Until `stop`: report the launcher's decisions, and bring the agent to the release the documents name."""
        first = True
        while not stop.is_set():
            if not first:
                with contextlib.suppress(queue.Empty):
                    self._wake.get(timeout=POLL_S)
            first = False
            if stop.is_set():
                return
            try:
                self.report_outcomes()
                self.reconcile()
            except (BrokerError, TransferError, OSError) as err:  # transient: the next wake or poll tries again
                self._set_status(f"agent release not fetched yet: {err}")
                log.warning("agent release: %s (will retry)", err)
                stop.wait(self.retry_delay_s)
            except Exception as err:  # the daemon outlives any bug here
                log.exception("agent release update failed")
                self._set_status(f"agent release update failed: {err}")
                stop.wait(self.retry_delay_s)

    def wanted(self) -> AgentRelease | None:
        """The release the signed documents in force name (the newest decision: the highest counter)."""
        best: tuple[int, AgentRelease] | None = None
        for slot in self.desired.slots():
            doc = self.desired.effective(slot)
            if doc is not None and doc.agent_release is not None and (best is None or doc.counter > best[0]):
                best = (doc.counter, doc.agent_release)
        return best[1] if best else None

    def launcher_state(self) -> dict[str, object]:
        return (read_state(self.launcher) if self.launcher else None) or {}

    def floor(self) -> str:
        """The highest agent version committed here (the launcher's record), or this agent's own if higher."""
        recorded = str(self.launcher_state().get("floor") or "0")
        try:
            return max(__version__, recorded, key=version_key)
        except ValueError:
            return __version__

    def reconcile(self) -> None:
        wanted = self.wanted()
        if wanted is None or wanted.version == __version__ or wanted.release_id == self._handed_over:
            return
        if wanted.release_id in self._refused:
            return
        state = self.launcher_state()
        failed = state.get("failed") or []
        if isinstance(failed, list) and wanted.release_id in failed:
            return  # its rollback was reported (report_outcomes); the status keeps saying why
        if self.launcher is None:
            self._refuse(wanted, "this agent was not started by edgefleet-launcher, which alone can switch it")
            return
        try:
            python = self._stage(wanted)
        except (ReleaseRefused, SignatureError, LayoutError, MessageError) as err:
            self._refuse(wanted, str(err))
            return
        except ReleaseError as err:  # a damaged download or a failed build: fetched and built again later
            raise TransferError(str(err)) from err
        write_request(self.launcher, release_id=wanted.release_id, version=wanted.version, python=str(python))
        self._handed_over = wanted.release_id
        self.reporter.event("agent-release", f"{wanted.release_id} staged; handing over to the launcher")
        self._set_status(f"handing over to {wanted.release_id}")

    def _refuse(self, wanted: AgentRelease, why: str) -> None:
        self._refused[wanted.release_id] = why
        log.warning("agent release %s refused: %s", wanted.release_id, why)
        self.reporter.event("refused", f"agent release {wanted.release_id}: {why}")
        self._set_status(f"refused agent release {wanted.release_id}: {why}")

    def _stage(self, wanted: AgentRelease) -> Path:
        offer = self._fetch_offer(wanted.release_id)
        self.ctx.trust.consider(offer.keyset)
        verify_release_offer(offer, self.ctx.trust.keys("release"))
        manifest = parse_release_manifest(offer.manifest_json)
        check_release_ref(manifest, offer, wanted, self.floor())
        check_layout(offer.transfer, self.max_release_bytes)
        release_dir = self.releases / wanted.release_id
        if not (release_dir / "release.json").exists():
            self._set_status(f"fetching agent release {wanted.release_id}")
            self._download(offer, release_dir)
        return build_environment(release_dir, manifest, envs_dir(self.state_dir))

    def _fetch_offer(self, release_id: str) -> ReleaseOffer:
        inbox: queue.Queue[bytes] = queue.Queue()
        topic = self.ctx.topics.agent_release_offer(release_id)
        self.ctx.conn.subscribe(topic, lambda _t, payload, _r: inbox.put(payload))
        try:
            payload = inbox.get(timeout=self.ctx.offer_timeout_s)
        except queue.Empty:
            wait = self.ctx.offer_timeout_s
            raise BrokerError(f"no offer for agent release {release_id} within {wait:g} s") from None
        finally:
            self.ctx.conn.unsubscribe(topic)
        offer = decode(ReleaseOffer, payload)
        if offer.release_id != release_id:
            raise ReleaseRefused(f"the offer on {release_id}'s topic names release {offer.release_id}")
        return offer

    def _download(self, offer: ReleaseOffer, release_dir: Path) -> None:
        """Fetch (resumable, chunks the installed releases hold read locally), unpack against the signed manifest,
        index its chunks for the next release, then rename into place."""
        self.releases.mkdir(parents=True, exist_ok=True)
        carrier = resolve_index(self.ctx.conn, self.ctx.topics, transfer_carrier(offer),
                                size_limit=self.max_release_bytes, link=self.ctx.link)  # fmt: skip
        verify_release_offer(offer.model_copy(update={"transfer": carrier.transfer}), self.ctx.trust.keys("release"))
        part = self.releases / f"{offer.release_id}.part"
        fetch = open_download(self.ctx.conn, self.ctx.topics, carrier, part, bundles_dir=self.releases,
                              window=self.ctx.block_window, link=self.ctx.link)  # fmt: skip
        path = fetch.run()
        self.reporter.event("agent-release", f"{offer.release_id} fetched: {fetch.summary()}")
        staging = self.releases / f"{offer.release_id}.staging"
        shutil.rmtree(staging, ignore_errors=True)
        try:
            unpack_release(path, staging, offer.manifest_json)
        except ReleaseError:
            for leftover in (part, part.with_name(part.name + ".blocks"), part.with_name(part.name + ".meta")):
                leftover.unlink(missing_ok=True)
            raise
        write_index(staging, path, carrier.transfer)  # which chunks the next release can take from these wheels
        os.replace(staging, release_dir)
        fsync_dir(self.releases)
        for leftover in (part, part.with_name(part.name + ".blocks"), part.with_name(part.name + ".meta")):
            leftover.unlink(missing_ok=True)
        self._prune(keep={offer.release_id})

    def _prune(self, keep: set[str]) -> None:
        """Releases neither wanted now nor committed or previous (the launcher's record) go."""
        state = self.launcher_state()
        for name in ("committed", "previous"):
            entry = state.get(name)
            if isinstance(entry, dict) and isinstance(entry.get("release_id"), str):
                keep.add(entry["release_id"])
        for entry in self.releases.iterdir():
            if entry.is_dir() and entry.name not in keep and not entry.name.endswith(".staging"):
                shutil.rmtree(entry, ignore_errors=True)

    # --- what the launcher decided
    def report_outcomes(self) -> None:
        """Each outcome the launcher recorded since the last one reported: an event, once (the mark is written after
        the event is spooled, so a crash between re-sends it rather than losing it); the latest is the status."""
        outcomes = self.launcher_state().get("outcomes") or []
        if not isinstance(outcomes, list) or not outcomes:
            return
        mark_path = self.releases / REPORTED_NAME
        reported = int((read_json(mark_path) or {}).get("seq", 0))
        fresh = False
        for outcome in outcomes:
            if not isinstance(outcome, dict) or int(outcome.get("seq", 0)) <= reported:
                continue
            committed = outcome.get("result") == "committed"
            detail = (f"{outcome.get('release_id')} (agent {outcome.get('version')}) "
                      f"{'committed' if committed else 'rolled back'}: {outcome.get('reason')}")  # fmt: skip
            self.reporter.event("agent-committed" if committed else "agent-rolled-back", detail)
            reported, fresh = int(outcome.get("seq", 0)), True
            self.releases.mkdir(parents=True, exist_ok=True)
            atomic_write(mark_path, json.dumps({"seq": reported}).encode())
        last = outcomes[-1]
        if isinstance(last, dict) and (fresh or self.status_text() is None):
            verb = "committed" if last.get("result") == "committed" else "rolled back"
            self._set_status(f"{last.get('release_id')} {verb}: {last.get('reason')}")


__all__ = ["RELEASES_DIR", "ReleaseUpdater"]
