"""edgelet keygen: keys, CSRs and self-signed certificates made in a child, so the agent never loads cryptography."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from edgelet.bootstrap.keygen import KeygenError, in_child, make

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

_MAKES_KEYS = """
import json, sys
from edgelet.bootstrap.csr import new_key_and_request
from edgelet.kubeletapi.certs import ensure_self_signed
made = new_key_and_request("system:node:n1", "system:nodes", ip_addresses=("127.0.0.1",))
cert, key = ensure_self_signed(sys.argv[1], "n1", ["127.0.0.1"])
print(json.dumps({"csr": made.csr_pem.decode(), "cert": open(cert).read(),
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] == "cryptography")}))
"""


def test_the_process_that_asks_never_loads_cryptography(tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [PACKAGE_ROOT, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, "-c", _MAKES_KEYS, str(tmp_path / "pki")], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["loaded"] == []
    csr = x509.load_pem_x509_csr(seen["csr"].encode())
    assert csr.is_signature_valid and csr.subject.rfc4514_string() == "CN=system:node:n1,O=system:nodes"
    assert x509.load_pem_x509_certificate(seen["cert"].encode()).subject.rfc4514_string().startswith("CN=n1@")


def test_the_child_answers_what_make_does():
    request = {"kind": "self-signed", "common_name": "n1@1", "dns_names": ["n1"], "ip_addresses": ["::1"],
               "not_before": 1_700_000_000, "days": 2}
    made = in_child(request)
    certificate = x509.load_pem_x509_certificate(made["certificate"].encode())
    key = serialization.load_pem_private_key(made["key"].encode(), None)
    assert key.public_key() == certificate.public_key()
    assert certificate.not_valid_before_utc.timestamp() == 1_700_000_000
    assert (certificate.not_valid_after_utc - certificate.not_valid_before_utc).days == 2
    assert set(make(request)) == set(made)


def test_a_bad_request_is_one_clear_error():
    with pytest.raises(KeygenError, match="bad request.*unknown kind"):
        in_child({"kind": "rsa", "common_name": "x"})
