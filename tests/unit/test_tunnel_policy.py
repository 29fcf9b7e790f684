"""The tunnel's pure decisions: identifiers as konnectivity-agent encodes them, which dials are spliced where,
how many streams to keep, what a failed stream is told as."""

from __future__ import annotations

import urllib.parse

import pytest

from edgelet.tunnel.policy import Destinations, agent_identifiers, describe_stream_error, split_host_port, stream_slots


@pytest.mark.parametrize("node, addresses, expected", [
    ("edge-1", [], "host=edge-1"),
    ("edge-1", ["10.0.0.5"], "host=edge-1&ipv4=10.0.0.5"),
    ("edge-1", ["fd00::5", "10.0.0.5", "edge-1"], "host=edge-1&ipv4=10.0.0.5&ipv6=fd00%3A%3A5"),
    ("edge-1", ["edge-1.example", "10.0.0.5", "10.0.0.5"], "host=edge-1&host=edge-1.example&ipv4=10.0.0.5"),
])
def test_identifiers_are_sorted_url_values(node, addresses, expected):
    assert agent_identifiers(node, addresses) == expected
    # konnectivity-server parses them with url.ParseQuery: the node name is among the hosts
    assert node in urllib.parse.parse_qs(expected)["host"]


@pytest.mark.parametrize("text, expected", [
    ("edge-1:10250", ("edge-1", 10250)),
    ("EDGE-1:10250", ("edge-1", 10250)),
    ("[fd00::1]:10250", ("fd00::1", 10250)),
    ("10.0.0.5:1", ("10.0.0.5", 1)),
    ("edge-1", None),
    (":10250", None),
    ("edge-1:0", None),
    ("edge-1:65536", None),
    ("edge-1:http", None),
    ("[fd00::1:10250", None),
])
def test_split_host_port(text, expected):
    assert split_host_port(text) == expected


NODE = Destinations.build("edge-1", ["10.0.0.5", "fd00::5"], "0.0.0.0:10250", ["127.0.0.1:9100"])


@pytest.mark.parametrize("address, target", [
    ("edge-1:10250", ("127.0.0.1", 10250)),         # the name the API server dials with Hostname
    ("Edge-1.:10250", ("127.0.0.1", 10250)),
    ("10.0.0.5:10250", ("127.0.0.1", 10250)),       # InternalIP
    ("[fd00:0::5]:10250", ("127.0.0.1", 10250)),    # the same IPv6 address spelled differently
    ("127.0.0.1:9100", ("127.0.0.1", 9100)),        # listed explicitly
    ("edge-1:22", None),                             # the node, another port
    ("10.0.0.6:10250", None),                        # another node's kubelet
    ("127.0.0.1:10250", None),                       # loopback is not the node's advertised address
    ("kubernetes.default:443", None),
    ("edge-1", None),
])
def test_only_the_kubelet_api_and_listed_destinations_are_dialled(address, target):
    assert NODE.target(address) == target


def test_a_kubelet_api_on_one_address_is_spliced_to_it():
    destinations = Destinations.build("edge-1", [], "127.0.0.2:11250")
    assert destinations.target("edge-1:11250") == ("127.0.0.2", 11250)
    assert destinations.target("edge-1:10250") is None
    assert Destinations.build("edge-1", [], "[::]:10250").target("edge-1:10250") == ("::1", 10250)


def test_bad_listen_or_allowed_addresses_are_refused_at_build():
    with pytest.raises(ValueError, match="kubelet API address"):
        Destinations.build("edge-1", [], "")
    with pytest.raises(ValueError, match="allowed destination"):
        Destinations.build("edge-1", [], "0.0.0.0:10250", ["nope"])


@pytest.mark.parametrize("configured, announced, slots", [
    (1, 0, 1),    # before any answer: the configured addresses
    (1, 1, 1),
    (2, 2, 2),    # one address per instance
    (1, 3, 3),    # a load-balanced address in front of three instances
    (2, 1, 2),    # never fewer streams than addresses
    (1, 1000, 8),  # bounded against a bad announcement
    (10, 1000, 64),
    (1, -5, 1),
])
def test_stream_slots_follow_the_announced_server_count(configured, announced, slots):
    assert stream_slots(configured, announced) == slots


@pytest.mark.parametrize("details, says", [
    # What the TLS splice reports (edgelet/tunnel/splice.py), in OpenSSL's words as Python's ssl gives them.
    ("TLS: [SSL: SSLV3_ALERT_BAD_CERTIFICATE] sslv3 alert bad certificate", "refused the node's client certificate"),
    ("TLS: [SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required",
     "refused the node's client certificate"),
    ("TLS: [SSL: TLSV1_ALERT_UNKNOWN_CA] tlsv1 alert unknown ca", "refused the node's client certificate"),
    ("TLS: certificate verify failed: self-signed certificate in certificate chain",
     "serving certificate is not trusted"),
    ("connect: Connection refused", "connect: Connection refused"),
    ("TLS: the server closed the connection before its first byte", "closed the connection before its first byte"),
    ("UNAVAILABLE: failed to connect to all addresses", "UNAVAILABLE"),
])
def test_stream_errors_name_what_to_fix(details, says):
    assert says in describe_stream_error(details)


def test_an_unreadable_tunnel_ca_file_is_one_error_naming_the_file_and_the_setting(tmp_path):
    from edgelet.cli.main import check_referenced_files
    from edgelet.config import parse_config
    from edgelet.util.errors import ConfigError

    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
                          "users: [{name: u, user: {}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
                          "current-context: x\n")
    for content, words in [(None, "cannot read the konnectivity-server CA (cluster.tunnel.ca_file)"),
                           ("not a certificate", "is not PEM text")]:
        ca = tmp_path / "konnectivity-ca.crt"
        if content is not None:
            ca.write_text(content)
        config = parse_config({"cluster": {"kubeconfig": str(kubeconfig),
                                           "tunnel": {"servers": ["127.0.0.1:8132"], "ca_file": str(ca)}}})
        with pytest.raises(ConfigError) as caught:
            check_referenced_files(config)
        assert str(ca) in str(caught.value) and words in str(caught.value)
