"""An agent with its own client certificate, behind a TLS listener and a generated ACL, installs and serves."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from edgefleet.control.credentials.pki import create_ca, create_client_cert, create_server_cert
from edgefleet.control.fleet.remote import RemoteModel
from edgefleet.control.publish.chunker import chunk_names
from edgefleet.control.rights.acl import render_acl, write_acl
from edgefleet.core.bundle.archive import parse_manifest, read_signed_manifest
from edgefleet.core.mqtt.connection import Connection, TlsFiles
from edgefleet.core.topics import HOST_IDENTITY, Topics

from support.fleet import AgentProcess, FleetWatcher, deploy_to
from support.servers.brokers import HOST, MosquittoBroker, free_port


def test_an_agent_over_mutual_tls_installs_only_what_its_acl_allows(
    tmp_path: Path, keys: tuple[Path, Path], demo_bundles: dict[str, Path]
) -> None:
    pki = tmp_path / "pki"
    ca = create_ca(pki)
    server = create_server_cert(pki, ["localhost"])
    host_cert = create_client_cert(pki, HOST_IDENTITY)
    device = create_client_cert(pki, "dev-tls")
    bundle = demo_bundles["intel-x86-vnni"]
    bundle_id = parse_manifest(read_signed_manifest(bundle).manifest_json).bundle_id
    chunks = {bundle_id: chunk_names(bundle, 16 * 1024)}  # an acl_file names each chunk (deploy_to's block size)
    acl = write_acl(
        tmp_path / "edgefleet.acl", render_acl({"dev-tls": ["tls-group"]}, {"dev-tls": [bundle_id]}, chunks=chunks)
    )
    port = free_port()
    extra = [
        f"listener {port} {HOST}", f"cafile {ca.cert}", f"certfile {server.cert}", f"keyfile {server.key}",
        "require_certificate true", "use_identity_as_username true", f"acl_file {acl}",
    ]  # fmt: skip
    url = f"mqtts://{HOST}:{port}"
    with MosquittoBroker(extra_config=extra):
        host = Connection(url, "tls-host", tls=TlsFiles(str(ca.cert), str(host_cert.cert), str(host_cert.key)))
        host.start()
        topics = Topics()
        watcher = FleetWatcher(host, topics)
        agent = AgentProcess(
            "dev-tls", tmp_path / "dev-tls", broker=url, trust=keys[0].parent / "root.pub", groups=("tls-group",),
            extra=("--ca", str(ca.cert), "--cert", str(device.cert), "--key", str(device.key)),
        ).start()  # fmt: skip
        try:
            deployed = deploy_to(host, topics, bundle, groups=("tls-group",))
            assert deployed == bundle_id
            status = watcher.serving("dev-tls", bundle_id, timeout=60)
            assert status.online
            (answer,) = RemoteModel(host, topics, "dev-tls").infer_many([{"input": np.zeros((1, 1, 8, 8), np.float32)}])
            assert answer.ok
            telemetry = watcher.wait_for("telemetry over TLS", lambda: watcher.telemetry)
            assert telemetry[0].device_id == "dev-tls"
        finally:
            agent.stop()
            host.stop()
