"""`make conformance`: Kubernetes' own `[NodeConformance]` e2e specs against an edgelet node of a 1.36 cluster.

A private containerd with the upstream test images, the 1.36 control plane of hack/control-plane.sh (scheduler and
controller-manager included), kube-proxy in iptables mode for the Service network, and `edgelet run` as the only
node; then ginkgo runs e2e.test of the same release. The last line printed is
`CONFORMANCE passed=N failed=N skipped=N flaky=N wall_s=N`, after the names of the failed and flaky specs; the exit
status is non-zero when a spec failed. `skipped` counts the specs of the focus that SKIPPED_HERE (below, each with
its reason) leaves out; the focus and skip expressions select 236 specs of 1.36.2.

Environment: CONFORMANCE_PROCS (ginkgo processes, default 8: most specs wait out probe and grace periods),
CONFORMANCE_FOCUS (a narrower focus, for a single spec while working on it), CONFORMANCE_OUT (where junit.xml, the
ginkgo output and every component's log are kept; default a fresh temporary directory, kept afterwards),
CONTAINERD (the runtime's release, default 2.1).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

from tests.e2e.conftest import loopback_node_name
from tests.helpers import wait_for
from tests.integration.agent_harness import free_port

REPO = Path(__file__).resolve().parents[2]
HACK = REPO / "hack"
FOCUS = r"\[NodeConformance\]"
SKIP = r"\[Serial\]|\[Disruptive\]|\[Flaky\]|\[Feature:[^\]]+\]|\[Slow\]"
# Specs this machine's cluster cannot run, whatever the node does. Each names what is missing here.
SKIPPED_HERE = {
    # The pods of these four specs run registry.k8s.io/e2e-test-images/glibc-dns-testing (`hostname -f` through
    # glibc's resolver), which is not among the images that can be built here (../shared/k8s/README.md) and nothing
    # can be pulled. The three specs of the same group that the API server must refuse run.
    r"Override hostname of Pod.*(will have hostnameOverride as hostname|value that is a valid DNS subdomain)":
        "image glibc-dns-testing cannot be built here",
    # The host-network test pod sends `echo hostName | nc -w 1 -u POD_IP 8081`; the agnhost image built here carries
    # Debian 12's busybox, whose nc has no -u ("nc: invalid option -- 'u'", exit 1, before any packet is sent). The
    # kubelet 1.36 failed it on this harness too; the tcp and http node-pod specs pass.
    r"should function for node-pod communication: udp": "agnhost's busybox nc here has no UDP mode",
    # The pod prints its environment with `sh -c env` and the spec looks for `data-1=value-1` and `p-data-1=...`
    # (envFrom keys with dashes). The busybox image built here is Debian 12's busybox 1.35, whose shell drops variables
    # whose names are not shell identifiers before running `env`: `env -i data-1=y GOOD=1 busybox sh -c env` prints
    # GOOD=1 alone, while `busybox env` prints both. edgelet hands the variables to the process (tests/integration/
    # test_cluster_env.py runs `env` directly); the kubelet 1.36 failed these two on this harness too.
    r"\] (ConfigMap|Secrets) should be consumable via the environment \[":
        "the busybox image's shell here drops variables with dashes",
    # The privileged container runs `ip link add dummy1 type dummy`; this machine's kernel has no dummy link type
    # (`# CONFIG_DUMMY is not set` in /proc/config.gz; root on the host gets "Unknown device type" in a network
    # namespace of its own), so the container gets "RTNETLINK answers: Operation not supported". The pod runs
    # privileged; tests/integration/test_security_context.py checks what privileged gives from inside.
    r"PrivilegedPod \[NodeConformance\] should enable privileged commands":
        "this machine's kernel has no dummy network device",
}
SERVICE_CIDR = "10.96.0.0/24"
# A spec that fails is run again up to this many attempts in all (CONFORMANCE_FLAKE_ATTEMPTS): the machine is
# shared and the specs wait on clocks. A spec that needed a second attempt is named in the output as flaky.
FLAKE_ATTEMPTS = int(os.environ.get("CONFORMANCE_FLAKE_ATTEMPTS", "2"))
# The agnhost release ../shared/k8s/images holds, and the other tags it is imported under.
AGNHOST = "2.63.0"
AGNHOST_TAGS = ("2.55",)


def log(message: str) -> None:
    print(f"conformance: {message}", file=sys.stderr, flush=True)


def run(*args: str, timeout: float = 600, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, **kwargs)
    if result.returncode != 0:
        raise SystemExit(f"conformance: {' '.join(args)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return result


class Cluster:
    """Everything one run starts, stopped in reverse order by `close`."""

    def __init__(self, out: Path):
        self.out = out
        self.node = loopback_node_name()
        self.containerd_dir = out / "containerd"
        self.plane_dir = out / "control-plane"
        self.agent_dir = out / "agent"
        self.bin = Path(run("bash", str(HACK / "k8s-binaries.sh"), "fetch").stdout.strip())
        self.kubectl = Path(run("bash", str(HACK / "debian-archive.sh"), "fetch", "kubectl", "sid")
                            .stdout.strip()) / "usr" / "bin" / "kubectl"
        self.processes: list[subprocess.Popen] = []
        self.endpoint = ""
        self.proxy_started = False

    @property
    def admin(self) -> Path:
        return self.plane_dir / "admin.kubeconfig"

    def kubectl_run(self, *args: str, check: bool = False) -> subprocess.CompletedProcess:
        result = subprocess.run([str(self.kubectl), "--kubeconfig", str(self.admin), *args], capture_output=True,
                                text=True, timeout=60)
        if check and result.returncode != 0:
            raise SystemExit(f"conformance: kubectl {' '.join(args)}: {result.stderr}")
        return result

    def start_runtime(self) -> None:
        self.endpoint = run("bash", str(HACK / "local-containerd.sh"), "start", str(self.containerd_dir)).stdout.strip()
        instance = dict(line.split("=", 1) for line in (self.containerd_dir / "instance.env").read_text().splitlines()
                        if "=" in line)
        images = run("bash", str(HACK / "k8s-binaries.sh"), "images").stdout.strip()
        socket_path = self.endpoint.removeprefix("unix://")
        ctr = f"{instance['BIN']}/ctr"
        run("sh", f"{images}/import-images.sh", socket_path, ctr)
        self.add_bash_to_agnhost(Path(images) / "images" / f"agnhost_{AGNHOST}.tar", socket_path, ctr)
        log(f"containerd {instance.get('RELEASE')} at {self.endpoint}, e2e images imported")

    def add_bash_to_agnhost(self, archive: Path, socket_path: str, ctr: str) -> None:
        """The upstream agnhost image has bash (its base is Debian's); the stand-in built from busybox here has not,
        and specs run `/bin/bash -c`. A layer with Debian's static bash brings the stand-in that much closer to the
        real image; the image keeps its names."""
        bash = Path(run("bash", str(HACK / "debian-archive.sh"), "fetch", "bash-static", "bookworm").stdout.strip())
        work = self.out / "agnhost"
        layout, bundle = work / "layout", work / "bundle"
        shutil.rmtree(work, ignore_errors=True)
        layout.mkdir(parents=True)
        run("tar", "-xf", str(archive), "-C", str(layout))
        run("umoci", "unpack", "--image", f"{layout}:{AGNHOST}", str(bundle))
        shutil.copy(bash / "bin" / "bash-static", bundle / "rootfs" / "bin" / "bash")
        run("umoci", "repack", "--image", f"{layout}:{AGNHOST}", str(bundle))
        run("tar", "-cf", str(work / "agnhost.tar"), "-C", str(layout), ".")
        name = "registry.k8s.io/e2e-test-images/agnhost"
        images = [ctr, "-a", socket_path, "-n", "k8s.io", "images"]
        run(*images, "import", "--base-name", name, str(work / "agnhost.tar"))
        for tag in AGNHOST_TAGS:
            run(*images, "tag", "--force", f"{name}:{AGNHOST}", f"{name}:{tag}")
        shutil.rmtree(work)

    def start_control_plane(self) -> None:
        env = dict(os.environ, EDGELET_E2E_SERVICE_CIDR=SERVICE_CIDR)
        run("bash", str(HACK / "control-plane.sh"), "start", str(self.plane_dir), self.node, env=env, timeout=1800)
        log(f"control plane up ({self.admin})")

    def start_kube_proxy(self) -> None:
        """kube-proxy 1.36 in iptables mode: Service ClusterIPs reach pods on this host (the specs' Services)."""
        config = self.out / "kube-proxy.yaml"
        kubeconfig = run("bash", str(HACK / "control-plane.sh"), "kubeconfig", str(self.plane_dir), "kube-proxy",
                         "system:kube-proxy").stdout.strip()
        config.write_text(textwrap.dedent(f"""\
            apiVersion: kubeproxy.config.k8s.io/v1alpha1
            kind: KubeProxyConfiguration
            mode: iptables
            hostnameOverride: {self.node}
            bindAddress: 127.0.0.1
            healthzBindAddress: 127.0.0.1:{free_port()}
            metricsBindAddress: 127.0.0.1:{free_port()}
            clientConnection:
              kubeconfig: {kubeconfig}
            conntrack:
              maxPerCore: 0
            """))
        self.spawn("kube-proxy", [str(self.bin / "kube-proxy"), f"--config={config}"])
        self.proxy_started = True

    def start_agent(self) -> None:
        pki = self.plane_dir / "pki"
        cert, key = self.serving_certificate(pki)
        node_kubeconfig = run("bash", str(HACK / "control-plane.sh"), "kubeconfig", str(self.plane_dir),
                              f"node-{self.node}", f"system:node:{self.node}", "system:nodes").stdout.strip()
        root = self.agent_dir / "root"
        manifests = self.agent_dir / "manifests"
        manifests.mkdir(parents=True, exist_ok=True)
        config = self.agent_dir / "edgelet.toml"
        config.write_text(textwrap.dedent(f"""\
            node_name = "{self.node}"
            root_dir = "{root}"
            pod_logs_dir = "{self.agent_dir / "log" / "pods"}"
            container_logs_dir = "{self.agent_dir / "log" / "containers"}"
            log_level = "debug"

            [runtime]
            endpoint = "{self.endpoint}"

            [pods]
            manifest_dir = "{manifests}"

            [server]
            address = "127.0.0.1:{free_port()}"

            [cluster]
            kubeconfig = "{node_kubeconfig}"

            [kubelet_api]
            address = "127.0.0.1:{free_port()}"
            tls_cert_file = "{cert}"
            tls_private_key_file = "{key}"

            [eviction.hard]
            "memory.available" = "1Mi"
            "nodefs.available" = "1%"
            "imagefs.available" = "1%"
            "nodefs.inodesFree" = "1%"
            """))
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.spawn("edgelet", [sys.executable, "-m", "edgelet", "run", "--config", str(config)], env=env)
        wait_for(self.node_ready, 120, interval=0.5, what=f"node {self.node} Ready")
        log(f"edgelet is node {self.node}, Ready")

    def node_ready(self) -> bool:
        result = self.kubectl_run("get", "node", self.node, "-o",
                                  "jsonpath={.status.conditions[?(@.type=='Ready')].status}")
        return result.stdout.strip() == "True"

    def serving_certificate(self, pki: Path) -> tuple[Path, Path]:
        """The kubelet API's serving certificate, signed by the cluster CA the apiserver checks it against."""
        cert, key, request = pki / "kubelet.crt", pki / "kubelet.key", pki / "kubelet.csr"
        extensions = pki / "kubelet.ext"
        extensions.write_text(f"subjectAltName=DNS:{self.node},IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
                              "keyUsage=critical,digitalSignature,keyEncipherment\n")
        run("openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-subj", f"/CN={self.node}", "-keyout", str(key), "-out", str(request))
        run("openssl", "x509", "-req", "-in", str(request), "-CA", str(pki / "ca.crt"), "-CAkey", str(pki / "ca.key"),
            "-CAcreateserial", "-days", "2", "-sha256", "-extfile", str(extensions), "-out", str(cert))
        key.chmod(0o600)
        return cert, key

    def spawn(self, name: str, args: list[str], env: dict | None = None) -> None:
        output = open(self.out / f"{name}.log", "ab")
        self.processes.append(subprocess.Popen(args, stdout=output, stderr=subprocess.STDOUT, env=env,
                                               start_new_session=True))
        output.close()

    def close(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(20)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        subprocess.run(["bash", str(HACK / "control-plane.sh"), "stop", str(self.plane_dir)], capture_output=True,
                       timeout=120)
        subprocess.run(["bash", str(HACK / "local-containerd.sh"), "stop", str(self.containerd_dir)],
                       capture_output=True, timeout=300)
        if self.proxy_started:
            subprocess.run([str(self.bin / "kube-proxy"), "--cleanup"], capture_output=True, timeout=60)


def ginkgo(cluster: Cluster, out: Path, procs: int) -> int:
    skip = "|".join([SKIP, *SKIPPED_HERE])
    # ginkgo ORs several --focus: a narrower focus replaces the suite's.
    focus = os.environ.get("CONFORMANCE_FOCUS") or FOCUS
    args = [str(cluster.bin / "ginkgo"), f"--procs={procs}", f"--focus={focus}", f"--skip={skip}",
            "--timeout=3h", "--no-color", f"--output-dir={out}", "--junit-report=junit.xml",
            "--poll-progress-after=10m", f"--flake-attempts={FLAKE_ATTEMPTS}"]
    args += [str(cluster.bin / "e2e.test"), "--", f"--kubeconfig={cluster.admin}", "--provider=skeleton",
             f"--kubectl-path={cluster.kubectl}", f"--report-dir={out}", "--allowed-not-ready-nodes=0",
             "--system-pods-startup-timeout=1m", "--node-os-distro=debian"]
    log(f"ginkgo --procs={procs} (output in {out / 'ginkgo.log'})")
    with open(out / "ginkgo.log", "wb") as output:
        return subprocess.run(args, stdout=output, stderr=subprocess.STDOUT, cwd=out).returncode


def junit_results(path: Path) -> tuple[list[str], list[str], list[str]]:
    """Names of the passed, failed and skipped specs in ginkgo's junit report, and of any suite-level node that
    failed (counted as failed). Skipped are the specs of the focus that SKIPPED_HERE left out: ginkgo reports every
    spec it filtered as skipped too."""
    passed, failed, skipped = [], [], []
    left_out_here = re.compile("|".join(SKIPPED_HERE))
    focus, skip = re.compile(FOCUS), re.compile(SKIP)
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        name, status = case.get("name", ""), case.get("status", "")
        if not name.startswith("[It]"):
            if status == "failed":
                failed.append(name)
        elif status == "passed":
            passed.append(name)
        elif status == "skipped":
            if focus.search(name) and not skip.search(name) and left_out_here.search(name):
                skipped.append(name)
        else:
            failed.append(name)
    return passed, failed, skipped


def flaky_specs(ginkgo_log: Path) -> list[str]:
    """Specs ginkgo passed only after more than one attempt: its report line, then the spec's text."""
    lines = ginkgo_log.read_text(errors="replace").splitlines()
    return [lines[i + 1].strip() for i, line in enumerate(lines[:-1]) if "[FLAKEY TEST - TOOK" in line]


def main() -> int:
    if os.geteuid() != 0:
        raise SystemExit("conformance: needs root (containerd, kube-proxy's iptables rules)")
    out = Path(os.environ.get("CONFORMANCE_OUT") or tempfile.mkdtemp(prefix="edgelet-conformance."))
    out.mkdir(parents=True, exist_ok=True)
    procs = int(os.environ.get("CONFORMANCE_PROCS", "8"))
    # A SIGTERM (CI's time limit, a Ctrl-C'd make) stops what was started too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    started = time.monotonic()
    cluster = Cluster(out)
    try:
        cluster.start_runtime()
        cluster.start_control_plane()
        cluster.start_kube_proxy()
        cluster.start_agent()
        code = ginkgo(cluster, out, procs)
    finally:
        cluster.close()
    report = out / "junit.xml"
    if not report.exists():
        print((out / "ginkgo.log").read_text(errors="replace")[-5000:])
        raise SystemExit(f"conformance: ginkgo exited {code} without a report")
    passed, failed, skipped = junit_results(report)
    flaky = flaky_specs(out / "ginkgo.log")
    for name in flaky:
        print(f"FLAKY (passed on a later attempt) {name}")
    for name in failed:
        print(f"FAILED {name}")
    wall = time.monotonic() - started
    print(f"CONFORMANCE passed={len(passed)} failed={len(failed)} skipped={len(skipped)} flaky={len(flaky)} "
          f"wall_s={wall:.0f}")
    return 1 if failed or code != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
