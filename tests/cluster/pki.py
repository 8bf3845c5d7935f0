"""The control plane's credentials: certificates made with ``cryptography`` (a CA, the API
server's serving certificate for 127.0.0.1, localhost and the in-cluster names, the
service-account RSA key) and kubeconfig files that carry a bearer token."""

from __future__ import annotations

import datetime as dt
import ipaddress
from pathlib import Path
from typing import Any

import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

# Long enough for any test session, short enough that a leaked key is worthless soon.
VALIDITY = dt.timedelta(days=2)


def write_pki(folder: Path) -> dict[str, Path]:
    """Writes the plane's keys and certificates (PEM) into ``folder``.

    Args:
        folder: where to write them (created when missing); the private keys get mode 0600.

    Returns:
        Their paths by role: ``ca`` (the CA certificate), ``serving_cert`` and ``serving_key``
        (the API server's, for 127.0.0.1/localhost, signed by the CA), ``sa_key`` and ``sa_pub``
        (the RSA key that signs and verifies ServiceAccount tokens).
    """
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.timezone.utc)
    not_before = now - dt.timedelta(hours=1)
    not_after = now + VALIDITY

    def pem_key(key: Any) -> bytes:
        data: bytes = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return data

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tide-test-ca")])
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
        .add_extension(
            x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )

    serving_key = ec.generate_private_key(ec.SECP256R1())
    serving_cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
        .issuer_name(ca_name)
        .public_key(serving_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.DNSName("kubernetes"),
                    x509.DNSName("kubernetes.default.svc"),
                    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                    x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )

    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    paths = {
        "ca": folder / "ca.crt",
        "serving_cert": folder / "apiserver.crt",
        "serving_key": folder / "apiserver.key",
        "sa_key": folder / "sa.key",
        "sa_pub": folder / "sa.pub",
    }
    paths["ca"].write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    paths["serving_cert"].write_bytes(serving_cert.public_bytes(serialization.Encoding.PEM))
    paths["serving_key"].write_bytes(pem_key(serving_key))
    paths["sa_key"].write_bytes(pem_key(sa_key))
    paths["sa_pub"].write_bytes(
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    for key in ("serving_key", "sa_key"):
        paths[key].chmod(0o600)
    return paths


def kubeconfig_text(*, server: str, ca_file: Path, token: str, user: str) -> str:
    """A kubeconfig (YAML) with one cluster, one user authenticated by ``token``, one context.

    Args:
        server: the API server's URL.
        ca_file: the CA certificate that verifies it.
        token: the bearer token.
        user: the name of the kubeconfig's user entry (a label, not the identity).
    """
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "tide-test",
                "cluster": {"server": server, "certificate-authority": str(ca_file)},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "tide-test", "context": {"cluster": "tide-test", "user": user}}],
        "current-context": "tide-test",
    }
    return yaml.safe_dump(config)
