"""Broker TLS credentials: a small CA, the broker's server certificate, one client certificate per device.

Mosquitto runs with `require_certificate true` and `use_identity_as_username true`, so a client's certificate
CN *is* its MQTT user name and the ACL (see `edgefleet.control.rights.acl`) keys on it: the CN of a device certificate
is its device id, the control plane's is `edgefleet-host`.

Keys are EC P-256 (ECDSA with SHA-256): every broker and TLS stack edgefleet meets accepts it (Mosquitto with
OpenSSL 1.1 or 3, AWS IoT Core, EMQX, paho's `ssl` module). Ed25519 certificates also work between Mosquitto on
OpenSSL 3 and Python, but AWS IoT Core and older stacks refuse them, so they are not offered.

Private keys are written unencrypted (PKCS#8 PEM) with mode 0600, and nothing is ever overwritten: an existing
certificate or key is an error. This is a CA for tests and small fleets; a large fleet would use its own PKI and
only the ACL generator.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from edgefleet.core.errors import UserInputError
from edgefleet.core.topics import HOST_IDENTITY, check_segment

__all__ = [
    "HOST_IDENTITY",
    "CertFiles",
    "ca_paths",
    "certificate_cn",
    "create_ca",
    "create_client_cert",
    "create_server_cert",
]

CA_NAME = "ca"
SERVER_NAME = "server"
DEFAULT_CA_DAYS = 3650
DEFAULT_CERT_DAYS = 825  # the longest validity Apple and browsers accept for TLS server certificates
_CLOCK_SKEW = dt.timedelta(minutes=5)  # devices with a slightly wrong clock still accept a fresh certificate
_ALWAYS_SERVER_HOSTS = ("localhost", "127.0.0.1")
_MAX_CN = 64  # X.509 upper bound for a common name


@dataclass(frozen=True)
class CertFiles:
    """Where one identity's files are: its certificate, its private key and the CA certificate to trust."""

    cert: Path
    key: Path
    ca: Path


def ca_paths(directory: Path) -> CertFiles:
    """The files of the CA kept in `directory` (`ca.crt`, `ca.key`)."""
    return CertFiles(
        cert=directory / f"{CA_NAME}.crt", key=directory / f"{CA_NAME}.key", ca=directory / f"{CA_NAME}.crt"
    )


def create_ca(directory: Path, *, common_name: str = "edgefleet test CA", days: int = DEFAULT_CA_DAYS) -> CertFiles:
    """A self-signed CA that may sign leaf certificates only (path length 0): `ca.crt` and `ca.key`."""
    if not 1 <= len(common_name) <= _MAX_CN:
        raise UserInputError(f"the CA's common name must have 1 to {_MAX_CN} characters")
    files = ca_paths(directory)
    _refuse_existing(files.cert, files.key)
    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(now + dt.timedelta(days=_positive_days(days)))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(files, key, cert)
    return files


def create_server_cert(
    directory: Path,
    hosts: Sequence[str],
    *,
    ca_dir: Path | None = None,
    name: str = SERVER_NAME,
    days: int = DEFAULT_CERT_DAYS,
) -> CertFiles:
    """The broker's certificate, `NAME.crt`/`NAME.key`, signed by the CA in `ca_dir` (default `directory`).

    Its subject alternative names are `hosts` plus `localhost` and `127.0.0.1`: each entry that parses as an
    IP address becomes an IP SAN, anything else a DNS SAN. Clients check the name they dial against these.
    """
    _check_name("file name", name)
    names = _unique([h.strip() for h in hosts if h.strip()] + list(_ALWAYS_SERVER_HOSTS))
    sans = [_san(host) for host in names]
    return _issue(
        directory,
        ca_dir or directory,
        name,
        common_name=names[0] if len(names[0]) <= _MAX_CN else "edgefleet broker",
        sans=sans,
        usage=ExtendedKeyUsageOID.SERVER_AUTH,
        days=days,
    )


