"""The cluster's certificate authority, with `cryptography`: a root made once (its key stays in the
first control plane's state dir), intermediates that sign machines' certificates (their keys travel
through Raft sealed with the cluster secret), and the machines' keys and certificate requests.

Keys are ECDSA P-256: small, fast to sign and verify, accepted by every TLS stack we meet. A
machine's certificate names it twice: `CN=<name>, OU=<role>` for people, and the URI
`urn:llmgw:<role>:<name>` for the code (`identity`), beside the DNS names and addresses it is
reached at. Time comes in as an argument (`now`, unix seconds), so tests run certificates to
renewal and expiry without waiting.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import ipaddress
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from llmgw.domain.timeouts import TIMEOUTS
from llmgw.domain.trust import MACHINE_ROLES

# Lifetimes and the backdating of not-before: the timeouts table's (domain/timeouts.py, area "trust").
ROOT_LIFE = TIMEOUTS.ca_root_life_s
INTERMEDIATE_LIFE = TIMEOUTS.ca_intermediate_life_s
MACHINE_LIFE = TIMEOUTS.cert_life_s  # renewed at two thirds (60 days) over the machine's stream
BACKDATE = TIMEOUTS.cert_backdate_s
URI_PREFIX = "urn:llmgw:"
_SEAL_CONTEXT = b"llmgw ca key seal v1"


class CaError(ValueError):
    """A certificate, request or key that cannot be used; the message says which and why (never a key)."""


@dataclass(frozen=True)
class Issued:
    """A certificate and the private key it was made for, both PEM."""

    cert_pem: str
    key_pem: str


@dataclass(frozen=True)
class Identity:
    """Who a machine's certificate says it is."""

    role: str
    name: str
    serial: str  # lower-case hex
    not_after: float
    issuer_serial: str  # hex serial of the intermediate that signed it ("" if unknown)


def _time(t: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(t, dt.timezone.utc)


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key: ec.EllipticCurvePrivateKey) -> str:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption()).decode()


def _cert_pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def load_cert(pem: str | bytes) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(pem.encode() if isinstance(pem, str) else pem)
    except ValueError as e:
        raise CaError(f"not a PEM certificate: {e}") from None


def load_key(pem: str) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(pem.encode(), password=None)
    except (ValueError, TypeError) as e:
        raise CaError(f"not a PEM private key: {e}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CaError("the CA's keys are ECDSA keys")
    return key


def serial_hex(cert: x509.Certificate) -> str:
    return format(cert.serial_number, "x")


def _ca_cert(subject: x509.Name, key: ec.EllipticCurvePrivateKey, issuer: x509.Name,
             signer: ec.EllipticCurvePrivateKey, now: float, lifetime_s: float, path_length: int,
             issuer_key: ec.EllipticCurvePublicKey) -> x509.Certificate:
    return (x509.CertificateBuilder()
            .subject_name(subject).issuer_name(issuer).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(_time(now - BACKDATE)).not_valid_after(_time(now + lifetime_s))
            .add_extension(x509.BasicConstraints(ca=True, path_length=path_length), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key), critical=False)
            .sign(signer, hashes.SHA256()))


def make_root(cluster: str, now: float, lifetime_s: float = ROOT_LIFE) -> Issued:
    """A new root CA for a cluster (`cluster`: a name for people, in its subject)."""
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmgw"),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"llmgw root CA {cluster}"[:64])])
    cert = _ca_cert(name, key, name, key, now, lifetime_s, 1, key.public_key())
    return Issued(_cert_pem(cert), _key_pem(key))


def make_intermediate(root: Issued, now: float, lifetime_s: float = INTERMEDIATE_LIFE) -> Issued:
    """A new intermediate signed by `root`; never outlives it."""
    root_cert, root_key = load_cert(root.cert_pem), load_key(root.key_pem)
    until = min(lifetime_s, root_cert.not_valid_after_utc.timestamp() - now)
    if until <= 0:
        raise CaError("the root CA has expired: make a new cluster CA (docs/security.md)")
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmgw"),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"llmgw intermediate CA {now:.0f}")])
    cert = _ca_cert(name, key, root_cert.subject, root_key, now, until, 0, root_key.public_key())
    return Issued(_cert_pem(cert), _key_pem(key))


def new_key_pem() -> str:
    return _key_pem(_key())


def make_request(key_pem: str, role: str, name: str) -> str:
    """A certificate request (CSR, PEM) for `role/name`, signed by the machine's own key: the key
    never leaves the machine."""
    key = load_key(key_pem)
    csr = (x509.CertificateSigningRequestBuilder()
           .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name[:64]),
                                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role)]))
           .sign(key, hashes.SHA256()))
    return csr.public_bytes(serialization.Encoding.PEM).decode()


