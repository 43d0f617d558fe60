"""Lay a deployment directory out: credentials, the broker's files, the text files, the ownership.

    DIR/
      config.toml            the host commands' context (paths relative to DIR)
      mosquitto.conf         run from DIR: `cd DIR && mosquitto -c mosquitto.conf`
      compose.yaml, .env     the same fleet in containers (.env: the user ids the files belong to)
      systemd/               edgefleet-broker, edgefleet-control (this machine), edgefleet-agent (a device)
      keys/                  root, bundle and ops keys and the root-signed key set (keep root.key offline)
      pki/                   the CA (keep ca.key offline), the broker's certificate, the host identities'
      broker/                the broker's own (owned by its user): dynamic-security.json, persistence, log
      devices/ID/            what device ID needs: ca.crt, ID.crt/ID.key, trusted/root.pub, agent.env, state/

Nothing is overwritten: the directory must be new or empty.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from edgefleet.control.credentials import keyring
from edgefleet.control.credentials.pki import create_ca, create_client_cert, create_server_cert, write_new_text
from edgefleet.control.deployment import ownership, templates
from edgefleet.control.deployment.spec import DeploymentSpec
from edgefleet.control.rights.dynsec import render_config
from edgefleet.core.errors import UserInputError
from edgefleet.core.topics import check_segment

# The files that are the same wherever and by whom the directory is written (deploy/fleet/ ships them).
TEXT_FILES = (
    "config.toml",
    "mosquitto.conf",
    "compose.yaml",
    "systemd/edgefleet-broker.service",
    "systemd/edgefleet-control.service",
    "systemd/edgefleet-agent.service",
)


@dataclass
class Created:
    directory: Path
    files: list[Path] = field(default_factory=list)
    broker_user: str = ""
    notes: list[str] = field(default_factory=list)


def create_deployment(spec: DeploymentSpec) -> Created:
    directory = spec.directory
    _check(spec)
    broker = ownership.account(spec.broker_user) if ownership.running_as_root() else ownership.current_account()
    if ownership.running_as_root():
        ownership.check_reachable(broker, directory)
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise UserInputError(
            f"{directory} already exists and is not empty; `edgefleet init` writes a new deployment (it never "
            "overwrites keys or certificates): name a new directory"
        )
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o755)
    created = Created(directory, broker_user=broker.name)

    keys = directory / templates.KEYS_DIR
    keys.mkdir(mode=0o700)
    keyring.init(keys)
    pki = directory / templates.PKI_DIR
    pki.mkdir(mode=0o750)
    create_ca(pki, common_name=f"edgefleet {spec.context_name} CA")
    server = create_server_cert(pki, spec.server_names)
    for identity in spec.host_identities:
        create_client_cert(pki, identity)
    for device_id in sorted(spec.devices):
        _device_files(spec, device_id)

    broker_dir = directory / templates.BROKER_DIR
    broker_dir.mkdir(mode=0o700)
    host_users = list(spec.host_identities)
    write_new_text(
        broker_dir / "dynamic-security.json",
        render_config(spec.devices, prefix=spec.prefix, host_users=host_users),
        mode=0o600,
    )
    for name, text in texts(spec).items():
        created.files.append(write_new_text(directory / name, text))
    owner = ownership.current_account()
    created.files.append(
        write_new_text(
            directory / ".env",
            templates.HEADER + "# The user ids compose runs the services as: the files here belong to them.\n"
            f"EDGEFLEET_UID={owner.uid}\nEDGEFLEET_GID={owner.gid}\n"
            f"EDGEFLEET_BROKER_UID={broker.uid}\nEDGEFLEET_BROKER_GID={broker.gid}\n",
        )
    )
    if ownership.running_as_root():
        ownership.give_to_broker(broker, broker_dir, server.key)
    else:
        created.notes.append(
            f"init did not run as root, so the broker's files belong to you ({owner.name}): start Mosquitto as "
            f"yourself (it switches users only when started as root), or first `sudo chown -R {spec.broker_user}: "
            f"{broker_dir} && sudo chgrp {spec.broker_user} {pki} {server.key} && sudo chmod 0640 {server.key}`"
        )
    return created


def texts(spec: DeploymentSpec) -> dict[str, str]:
    """TEXT_FILES by name."""
    import tomli_w

    return {
        "config.toml": templates.HEADER
        + "# The host commands' context for this deployment; paths are relative to this file's folder.\n"
        "# Use it with EDGEFLEET_CONFIG=THIS_FILE, or through the context `edgefleet init` added to yours.\n"
        + tomli_w.dumps(templates.context_file(spec)),
        "mosquitto.conf": templates.mosquitto_conf(spec),
        "compose.yaml": templates.compose(spec),
        "systemd/edgefleet-broker.service": templates.broker_unit(spec),
        "systemd/edgefleet-control.service": templates.control_unit(spec),
        "systemd/edgefleet-agent.service": templates.agent_unit(spec),
    }


def _device_files(spec: DeploymentSpec, device_id: str) -> None:
    folder = spec.directory / templates.DEVICES_DIR / device_id
    folder.mkdir(parents=True, mode=0o700)
    pki = spec.directory / templates.PKI_DIR
    create_client_cert(folder, device_id, ca_dir=pki)
    shutil.copyfile(pki / "ca.crt", folder / "ca.crt")
    (folder / "trusted").mkdir()
    shutil.copyfile(spec.directory / templates.KEYS_DIR / "root.pub", folder / "trusted" / "root.pub")
    write_new_text(folder / "agent.env", templates.agent_env(spec, device_id))
    (folder / "state").mkdir(mode=0o700)


def _check(spec: DeploymentSpec) -> None:
    try:
        check_segment("context name", spec.context_name)
        for device_id, groups in spec.devices.items():
            check_segment("device id", device_id)
            for group in groups:
                check_segment("group", group)
    except ValueError as err:
        raise UserInputError(str(err)) from err
    clash = sorted(set(spec.devices) & {*spec.host_identities, "ca", "server"})
    if clash:
        raise UserInputError(f"device id {clash[0]!r} is taken by the deployment's own files; choose another")
    if not 0 < spec.port < 65536:
        raise UserInputError(f"--port {spec.port}: a TCP port is 1 to 65535")
    if not os.path.isabs(str(spec.where)):
        raise UserInputError(f"--install-path {spec.where}: an absolute path (the systemd units name it)")
