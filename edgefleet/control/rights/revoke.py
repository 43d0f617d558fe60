"""Revoking a device's broker identity (a stolen device certificate): `edgefleet keys revoke-device ID`.

On the shipped broker (mutual TLS, CN = user name = client id, the dynamic-security plugin) one message to the
plugin, answered before this returns:
- `disableClient ID`: the plugin disconnects the client's session now (`mosquitto_kick_client_by_username`) and
  keeps the client as a tombstone, so `keys enroll ID` cannot quietly re-create it;
- `deleteRole edgefleet-device-ID`: every right the identity had goes (base rights, group and bundle grants).
Mosquitto 2.0.11 skips the plugin's authentication for certificate identities (`use_identity_as_username`,
src/handle_connect.c) and its ACL checks ignore `disabled`, so a disabled client that still held a role would keep its
rights: deleting the role is what revokes. The stolen certificate still completes the TLS handshake and CONNECT; the
broker then refuses every publish and delivers nothing to it. Refusing the handshake itself takes the optional CRL
(`crlfile`, commented out in the shipped configuration; `edgefleet/control/credentials/crl.py`, signed with the CA key,
re-read on SIGHUP): see docs/trust.md. Since the certificate's CN stays revoked, a replacement device gets a new device
id and certificate.

The host registry marks the device revoked (`registry.revoked`): the control plane grants it nothing, puts it in
no group or rollout, and `devices list|show` says so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from edgefleet.control.fleet.registry import REGISTRY_REVOKED
from edgefleet.control.rights.dynsec import device_role
from edgefleet.control.rights.sync import DynsecClient, DynsecError, probe_dynsec
from edgefleet.control.store import Store
from edgefleet.core.errors import UnknownNameError, UserInputError


@dataclass(frozen=True)
class Revocation:
    device_id: str
    broker: str  # what the broker did
    registry: str  # what the registry did


def revoke_on_broker(client: DynsecClient, device_id: str) -> str:
    """Disable the device's client (its session is kicked) and delete its role; what was done, in words."""
    if not probe_dynsec(client):
        raise UserInputError(
            "the broker did not answer on $CONTROL/dynamic-security/v1 (no plugin, or this certificate lacks the "
            "edgefleet-host role): nothing was revoked"
        )
    role = device_role(device_id)
    disabled, deleted = client.run(
        [{"command": "disableClient", "username": device_id}, {"command": "deleteRole", "rolename": role}]
    )
    if disabled.get("error") and deleted.get("error"):
        raise DynsecError(
            f"the broker knows no client {device_id!r} ({disabled['error']}) and no role {role!r} "
            f"({deleted['error']}): nothing to revoke"
        )
    done = []
    if not disabled.get("error"):
        done.append("client disabled and disconnected")
    if not deleted.get("error"):
        done.append(f"role {role} deleted (no rights left)")
    elif "not found" not in str(deleted["error"]).lower():
        raise DynsecError(f"dynamic-security deleteRole {role} failed: {deleted['error']}")
    return "; ".join(done)


def mark_revoked(store: Store, device_id: str, when: float | None = None) -> str:
    """Record the revocation in the host registry; what was done, in words."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() if when is None else when))
    try:
        store.set_labels(device_id, {REGISTRY_REVOKED: stamp})
    except UnknownNameError:
        return "not in the registry (it never reported a status to this control plane)"
    return f"marked revoked at {stamp}"


__all__ = ["Revocation", "mark_revoked", "revoke_on_broker"]
