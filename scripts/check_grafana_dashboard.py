#!/usr/bin/env python3
"""Checks deploy/grafana against Grafana's own schema, as far as a checker on PyPI allows: the Grafana Foundation
SDK's models (generated from Grafana's schemas) for the Grafana release deploy/docker-compose.yml runs (11.1).

Each object is read into its model and written back: a key the schema does not know (a misspelt `gridpos`, an option
of another panel type) is lost on the way and reported, as is a value the model changes. Checked so: the dashboard
with its panels, each panel's `options` and `fieldConfig.defaults.custom` by the panel type's own model, each
target by the Prometheus query model. Then the wiring the models cannot see: every panel and target uses the
dashboard's datasource variable, that variable is a Prometheus datasource, the provisioned datasource is the
compose file's Prometheus service, and the dashboard provider reads the folder compose mounts the dashboard into.
(The metric names are checked against a live slided's /metrics by tests/integration/daemon_state_test.cc.)

usage: check_grafana_dashboard.py DEPLOY_DIR      exit 0 when clean, 1 with one line per finding
"""
import importlib
import json
import pathlib
import sys

import yaml  # PyYAML: Debian's python3-yaml, or pip

from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dashboard_model
from grafana_foundation_sdk.models import prometheus as prometheus_model

findings = []


def round_trip(model_cls, value, where):
    """Reads `value` into the model and writes it back; reports what the schema dropped or changed."""
    back = json.loads(json.dumps(model_cls.from_json(value), cls=JSONEncoder))
    compare(value, back, where)


def compare(a, b, where):
    if isinstance(a, dict):
        if not isinstance(b, dict):
            findings.append(f"{where}: the schema reads an object as {type(b).__name__}")
            return
        for key, value in a.items():
            if key not in b:
                findings.append(f"{where}/{key}: not in Grafana's schema")
            else:
                compare(value, b[key], f"{where}/{key}")
    elif isinstance(a, list):
        if not isinstance(b, list) or len(a) != len(b):
            findings.append(f"{where}: the schema reads the list differently")
            return
        for i, (x, y) in enumerate(zip(a, b)):
            compare(x, y, f"{where}[{i}]")
    elif a != b:
        findings.append(f"{where}: {a!r} reads as {b!r}")


def panel_models(panel_type):
    """The panel type's Options and FieldConfig models (the SDK has a module per core panel type)."""
    try:
        module = importlib.import_module(f"grafana_foundation_sdk.models.{panel_type}")
    except ModuleNotFoundError:
        findings.append(f"panel type {panel_type!r} is not a Grafana core panel")
        return None, None
    return getattr(module, "Options", None), getattr(module, "FieldConfig", None)


def main():
    deploy = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "deploy")
    board = json.loads((deploy / "grafana" / "slideformer.json").read_text())
    # The check is real: a misspelt key in a copy is found, or the models no longer drop what they do not know.
    broken = json.loads(json.dumps(board))
    broken["panels"][0]["gridpos"] = broken["panels"][0].pop("gridPos")
    broken["panels"][0]["targets"][0]["legendformat"] = "x"
    round_trip(dashboard_model.Dashboard, broken, "broken")
    round_trip(prometheus_model.Dataquery, broken["panels"][0]["targets"][0], "broken-target")
    if findings != ["broken/panels[0]/gridpos: not in Grafana's schema",
                    "broken-target/legendformat: not in Grafana's schema"]:
        print("check_grafana_dashboard: the schema check missed misspelt keys:", findings)
        return 2
    findings.clear()

    round_trip(dashboard_model.Dashboard, board, "dashboard")

    variables = {v.get("name"): v for v in board.get("templating", {}).get("list", [])}
    ds_var = variables.get("datasource")
    if ds_var is None or ds_var.get("type") != "datasource" or ds_var.get("query") != "prometheus":
        findings.append("templating: no `datasource` variable of Prometheus datasources")
    want_ds = {"type": "prometheus", "uid": "${datasource}"}

    panels = board.get("panels", [])
    if not panels:
        findings.append("dashboard: no panels")
    for i, panel in enumerate(panels):
        where = f"panels[{i}] ({panel.get('title', '?')})"
        options_cls, field_cls = panel_models(panel.get("type", ""))
        if options_cls is not None and "options" in panel:
            round_trip(options_cls, panel["options"], f"{where}/options")
        custom = panel.get("fieldConfig", {}).get("defaults", {}).get("custom")
        if field_cls is not None and custom is not None:
            round_trip(field_cls, custom, f"{where}/fieldConfig/defaults/custom")
        if panel.get("datasource") != want_ds:
            findings.append(f"{where}: datasource {panel.get('datasource')!r}, not the dashboard's variable")
        if not panel.get("targets"):
            findings.append(f"{where}: no queries")
        for j, target in enumerate(panel.get("targets", [])):
            round_trip(prometheus_model.Dataquery, target, f"{where}/targets[{j}]")
            if not target.get("expr"):
                findings.append(f"{where}/targets[{j}]: no expr")
            if target.get("datasource", want_ds) != want_ds:
                findings.append(f"{where}/targets[{j}]: datasource {target['datasource']!r}")

    compose = yaml.safe_load((deploy / "docker-compose.yml").read_text())
    grafana = compose["services"]["grafana"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in grafana["volumes"]}
    provisioning = deploy / "grafana" / "provisioning"
    if mounts.get("./grafana/provisioning") != "/etc/grafana/provisioning":
        findings.append("compose: the provisioning folder is not mounted at /etc/grafana/provisioning")
    for f in sorted(provisioning.glob("datasources/*.y*ml")):
        for ds in yaml.safe_load(f.read_text()).get("datasources", []):
            if ds.get("type") != "prometheus" or ds.get("url") != "http://prometheus:9090":
                findings.append(f"{f.name}: datasource {ds.get('name')!r} is not compose's Prometheus service")
            if "prometheus" not in compose["services"]:
                findings.append("compose: no prometheus service for the datasource")
    for f in sorted(provisioning.glob("dashboards/*.y*ml")):
        for provider in yaml.safe_load(f.read_text()).get("providers", []):
            path = provider.get("options", {}).get("path", "")
            if not any(target.startswith(path.rstrip("/") + "/") for target in mounts.values()):
                findings.append(f"{f.name}: provider {provider.get('name')!r} reads {path}, where compose mounts none")

    for line in findings:
        print(line)
    print(f"check_grafana_dashboard: {len(panels)} panels, {len(findings)} findings")
    return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
