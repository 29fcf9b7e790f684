"""A node back from a long time offline: its client certificate expired and so did its bootstrap token. It says,
in one line (log, /healthz detail through `problem()`, the record `edgelet describe node` shows), what an operator
must do, and joins with no restart once a new token is written to its config file."""

from __future__ import annotations

import asyncio
import logging
import textwrap
import time

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from edgelet.bootstrap import ACTION_RECORD
from edgelet.bootstrap.manager import CLIENT_KEY, ClientCertificateManager
from edgelet.cli.describe import describe_node
from edgelet.config import load_config
from edgelet.util.checkpoint import CheckpointStore
from tests.helpers import eventually
from tests.kubeapi_double import ApiServerDouble
from tests.kubeapi_double.joining import ClusterPKI

OLD_TOKEN = "abcdef.0123456789abcdef"
NEW_TOKEN = "ghijkl.fedcba9876543210"


def write_config(path, server: str, ca_file, token: str) -> None:
    temporary = path.with_suffix(".tmp")
    temporary.write_text(textwrap.dedent(f"""\
        node_name = "edge-1"
        [cluster]
        server = "{server}"
        ca_file = "{ca_file}"
        bootstrap_token = "{token}"
        """))
    temporary.rename(path)


async def test_expired_certificate_and_token_name_the_fix_and_a_new_token_joins_without_restart(tmp_path, caplog):
    pki = ClusterPKI(tmp_path / "cluster")
    # The certificate the node had when it went offline, expired since.
    key = ec.generate_private_key(ec.SECP256R1())
    stale = pki._issue(key.public_key(), "system:node:edge-1", ["system:nodes"], 1)
    CheckpointStore(tmp_path / "pki", kind="pki").write(CLIENT_KEY, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        + stale.public_bytes(serialization.Encoding.PEM))
    time.sleep(1.1)
    with ApiServerDouble(ssl_context=pki.server_context(), token=NEW_TOKEN) as api:  # the old token is gone
        api.csr_signer = pki.sign
        config_path = tmp_path / "edgelet.toml"
        write_config(config_path, api.url, pki.ca_file, OLD_TOKEN)
        joined = asyncio.Event()
        manager = ClientCertificateManager(load_config(config_path).cluster, "edge-1", str(tmp_path / "pki"),
                                           config_path=str(config_path), state_dir=str(tmp_path / "state"))
        assert not manager.valid()
        with caplog.at_level(logging.INFO, logger="edgelet.bootstrap.manager"):
            task = asyncio.create_task(manager.run(joined.set))
            try:
                await eventually(lambda: manager.operator_action() is not None, timeout=10)
                action = manager.problem()
                assert action.startswith("the client certificate expired at ")
                assert (f"refuses bootstrap token abcdef (expired or deleted): write a new token (kubeadm token "
                        f"create) to [cluster] bootstrap_token in {config_path}") in action
                record = tmp_path / "state" / ACTION_RECORD
                await eventually(record.exists)
                assert record.read_text().strip() == action
                assert f"Bootstrap:  {action}" in describe_node("edge-1", None, [], time.time(), record.read_text())
                await asyncio.sleep(2.5)  # retries: the line is said once
                assert [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR] == [action]

                write_config(config_path, api.url, pki.ca_file, NEW_TOKEN)
                await asyncio.wait_for(joined.wait(), 90)
            finally:
                task.cancel()
        assert manager.valid() and manager.problem() is None and not record.exists()
        assert "a new bootstrap token (id ghijkl)" in caplog.text
        assert "fedcba9876543210" not in caplog.text and "0123456789abcdef" not in caplog.text
