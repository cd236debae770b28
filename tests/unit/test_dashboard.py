"""The shipped Grafana dashboard works both ways Grafana loads a dashboard: imported in the UI,
and provisioned from a file (what ``deploy/compose.yml`` does).

File provisioning loads the JSON as it is: it never substitutes an export's ``__inputs``
(``${DS_PROMETHEUS}`` stays literal and every panel says "Datasource ${DS_PROMETHEUS} was not
found"). A data source chosen through a dashboard variable of type ``datasource`` resolves at
run time in both cases, to the default Prometheus unless the user picks another.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import yaml

from tests.support import ROOT

DEPLOY = ROOT / "deploy"
DASHBOARD = json.loads((DEPLOY / "grafana" / "recalltrace.json").read_text(encoding="utf-8"))
VARIABLES = {v["name"]: v for v in DASHBOARD["templating"]["list"]}


def datasources(node: Any) -> Iterator[Any]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "datasource":
                yield value
            else:
                yield from datasources(value)
    elif isinstance(node, list):
        for item in node:
            yield from datasources(item)


def test_nothing_waits_for_an_import_to_substitute_it() -> None:
    assert "__inputs" not in DASHBOARD


def test_every_reference_names_a_variable_of_the_dashboard_or_grafana() -> None:
    text = json.dumps(DASHBOARD)
    names = set(re.findall(r"\$\{(\w+)(?::\w+)?\}", text)) | set(re.findall(r"\$(\w+)", text))
    unknown = {n for n in names if not n.startswith("__") and n not in VARIABLES}
    assert not unknown, unknown


def test_every_panel_reads_prometheus_through_the_datasource_variable() -> None:
    variable = VARIABLES["datasource"]
    assert variable["type"] == "datasource"
    assert variable["query"] == "prometheus"
    found = list(datasources(DASHBOARD["panels"])) + list(datasources(DASHBOARD["templating"]))
    assert found
    for source in found:
        assert source == {"type": "prometheus", "uid": "${datasource}"}, source


def test_the_provisioned_stack_offers_a_default_prometheus_and_loads_the_file() -> None:
    sources = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )["datasources"]
    defaults = [s for s in sources if s.get("isDefault")]
    assert [s["type"] for s in defaults] == ["prometheus"]
    providers = yaml.safe_load(
        (DEPLOY / "grafana" / "provisioning" / "dashboards" / "recalltrace.yml").read_text()
    )["providers"]
    compose = yaml.safe_load((DEPLOY / "compose.yml").read_text())
    mounts = compose["services"]["grafana"]["volumes"]
    folder = providers[0]["options"]["path"]
    assert any(m.endswith(f"{folder}/recalltrace.json:ro") for m in mounts), mounts


def test_the_stack_publishes_its_ports_on_loopback_and_not_on_a_local_postgres_port() -> None:
    """Every port of the compose stack is published on 127.0.0.1 only, and its Postgres not on
    5432, where a developer's own Postgres usually is (the stack would not start beside it)."""
    import re

    compose = yaml.safe_load((DEPLOY / "compose.yml").read_text())
    for name, service in compose["services"].items():
        for port in service.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
    postgres = compose["services"]["postgres"]["ports"][0]
    published = re.sub(r"\$\{[A-Z_]+:-(\d+)\}", r"\1", postgres).split(":")[1]
    assert published != "5432", postgres
