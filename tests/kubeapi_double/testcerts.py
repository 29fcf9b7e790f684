"""Throwaway TLS material for tests: a self-signed EC certificate (CA:TRUE, valid 100 years), its
key, and an unrelated key; and openssl-made CAs with client certificates. Made for tests only; it protects nothing."""

import os
import subprocess

TEST_CERT = """-----BEGIN CERTIFICATE-----
MIIBkzCCATmgAwIBAgIUYF1GXiAhhW5evty9dVvW2Wzk9jIwCgYIKoZIzj0EAwIw
HjEcMBoGA1UEAwwTZWRnZWxldC10ZXN0LWNsaWVudDAgFw0yNjExMzAwOTI5MDFa
GA8yMTI2MTEwNjA5MjkwMVowHjEcMBoGA1UEAwwTZWRnZWxldC10ZXN0LWNsaWVu
dDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABBL5ToS7S+1BfGf1cZctCbKUQTrG
y+k9UVVzKmc/ogjXlNtva7t5Hi+ZSEGOBmw2FdX4+MX0Y6oQCT7RbIjJVjmjUzBR
MB0GA1UdDgQWBBREFhdrL2u3wvS+okAJLyLDn9WFEzAfBgNVHSMEGDAWgBREFhdr
L2u3wvS+okAJLyLDn9WFEzAPBgNVHRMBAf8EBTADAQH/MAoGCCqGSM49BAMCA0gA
MEUCIDLtL8155kTy6NwgVXx3h13NweaP/JCZyB8JI8yTIfi2AiEAzvtDvWBgKjk6
JJ2GGxUMZEuIatvsgq90xKcIZZoQEGc=
-----END CERTIFICATE-----
"""
TEST_KEY = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQgQi7jaV2+TAyX9dYG
OQj4aAUlDfItn5tgclosILxHOuWhRANCAAQS+U6Eu0vtQXxn9XGXLQmylEE6xsvp
PVFVcypnP6II15Tbb2u7eR4vmUhBjgZsNhXV+PjF9GOqEAk+0WyIyVY5
-----END PRIVATE KEY-----
"""
OTHER_KEY = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQg8y35/L7ZuFhUmyMr
ulqUkJaZp5f82OkzjnOO+zdEDLuhRANCAATZB90ft06/wRyvFVcnc5Rb3yoJmSNE
nxSQsvDtAT8md15tUlZflyodcqRH3Ce7tt/cVMUt/5HawKnwdGTuMYlx
-----END PRIVATE KEY-----
"""


def make_ca(directory, name: str = "edgelet-test-ca") -> tuple[str, str]:
    """A fresh EC certificate authority made with openssl under `directory`: (cert path, key path)."""
    cert, key = os.path.join(directory, f"{name}.crt"), os.path.join(directory, f"{name}.key")
    subprocess.run(["openssl", "req", "-x509", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-keyout", key, "-out", cert, "-days", "2", "-subj", f"/CN={name}",
                    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign"],
                   check=True, capture_output=True)
    return cert, key


def issue_client_cert(directory, ca: tuple[str, str], common_name: str, *organizations: str) -> tuple[str, str]:
    """A client certificate for CN=common_name, O=each organization, signed by `ca`: (cert path, key path)."""
    ca_name = os.path.splitext(os.path.basename(ca[0]))[0]
    base = os.path.join(directory, f"{ca_name}-{common_name.replace(':', '_')}")
    subject = "".join(f"/O={org}" for org in organizations) + f"/CN={common_name}"
    subprocess.run(["openssl", "req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-keyout", f"{base}.key", "-out", f"{base}.csr", "-subj", subject], check=True, capture_output=True)
    extensions = f"{base}.ext"
    with open(extensions, "w") as file:
        file.write("extendedKeyUsage=clientAuth\nkeyUsage=critical,digitalSignature\n")
    subprocess.run(["openssl", "x509", "-req", "-in", f"{base}.csr", "-CA", ca[0], "-CAkey", ca[1], "-CAcreateserial",
                    "-out", f"{base}.crt", "-days", "2", "-extfile", extensions], check=True, capture_output=True)
    return f"{base}.crt", f"{base}.key"
