"""deploy/docker/compose.yaml: PostgreSQL and two control-plane replicas on it, whose commands the real CLI parses."""

from __future__ import annotations

import yaml

from edgefleet.cli.main import build_parser

from support.paths import REPO

COMPOSE = REPO / "deploy" / "docker" / "compose.yaml"


def test_two_control_plane_replicas_share_one_postgresql_store() -> None:
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    assert services["postgres"]["image"].startswith("postgres:")
    replicas = {name: s for name, s in services.items() if name.startswith("control-")}
    assert len(replicas) == 2
    stores, instances, ports = set(), set(), set()
    for service in replicas.values():
        env = service["environment"]
        assert env["EDGEFLEET_STORE"].startswith("postgresql://") and "@postgres:5432/" in env["EDGEFLEET_STORE"]
        assert service["depends_on"]["postgres"]["condition"] == "service_healthy"
        args = build_parser().parse_args(service["command"])
        assert (args.command, args.verb) == ("control", "serve") and not args.no_engine and not args.no_ingest
        stores.add(env["EDGEFLEET_STORE"])
        instances.add(args.instance)
        ports.update(service["ports"])
    assert len(stores) == 1 and len(instances) == 2 and len(ports) == 2, "one store, two names, two dashboards"
