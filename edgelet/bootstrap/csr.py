"""CertificateSigningRequests as the kubelet makes them, and when to make the next one.

Key generation and the PKCS#10 signature use `cryptography` in a child process (edgelet.bootstrap.keygen): the agent
never loads it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

CLIENT_SIGNER = "kubernetes.io/kube-apiserver-client-kubelet"
SERVING_SIGNER = "kubernetes.io/kubelet-serving"
# Exactly these sets: kube-controller-manager's approver (1.20) leaves any other set Pending.
CLIENT_USAGES = ("digital signature", "key encipherment", "client auth")
SERVING_USAGES = ("digital signature", "key encipherment", "server auth")
NODES_GROUP = "system:nodes"
# The kubelet rotates at a random point in this part of the certificate's life.
ROTATION_WINDOW = (0.7, 0.9)


@dataclass(frozen=True, slots=True)
class KeyAndRequest:
    key_pem: bytes  # PKCS#8, unencrypted: it is stored 0600 under root_dir
    csr_pem: bytes


def node_user(node_name: str) -> str:
    return f"system:node:{node_name}"


def new_key_and_request(common_name: str, organization: str, *, dns_names: tuple[str, ...] = (),
                        ip_addresses: tuple[str, ...] = ()) -> KeyAndRequest:
    """A new ECDSA P-256 key (the kubelet's choice) and a CSR for it with this subject and SANs.

    Blocking (a child process makes them): call it from a thread in async code. Raises KeygenError.
    """
    from edgelet.bootstrap.keygen import in_child

    made = in_child({"kind": "csr", "common_name": common_name, "organization": organization,
                     "dns_names": list(dns_names), "ip_addresses": list(ip_addresses)})
    return KeyAndRequest(made["key"].encode("ascii"), made["csr"].encode("ascii"))


def csr_object(generate_name: str, csr_pem: bytes, signer: str, usages: tuple[str, ...]) -> dict:
    """A certificates.k8s.io/v1 CertificateSigningRequest (generateName: every request gets a new name)."""
    import base64

    return {
        "apiVersion": "certificates.k8s.io/v1",
        "kind": "CertificateSigningRequest",
        "metadata": {"generateName": generate_name},
        "spec": {"request": base64.b64encode(csr_pem).decode("ascii"), "signerName": signer,
                 "usages": list(usages)},
    }


def csr_outcome(csr: dict) -> tuple[str, str]:
    """("issued", PEM text) | ("denied" or "failed", message) | ("pending", "") for a CSR object."""
    status = csr.get("status") or {}
    for condition in status.get("conditions") or []:
        kind = condition.get("type")
        if kind in ("Denied", "Failed") and condition.get("status", "True") == "True":
            why = condition.get("message") or condition.get("reason") or "no reason given"
            return kind.lower(), why
    certificate = status.get("certificate")
    if certificate:
        return "issued", certificate
    return "pending", ""


def rotation_deadline(not_before: float, not_after: float, rng: random.Random | None = None) -> float:
    """When to request the next certificate: a random point in 70-90 % of the validity (epoch seconds),
    so a fleet issued together does not renew together."""
    low, high = ROTATION_WINDOW
    return not_before + (not_after - not_before) * (rng or random).uniform(low, high)