def create_client_cert(
    directory: Path,
    identity: str,
    *,
    ca_dir: Path | None = None,
    days: int = DEFAULT_CERT_DAYS,
) -> CertFiles:
    """A client certificate whose CN is `identity` (a device id, or `edgefleet-host`): `ID.crt`/`ID.key`.

    The CN becomes the MQTT user name, and device ids are topic levels, so it must pass `check_segment`.
    """
    _check_name("device id", identity)
    if len(identity) > _MAX_CN:
        raise UserInputError(f"device id {identity!r} is longer than the {_MAX_CN} characters a certificate CN holds")
    if identity in (CA_NAME, SERVER_NAME):
        raise UserInputError(f"{identity!r} would collide with the {identity} files; choose another device id")
    return _issue(
        directory,
        ca_dir or directory,
        identity,
        common_name=identity,
        sans=[],
        usage=ExtendedKeyUsageOID.CLIENT_AUTH,
        days=days,
    )


def certificate_cn(path: Path) -> str:
    """The subject CN of a PEM certificate (what Mosquitto uses as the user name)."""
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    values = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if not values:
        raise UserInputError(f"{path} has no common name")
    value = values[0].value
    return value.decode() if isinstance(value, bytes) else value


# --- internals


def _issue(
    directory: Path,
    ca_dir: Path,
    name: str,
    *,
    common_name: str,
    sans: list[x509.GeneralName],
    usage: x509.ObjectIdentifier,
    days: int,
) -> CertFiles:
    ca_cert, ca_key = _load_ca(ca_dir)
    files = CertFiles(cert=directory / f"{name}.crt", key=directory / f"{name}.key", ca=ca_paths(ca_dir).cert)
    _refuse_existing(files.cert, files.key)
    key = _new_key()
    now = _now()
    not_after = min(now + dt.timedelta(days=_positive_days(days)), ca_cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    cert = builder.sign(ca_key, hashes.SHA256())
    _write(files, key, cert)
    return files


def _load_ca(ca_dir: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    files = ca_paths(ca_dir)
    try:
        cert = x509.load_pem_x509_certificate(files.cert.read_bytes())
        key = serialization.load_pem_private_key(files.key.read_bytes(), password=None)
    except FileNotFoundError as err:
        raise UserInputError(
            f"no CA in {ca_dir} ({err.filename} is missing); create one with `edgefleet keys ca`"
        ) from err
    except ValueError as err:
        raise UserInputError(f"cannot read the CA in {ca_dir}: {err}") from err
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise UserInputError(f"{files.key} is not an EC private key")
    if cert.public_key() != key.public_key():
        raise UserInputError(f"{files.cert} and {files.key} do not belong together")
    return cert, key


def _check_name(kind: str, value: str) -> None:
    try:
        check_segment(kind, value)
    except ValueError as err:
        raise UserInputError(str(err)) from err


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0)


def _positive_days(days: int) -> int:
    if days < 1:
        raise UserInputError(f"validity must be at least 1 day, not {days}")
    return days


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        pass
    if any(c.isspace() for c in host) or "/" in host:
        raise UserInputError(f"invalid host name {host!r} for a server certificate")
    return x509.DNSName(host)


def _unique(values: list[str]) -> list[str]:
    return list(dict.fromkeys(values))


def _refuse_existing(*paths: Path) -> None:
    for path in paths:
        if path.exists() or path.is_symlink():
            raise UserInputError(f"{path} already exists; refusing to overwrite credentials")


def _write(files: CertFiles, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> None:
    files.key.parent.mkdir(parents=True, exist_ok=True)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    _write_new(files.key, key_pem, 0o600)
    try:
        _write_new(files.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
    except BaseException:
        files.key.unlink(missing_ok=True)  # never leave a key without its certificate
        raise


def write_new_text(path: Path, text: str, mode: int = 0o644) -> Path:
    """Create a configuration file that must not exist yet (never overwrite what a broker now owns)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    _write_new(path, text.encode(), mode)
    return path


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create `path` (O_EXCL: never overwrite, never follow a planted link) with `mode`, whatever the umask."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
    except FileExistsError as err:
        raise UserInputError(f"{path} already exists; refusing to overwrite credentials") from err
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), mode)
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
