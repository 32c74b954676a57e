"""TLS for the session page: a server context from a certificate and its key, checked before
anything runs, and a fresh self-signed certificate for development.

A page served from ``http://`` on a host that is not loopback is not a secure context in a
browser: WebCodecs (``VideoDecoder``) and ``pointerrawupdate`` are missing there and the page
falls back to JPEG. Served over ``https://`` it is one.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import ipaddress
import os
import shutil
import socket
import ssl
import tempfile
from pathlib import Path
from typing import Any

from rxstream._exceptions import ArgumentError

__all__ = ["SelfSigned", "fingerprints", "server_context"]

SELF_SIGNED_DAYS = 7
"""How long a development certificate is valid (one is made for each run anyway)."""


def server_context(
    cert: str | os.PathLike[str],
    key: str | os.PathLike[str],
    *,
    cert_name: str = "tls_cert",
    key_name: str = "tls_key",
) -> ssl.SSLContext:
    """A server ``SSLContext`` (TLS 1.2 or later) from the PEM certificate (chain) at ``cert``
    and its unencrypted PEM private key at ``key``.

    Refused with :class:`ArgumentError`, one line naming ``cert_name`` or ``key_name`` and the
    path: a file that does not exist or cannot be read, one that does not parse, an encrypted
    key (it would ask for its passphrase on the terminal), a key that is not the
    certificate's."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    cert_text = _read(cert, cert_name)
    key_text = _read(key, key_name)
    try:
        certificate = x509.load_pem_x509_certificates(cert_text)[0]
    except ValueError:
        raise ArgumentError(
            f"{cert_name} {os.fspath(cert)}: not a PEM certificate (-----BEGIN CERTIFICATE-----)"
        ) from None
    try:
        private = serialization.load_pem_private_key(key_text, password=None)
    except TypeError:  # "Password was not given but private key is encrypted"
        raise ArgumentError(
            f"{key_name} {os.fspath(key)}: the key is encrypted: give it unencrypted "
            "(openssl pkey -in KEY -out KEY.pem), readable by this user only"
        ) from None
    except Exception as exc:  # ValueError, and UnsupportedAlgorithm for an unknown kind
        raise ArgumentError(
            f"{key_name} {os.fspath(key)}: not a PEM private key (-----BEGIN PRIVATE KEY-----)"
        ) from exc
    if _spki(private.public_key()) != _spki(certificate.public_key()):
        raise ArgumentError(
            f"{key_name} {os.fspath(key)} is not the key of {cert_name} {os.fspath(cert)}: "
            "give the private key the certificate was made for"
        )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(os.fspath(cert), os.fspath(key), password=_no_passphrase)
    except (ssl.SSLError, OSError) as exc:
        raise ArgumentError(
            f"{cert_name} {os.fspath(cert)}, {key_name} {os.fspath(key)}: TLS refused the pair "
            f"({exc})"
        ) from exc
    return context


def fingerprints(cert: str | os.PathLike[str]) -> tuple[str, str]:
    """The SHA-256 fingerprint of the certificate at ``cert`` (``AB:CD:…``, as browsers show
    it) and the base64 SHA-256 of its SubjectPublicKeyInfo (what Chromium's
    ``--ignore-certificate-errors-spki-list`` and HPKP-style pins take)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes

    certificate = x509.load_pem_x509_certificates(Path(cert).read_bytes())[0]
    digest = certificate.fingerprint(hashes.SHA256())
    spki = base64.b64encode(hashlib.sha256(_spki(certificate.public_key())).digest()).decode()
    return ":".join(f"{byte:02X}" for byte in digest), spki


class SelfSigned:
    """A fresh self-signed certificate for ``host`` (development only), in a private
    temporary folder (``0700``), made with ``cryptography`` (an ECDSA P-256 key).

    Its subjectAltName names ``host`` (a DNS name or an IP), ``localhost``, 127.0.0.1, ::1
    and, for a wildcard bind (``0.0.0.0``, ``::``), this machine's name. :attr:`context` is
    the server context; the key's file is removed as soon as the context loaded it, and the
    certificate's (:attr:`cert`, to import into a trust store or pass to ``curl --cacert``)
    by :meth:`close`. :attr:`sha256` and :attr:`spki` are its :func:`fingerprints`.
    """

    def __init__(self, host: str) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="rxstream-tls-"))
        self.cert = self.folder / "cert.pem"
        key = self.folder / "key.pem"
        try:
            _make(host, self.cert, key)
            self.context = server_context(self.cert, key)
        except BaseException:
            self.close()
            raise
        finally:
            with contextlib.suppress(OSError):
                key.unlink()
        self.sha256, self.spki = fingerprints(self.cert)

    def close(self) -> None:
        """Remove the folder and what is left in it."""
        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> SelfSigned:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _make(host: str, cert: Path, key: Path) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    private = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName("localhost")]
    addresses = {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    bare = host.strip("[]")
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        if bare.lower() != "localhost":
            names.append(x509.DNSName(bare))
    else:
        if address.is_unspecified:  # every interface: visitors use this machine's name
            machine = socket.gethostname()
            if machine and machine != "localhost":
                names.append(x509.DNSName(machine))
        else:
            addresses.add(address)
    names += [x509.IPAddress(a) for a in sorted(addresses, key=str)]
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, bare or "localhost")])
    now = datetime.datetime.now(datetime.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(private.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=SELF_SIGNED_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(private, hashes.SHA256())
    )
    cert.write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    handle = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(handle, "wb") as out:
        out.write(
            private.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )


def _read(path: str | os.PathLike[str], name: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise ArgumentError(f"{name} {os.fspath(path)}: no such file") from None
    except IsADirectoryError:
        raise ArgumentError(f"{name} {os.fspath(path)} is a folder; give a PEM file") from None
    except OSError as exc:
        raise ArgumentError(f"{name} {os.fspath(path)}: cannot read it: {exc.strerror}") from None


def _spki(public: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return bytes(
        public.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def _no_passphrase() -> str:
    raise ArgumentError("the key is encrypted: give it unencrypted")
