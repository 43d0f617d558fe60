"""A certificate revocation list for the broker's TLS listener (optional: `crlfile` in mosquitto.conf).

The dynamic-security plugin takes every right from a revoked device's CN (`broker_rights_revoke.py`), but the
certificate still completes the TLS handshake and CONNECT. With a CRL the broker refuses the handshake itself.
`write_crl` creates the list or adds certificates to it, signed by the CA's key (so it runs where `ca.key`
lives, not on the broker); Mosquitto re-reads it on SIGHUP (`systemctl reload mosquitto`).

OpenSSL refuses every client certificate while the listener's CRL is missing or past its next update, so the list
is issued for `days` (default 10 years) and re-signed, with a higher CRL number, each time it changes.
"""

from __future__ import annotations

import datetime as dt
import os
from collections.abc import Sequence
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization

from edgefleet.control.credentials.pki import _load_ca
from edgefleet.core.errors import UserInputError

DEFAULT_CRL_DAYS = 3650
_CLOCK_SKEW = dt.timedelta(minutes=5)


def write_crl(ca_dir: Path, crl_path: Path, revoke: Sequence[Path] = (), *, days: int = DEFAULT_CRL_DAYS) -> list[int]:
    """Create `crl_path`, or re-sign it with the certificates in `revoke` added; the serial numbers it lists."""
    if days < 1:
        raise UserInputError(f"a CRL must be valid for at least 1 day, not {days}")
    ca_cert, ca_key = _load_ca(ca_dir)
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0)
    revoked: dict[int, dt.datetime] = {}
    number = 0
    if crl_path.exists():
        try:
            old = x509.load_pem_x509_crl(crl_path.read_bytes())
        except ValueError as err:
            raise UserInputError(f"{crl_path} is not a PEM CRL: {err}") from err
        if old.issuer != ca_cert.subject or not old.is_signature_valid(ca_key.public_key()):
            raise UserInputError(f"{crl_path} was not issued by the CA in {ca_dir}; refusing to replace it")
        revoked = {r.serial_number: r.revocation_date_utc for r in old}
        try:
            number = old.extensions.get_extension_for_class(x509.CRLNumber).value.crl_number
        except x509.ExtensionNotFound:
            number = 0
    for path in revoke:
        try:
            cert = x509.load_pem_x509_certificate(path.read_bytes())
        except (OSError, ValueError) as err:
            raise UserInputError(f"cannot read the certificate {path}: {err}") from err
        if cert.issuer != ca_cert.subject:
            raise UserInputError(f"{path} was not issued by the CA in {ca_dir}")
        revoked.setdefault(cert.serial_number, now)
    builder = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca_cert.subject)
        .last_update(now - _CLOCK_SKEW)
        .next_update(now + dt.timedelta(days=days))
        .add_extension(x509.CRLNumber(number + 1), critical=False)
    )
    for serial, when in sorted(revoked.items()):
        builder = builder.add_revoked_certificate(
            x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when).build()
        )
    crl = builder.sign(ca_key, hashes.SHA256())
    crl_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = crl_path.with_name(f".{crl_path.name}.tmp")
    tmp.write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    os.chmod(tmp, 0o644)
    os.replace(tmp, crl_path)
    return sorted(revoked)


__all__ = ["DEFAULT_CRL_DAYS", "write_crl"]
