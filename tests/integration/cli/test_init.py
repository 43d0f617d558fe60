"""`edgefleet init DIR`: a secure deployment in one directory that starts as written, and whose text files are the
ones shipped in deploy/fleet/ (regenerated here and compared)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgefleet.control.deployment.directory import TEXT_FILES

from support.cli import assert_one_line_error
from support.paths import REPO
from support.servers.brokers import free_port, mosquitto_binary

SHIPPED = REPO / "deploy" / "fleet"
# What deploy/fleet/ is: `edgefleet init` with these options (the command that regenerates it is in its README).
SHIPPED_OPTIONS = (
    "--install-path", "/srv/edgefleet", "--device", "dev-1:lab", "--device", "dev-2:lab",
    "--dynsec-plugin", "/usr/lib/x86_64-linux-gnu/mosquitto_dynamic_security.so", "--no-context",
)  # fmt: skip


def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "edgefleet", *args], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )


@pytest.fixture
def reachable_dir() -> Iterator[Path]:
    """A temporary folder every user can enter (pytest's own tmp_path is 0700 under /tmp/pytest-of-root, which the
    broker user could not pass)."""
    with tempfile.TemporaryDirectory(prefix="edgefleet-init-") as name:
        os.chmod(name, 0o755)
        yield Path(name)


def user_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("EDGEFLEET_")}
    return env | {"EDGEFLEET_HOME": str(home)}


def test_the_shipped_deploy_files_are_what_init_writes(reachable_dir: Path) -> None:
    target = reachable_dir / "fleet"
    result = run("init", str(target), *SHIPPED_OPTIONS, env=user_env(reachable_dir / "home"))
    assert result.returncode == 0, result.stderr
    for name in TEXT_FILES:
        assert (SHIPPED / name).read_text() == (target / name).read_text(), (
            f"deploy/fleet/{name} differs from what `edgefleet init` writes now; regenerate deploy/fleet "
            f"(deploy/README.md says how)"
        )


def test_a_new_deployment_starts_at_once_and_the_host_commands_reach_it_through_its_context(
    reachable_dir: Path,
) -> None:
    target = reachable_dir / "fleet"
    port = free_port()
    home = reachable_dir / "home"
    result = run("init", str(target), "--port", str(port), "--device", "dev-1:lab", "--json", env=user_env(home))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["context"] == "fleet" and report["broker"] == f"mqtts://127.0.0.1:{port}"
    conf = (target / "mosquitto.conf").read_text()
    assert f"\nlistener {port} 127.0.0.1\n" in conf, "loopback unless told otherwise"
    assert not [line for line in conf.splitlines() if line and not line.startswith("#") and " /etc/" in line]
    if os.geteuid() == 0:  # the broker drops to its own user: it must read the key and own its folder
        assert (target / "broker").stat().st_uid == report_uid("mosquitto")
        assert oct((target / "pki" / "server.key").stat().st_mode & 0o777) == "0o640"

    broker = subprocess.Popen(
        [mosquitto_binary(), "-c", "mosquitto.conf"], cwd=target, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        # The user's context (made current by init) and the deployment's own file (relative paths) both reach it.
        for env in (
            user_env(home),
            user_env(reachable_dir / "other") | {"EDGEFLEET_CONFIG": str(target / "config.toml")},
        ):
            status = _until_up(broker, env)
            assert status.returncode == 0, status.stderr
            assert json.loads(status.stdout)["devices"] == []
        if os.geteuid() == 0:
            assert _uid_of(broker.pid) == report_uid("mosquitto"), "Mosquitto runs as its own user, not root"
        log = (target / "broker" / "mosquitto.log").read_text()
        assert "as edgefleet-cli" in log, log
    finally:
        broker.terminate()
        output = broker.communicate(timeout=10)[0].decode(errors="replace")
    assert "Error" not in output, output


def _until_up(broker: subprocess.Popen[bytes], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    deadline = time.monotonic() + 30
    while True:
        status = run("fleet", "status", "--wait", "0.5", "--json", env=env)
        if status.returncode == 0 or time.monotonic() > deadline or broker.poll() is not None:
            return status
        time.sleep(0.2)


def report_uid(name: str) -> int:
    import pwd

    return pwd.getpwnam(name).pw_uid


def _uid_of(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return int(line.split()[1])
    raise AssertionError(f"no Uid line for {pid}")


def test_init_refuses_a_directory_that_holds_files(reachable_dir: Path) -> None:
    (reachable_dir / "fleet").mkdir()
    (reachable_dir / "fleet" / "keep.txt").write_text("mine")
    result = run("init", str(reachable_dir / "fleet"), env=user_env(reachable_dir / "home"))
    assert_one_line_error(result, "already exists and is not empty")
    assert (reachable_dir / "fleet" / "keep.txt").read_text() == "mine"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root hands the files to the broker user")
def test_init_as_root_refuses_a_directory_the_broker_user_cannot_reach(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o700)
    result = run("init", str(locked / "fleet"), env=user_env(tmp_path / "home"))
    assert_one_line_error(result, "cannot enter", "mosquitto")
    assert not (locked / "fleet").exists()


def test_the_shipped_compose_file_and_units_run_commands_the_cli_accepts() -> None:
    import shlex

    import yaml

    from edgefleet.cli.main import build_parser

    services = yaml.safe_load((SHIPPED / "compose.yaml").read_text())["services"]
    assert services["broker"]["command"] == ["mosquitto", "-c", "mosquitto.conf"]
    assert services["broker"]["working_dir"] == "/edgefleet" and services["broker"]["volumes"] == [".:/edgefleet"]
    agents = {name: s for name, s in services.items() if name.startswith("agent-")}
    assert set(agents) == {"agent-dev-1", "agent-dev-2"}
    for name, service in services.items():
        if name == "broker":
            continue
        args = build_parser().parse_args(service["command"])
        if args.command == "agent":
            assert args.tls_ca and args.tls_cert and args.tls_key and args.broker.startswith("mqtts://")
    assert len({s["command"][s["command"].index("--http-port") + 1] for s in agents.values()}) == 2
    unit = (SHIPPED / "systemd" / "edgefleet-control.service").read_text()
    exec_start = next(line for line in unit.splitlines() if line.startswith("ExecStart="))
    args = build_parser().parse_args(shlex.split(exec_start.removeprefix("ExecStart="))[1:])
    assert (args.command, args.verb, args.instance) == ("control", "serve", "main")
    broker_unit = (SHIPPED / "systemd" / "edgefleet-broker.service").read_text()
    assert (
        "WorkingDirectory=/srv/edgefleet\n" in broker_unit
        and "ExecStart=/usr/sbin/mosquitto -c mosquitto.conf\n" in broker_unit
    )
