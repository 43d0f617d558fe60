"""Who the broker runs as, and giving it its files.

Debian's Mosquitto, started as root (by hand or by systemd), switches to the configuration's `user` (default
`mosquitto`) before it opens its log, its certificates and its plugin's file; started as anyone else it stays that
user. So under root the broker user must be able to enter every folder above the deployment, read
`pki/server.key` (group-readable here) and own `broker/` (the plugin rewrites its file there, the persistence
database and the log are written there).
"""

from __future__ import annotations

import grp
import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from edgefleet.core.errors import UserInputError


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int
    groups: frozenset[int]


def running_as_root() -> bool:
    return os.geteuid() == 0


def account(name: str) -> Account:
    try:
        entry = pwd.getpwnam(name)
    except KeyError as err:
        raise UserInputError(
            f"there is no user {name!r} on this machine for the broker to run as: install Mosquitto "
            "(apt-get install -y mosquitto creates it), or name another with --broker-user"
        ) from err
    return Account(name, entry.pw_uid, entry.pw_gid, frozenset(os.getgrouplist(name, entry.pw_gid)))


def current_account() -> Account:
    entry = pwd.getpwuid(os.geteuid())
    return Account(entry.pw_name, entry.pw_uid, entry.pw_gid, frozenset(os.getgroups()) | {entry.pw_gid})


def can_enter(user: Account, folder: Path) -> bool:
    info = folder.stat()
    if user.uid == 0:
        return True
    if info.st_uid == user.uid:
        return bool(info.st_mode & stat.S_IXUSR)
    if info.st_gid in user.groups:
        return bool(info.st_mode & stat.S_IXGRP)
    return bool(info.st_mode & stat.S_IXOTH)


def check_reachable(user: Account, directory: Path) -> None:
    """Every existing folder above `directory` must let `user` through; the error names the first that does not."""
    for folder in reversed(directory.resolve().parents):
        if folder.exists() and not can_enter(user, folder):
            mode = stat.S_IMODE(folder.stat().st_mode)
            raise UserInputError(
                f"the broker runs as {user.name!r}, who cannot enter {folder} (mode {mode:o}), so it could not "
                f"start from {directory}: choose a directory it can reach (e.g. under /srv or /opt), or "
                f"`chmod o+x {folder}`"
            )


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def give_to_broker(user: Account, broker_dir: Path, server_key: Path) -> None:
    """`broker/` and what is in it owned by the broker user (0700); the server key group-readable by its group."""
    for path in [broker_dir, *broker_dir.rglob("*")]:
        os.chown(path, user.uid, user.gid, follow_symlinks=False)
    broker_dir.chmod(0o700)
    os.chown(server_key, 0, user.gid)
    server_key.chmod(0o640)
    os.chown(server_key.parent, 0, user.gid)
    server_key.parent.chmod(0o750)