def _alt_names(role: str, name: str, hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(f"{URI_PREFIX}{role}:{name}")]
    for host in dict.fromkeys(hosts):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host.strip("[]"))))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def sign_request(csr_pem: str, intermediate: Issued, *, role: str, name: str, hosts: tuple[str, ...], now: float,
                 lifetime_s: float = MACHINE_LIFE) -> str:
    """A certificate for `role/name` over the request's public key, signed by `intermediate`,
    naming `hosts` (DNS names and IP addresses the machine is reached at). The request's own subject
    is ignored: the cluster says who the machine is, never the machine. Raises CaError."""
    if role not in MACHINE_ROLES:
        raise CaError(f"role must be one of {', '.join(MACHINE_ROLES)}")
    try:
        csr = x509.load_pem_x509_csr(csr_pem.encode())
    except ValueError as e:
        raise CaError(f"not a PEM certificate request: {e}") from None
    if not csr.is_signature_valid:
        raise CaError("the certificate request's signature does not match its key")
    public = csr.public_key()
    if not isinstance(public, ec.EllipticCurvePublicKey) or public.curve.name != "secp256r1":
        raise CaError("the certificate request must be for an ECDSA P-256 key (llmgw makes one)")
    ca_cert, ca_key = load_cert(intermediate.cert_pem), load_key(intermediate.key_pem)
    until = min(now + lifetime_s, ca_cert.not_valid_after_utc.timestamp())
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "llmgw"),
                                     x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                                     x509.NameAttribute(NameOID.COMMON_NAME, name[:64])]))
            .issuer_name(ca_cert.subject).public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(_time(now - BACKDATE)).not_valid_after(_time(until))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.SubjectAlternativeName(_alt_names(role, name, hosts)), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256()))
    return _cert_pem(cert)


def identity(cert: x509.Certificate | str | bytes, issuers: dict[str, x509.Certificate] | None = None) -> Identity:
    """Who `cert` names (its `urn:llmgw:` URI), its serial and expiry, and which of `issuers`
    (intermediates by serial) signed it. Raises CaError for a certificate that names no llmgw machine."""
    if not isinstance(cert, x509.Certificate):
        cert = x509.load_der_x509_certificate(cert) if isinstance(cert, bytes) and not cert.startswith(b"-----") \
            else load_cert(cert)
    try:
        alt = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise CaError("the certificate names no llmgw machine (no subject alternative name)") from None
    uris = [u for u in alt.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(URI_PREFIX)]
    if len(uris) != 1:
        raise CaError("the certificate names no llmgw machine (no urn:llmgw: URI)")
    role, _, name = uris[0][len(URI_PREFIX):].partition(":")
    if role not in MACHINE_ROLES or not name:
        raise CaError(f"the certificate's {uris[0]!r:.80} names no llmgw role")
    issuer_serial = ""
    for serial, issuer in (issuers or {}).items():
        if issuer.subject == cert.issuer:
            try:
                cert.verify_directly_issued_by(issuer)
            except (ValueError, TypeError, InvalidSignature):
                continue
            issuer_serial = serial
            break
    return Identity(role, name, serial_hex(cert), cert.not_valid_after_utc.timestamp(), issuer_serial)


def split_pem(text: str) -> list[str]:
    """The certificates in a PEM bundle, each as its own PEM text."""
    end = "-----END CERTIFICATE-----"
    return [part.strip() + "\n" + end + "\n" for part in text.split(end) if "-----BEGIN CERTIFICATE-----" in part]


def roots_hash(bundle_pem: str) -> str:
    """`sha256:HEX` of a bundle's self-signed certificates, sorted: what a joining machine pins
    (`--ca-hash`). It changes only when the root does, not at a rotation of intermediates."""
    roots = sorted({p for p in split_pem(bundle_pem) if (c := load_cert(p)).issuer == c.subject})
    return "sha256:" + hashlib.sha256("".join(roots).encode()).hexdigest()


def fingerprint(cert_pem: str) -> str:
    return "sha256:" + load_cert(cert_pem).fingerprint(hashes.SHA256()).hex()


def not_after(cert_pem: str) -> float:
    return load_cert(cert_pem).not_valid_after_utc.timestamp()


def _fernet(secret: str) -> Fernet:
    digest = hashlib.sha256(_SEAL_CONTEXT + b"\0" + secret.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def seal(key_pem: str, secret: str) -> str:
    """An intermediate's key sealed with the cluster secret, for the Raft state."""
    return _fernet(secret).encrypt(key_pem.encode()).decode()


def unseal(sealed: str, secret: str) -> str:
    try:
        return _fernet(secret).decrypt(sealed.encode()).decode()
    except InvalidToken:
        raise CaError("the intermediate CA's key is not sealed with this member's cluster secret") from None

