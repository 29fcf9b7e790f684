"""The conformance runner's reading of ginkgo's junit report and log (pure: files the test writes)."""

from __future__ import annotations

from pathlib import Path

from tests.conformance.run import flaky_specs, junit_results

JUNIT = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites><testsuite name="Kubernetes e2e suite">
  <testcase name="[SynchronizedBeforeSuite]" status="passed"></testcase>
  <testcase name="[It] [sig-node] Pods should get a host IP [NodeConformance] [Conformance]" status="passed"></testcase>
  <testcase name="[It] [sig-node] Probing container should be restarted [NodeConformance]" status="failed">
    <failure message="boom"></failure></testcase>
  <testcase name="[It] [sig-node] Lease should be fine [Conformance]" status="skipped"><skipped/></testcase>
  <testcase name="[It] [sig-node] PrivilegedPod [NodeConformance] should enable privileged commands [LinuxOnly]"
    status="skipped"><skipped/></testcase>
  <testcase name="[It] [sig-node] Slow one [NodeConformance] [Slow]" status="skipped"><skipped/></testcase>
  <testcase name="[It] [sig-node] Timed out [NodeConformance]" status="timedout"></testcase>
  <testcase name="[ReportAfterSuite] Kubernetes e2e suite report" status="failed"></testcase>
</testsuite></testsuites>
"""


def test_junit_counts_specs_and_only_the_focus_specs_left_out_here(tmp_path: Path):
    report = tmp_path / "junit.xml"
    report.write_text(JUNIT)
    passed, failed, skipped = junit_results(report)
    assert passed == ["[It] [sig-node] Pods should get a host IP [NodeConformance] [Conformance]"]
    # A failed suite node and a spec that timed out count as failures; a filtered spec (not in the focus, or
    # [Slow]) is not "skipped here".
    assert failed == ["[It] [sig-node] Probing container should be restarted [NodeConformance]",
                      "[It] [sig-node] Timed out [NodeConformance]",
                      "[ReportAfterSuite] Kubernetes e2e suite report"]
    assert skipped == ["[It] [sig-node] PrivilegedPod [NodeConformance] should enable privileged commands [LinuxOnly]"]


def test_flaky_specs_are_the_ones_ginkgo_passed_on_a_later_attempt(tmp_path: Path):
    log = tmp_path / "ginkgo.log"
    log.write_text("•\n• [FLAKEY TEST - TOOK 2 ATTEMPTS TO PASS] [12.1 seconds]\n"
                   "[sig-node] Probing container should be restarted [NodeConformance]\n•\n")
    assert flaky_specs(log) == ["[sig-node] Probing container should be restarted [NodeConformance]"]
    log.write_text("•\n•\n")
    assert flaky_specs(log) == []
