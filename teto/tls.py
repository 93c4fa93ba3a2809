"""A self-signed certificate authority and a server certificate for the gateway's HTTPS (``teto secrets tls``).

For deployments without a certificate of their own (deploy/compose.yml): the CA's certificate is what clients
verify against (``teto --ca-file``, ``TETO_CA_FILE``); its private key is not written, so this CA can sign
nothing else. The server key is written readable by its owner only.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.pem"
CERT_FILE = "gateway.pem"
KEY_FILE = "gateway-key.pem"


@dataclass(frozen=True)
class TlsFiles:
    ca: Path  # give to clients (TETO_CA_FILE)
    cert: Path  # TETO_TLS_CERT_FILE of the gateway
    key: Path  # TETO_TLS_KEY_FILE of the gateway


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Teto"),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


def make_tls(out: Path, hosts: list[str], *, days: int = 825, now: dt.datetime | None = None,
             client_auth: bool = False) -> TlsFiles:
    """Write ``ca.pem``, ``gateway.pem`` and ``gateway-key.pem`` under ``out``; the certificate names every
    host in ``hosts`` (DNS names or IP addresses), e.g. ``gateway``, ``localhost``, ``127.0.0.1``.
    ``client_auth``: the certificate may also prove its holder as a client (NATS cluster routes verify both ways)."""
    if not hosts:
        raise ValueError("at least one host name or address for the certificate")
    now = now or dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("Teto gateway CA")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
          .not_valid_after(now + dt.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                       content_commitment=False, key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
          .sign(ca_key, hashes.SHA256()))
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (x509.CertificateBuilder().subject_name(_name(hosts[0])).issuer_name(ca_name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName([_san(h) for h in hosts]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]
                                               + ([ExtendedKeyUsageOID.CLIENT_AUTH] if client_auth else [])),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    out.mkdir(parents=True, exist_ok=True)
    files = TlsFiles(ca=out / CA_FILE, cert=out / CERT_FILE, key=out / KEY_FILE)
    files.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    files.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(serialization.Encoding.PEM))
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(files.key, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(pem)
    os.chmod(files.key, 0o600)
    return files
