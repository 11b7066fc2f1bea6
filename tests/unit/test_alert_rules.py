"""The shipped alert rules (docs/alerts/llmgw.rules.yml): valid (`promtool check rules`), each alert unit-tested
(`promtool test rules` on docs/alerts/llmgw.rules.test.yml), one for each condition kind, and every metric they
read one llmgw exports (docs/observability.md's tables). promtool comes from Debian's `prometheus` package;
.ci/system-packages.sh installs it for CI."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from llmgw.domain.conditions import KINDS

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "docs" / "alerts" / "llmgw.rules.yml"
TESTS = REPO / "docs" / "alerts" / "llmgw.rules.test.yml"
# Read by a rule, exported by no code yet: none (certificates are exported since llmgw serves TLS).
NOT_EXPORTED_YET: set[str] = set()


def promtool() -> str:
    found = shutil.which("promtool") or next(
        (str(p) for p in (Path(sys.prefix) / "bin" / "promtool",) if p.exists()), None)
    if found is None:
        pytest.skip("promtool is not installed (Debian: apt-get install prometheus, or `make system-packages`, "
                    "which extracts promtool alone from that package)")
    return found


def alerts() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(RULES.read_text(encoding="utf-8"))
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"]}


def test_promtool_finds_the_rules_valid() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout


def test_promtool_unit_tests_pass() -> None:
    done = subprocess.run([promtool(), "test", "rules", TESTS.name], capture_output=True, text=True, timeout=120,
                          cwd=TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr


def test_each_alert_is_tested_firing_and_not_firing() -> None:
    doc = yaml.safe_load(TESTS.read_text(encoding="utf-8"))
    fired: set[str] = set()
    quiet: set[str] = set()
    for case in doc["tests"]:
        for check in case["alert_rule_test"]:
            (fired if check.get("exp_alerts") else quiet).add(check["alertname"])
    assert set(alerts()) <= fired, f"never seen firing: {sorted(set(alerts()) - fired)}"
    assert set(alerts()) <= quiet, f"never seen quiet: {sorted(set(alerts()) - quiet)}"


def test_each_condition_kind_has_an_alert() -> None:
    kinds = {k for r in alerts().values() for k in re.findall(r'kind="(\w+)"', r["expr"])}
    assert kinds == set(KINDS) - {"no_leader"}, kinds  # no_leader: the direct LlmgwNoLeader (no leader posts it)
    assert "LlmgwNoLeader" in alerts()


def test_every_metric_a_rule_reads_is_exported() -> None:
    text = (REPO / "docs" / "observability.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `(llmgw_[a-z_]+)` \|", text, re.MULTILINE))
    assert "llmgw_condition" in documented
    read = {m for r in alerts().values() for m in re.findall(r"\bllmgw_[a-z_]+", r["expr"])}
    assert read - documented - NOT_EXPORTED_YET == set(), read - documented


def test_every_alert_says_what_to_do_and_how_bad() -> None:
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in ("critical", "warning", "info"), name
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), name
        anchor = rule["annotations"]["runbook"].partition("#")[2]
        assert f'<a id="{anchor}"></a>' in (REPO / "docs" / "observability.md").read_text(encoding="utf-8"), name


def test_llmgw_serves_tls_so_its_certificates_are_exported_and_alerted_on() -> None:
    """llmgw serves TLS (llmgw/trust): every certificate in use is exported (`llmgw_cert_expiry_seconds`,
    documented) and an alert reads the `cert_expiring` condition made from the same facts."""
    tls = re.compile(r"\bimport ssl\b|\bfrom ssl\b|\bssl_context\b")
    using = sorted(str(p.relative_to(REPO)) for p in (REPO / "llmgw").rglob("*.py")
                   if tls.search(p.read_text(encoding="utf-8")))
    assert using, "llmgw serves TLS"
    text = (REPO / "docs" / "observability.md").read_text(encoding="utf-8")
    assert "| `llmgw_cert_expiry_seconds` |" in text
    assert 'kind="cert_expiring"' in alerts()["LlmgwCertificateExpiring"]["expr"]
    assert not NOT_EXPORTED_YET
