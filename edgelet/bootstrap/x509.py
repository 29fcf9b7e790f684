"""Just enough DER reading for X.509 certificates: validity, serial and the public key.

Reading a stored certificate at every start must not load a crypto library (it costs ~10 MB of RSS);
the few fields edgelet needs sit at fixed places of the TBSCertificate.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import re
from dataclasses import dataclass

_PEM = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)-----END \1-----", re.DOTALL)


class CertificateError(ValueError):
    """Bytes that are not the PEM or DER a certificate should be."""


@dataclass(frozen=True, slots=True)
class Certificate:
    der: bytes
    serial: int
    not_before: float  # seconds since the epoch
    not_after: float
    spki_der: bytes  # SubjectPublicKeyInfo, what kubeadm's ca_cert_hash pins

    @property
    def lifetime(self) -> float:
        return self.not_after - self.not_before


def pem_blocks(data: bytes, label: str) -> list[bytes]:
    """The DER contents of every `-----BEGIN <label>-----` block, in order."""
    blocks = []
    for match in _PEM.finditer(data):
        if match.group(1).decode() == label:
            try:
                blocks.append(base64.b64decode(b"".join(match.group(2).split()), validate=True))
            except (binascii.Error, ValueError):
                raise CertificateError(f"a {label} block is not valid base64") from None
    return blocks


def first_certificate(pem: bytes) -> Certificate:
    """The first CERTIFICATE block of `pem` (a leaf comes first in a chain)."""
    blocks = pem_blocks(pem, "CERTIFICATE")
    if not blocks:
        raise CertificateError("no CERTIFICATE block")
    return parse_certificate(blocks[0])


def parse_certificate(der: bytes) -> Certificate:
    try:
        tag, start, end = _tlv(der, 0)
        _need(tag == 0x30 and end == len(der), "not a DER certificate")
        tag, pos, tbs_end = _tlv(der, start)
        _need(tag == 0x30, "no TBSCertificate")
        tag, value, after = _tlv(der, pos)
        if tag == 0xA0:  # [0] EXPLICIT version
            tag, value, after = _tlv(der, after)
        _need(tag == 0x02, "no serial number")
        serial = int.from_bytes(der[value:after], "big", signed=True)
        _, _, after = _tlv(der, after)  # signature AlgorithmIdentifier
        _, _, after = _tlv(der, after)  # issuer
        tag, validity, after_validity = _tlv(der, after)
        _need(tag == 0x30, "no validity")
        not_before, next_pos = _time(der, validity)
        not_after, _ = _time(der, next_pos)
        _, _, after = _tlv(der, after_validity)  # subject
        tag, _, spki_end = _tlv(der, after)
        _need(tag == 0x30, "no subjectPublicKeyInfo")
        return Certificate(der=der, serial=serial, not_before=not_before, not_after=not_after,
                           spki_der=der[after:spki_end])
    except IndexError:
        raise CertificateError("the certificate is truncated") from None


def _need(condition: bool, problem: str) -> None:
    if not condition:
        raise CertificateError(problem)


def _tlv(der: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of the value, end of the value) of the DER element at `pos`."""
    tag = der[pos]
    length = der[pos + 1]
    pos += 2
    if length & 0x80:
        count = length & 0x7F
        _need(0 < count <= 4, "unsupported DER length")
        length = int.from_bytes(der[pos:pos + count], "big")
        pos += count
    _need(pos + length <= len(der), "the certificate is truncated")
    return tag, pos, pos + length


def _time(der: bytes, pos: int) -> tuple[float, int]:
    tag, start, end = _tlv(der, pos)
    text = der[start:end].decode("ascii", "replace")
    if tag == 0x17 and re.fullmatch(r"\d{12}Z", text):  # UTCTime: YYMMDDHHMMSSZ, years 1950-2049
        year = int(text[:2])
        text = f"{1900 + year if year >= 50 else 2000 + year}{text[2:]}"
    elif not (tag == 0x18 and re.fullmatch(r"\d{14}Z", text)):
        raise CertificateError(f"unsupported certificate time {text!r}")
    fields = (int(text[0:4]), int(text[4:6]), int(text[6:8]), int(text[8:10]), int(text[10:12]), int(text[12:14]))
    return float(calendar.timegm(fields)), end
