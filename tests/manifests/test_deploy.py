"""charts/tide and manifests/deploy: rendered by the real helm and kustomize, they hold what the
engine needs and nothing more (least-privilege RBAC, a locked-down pod), agree with each other,
and ship the Volcano scheduler configuration tide is tested with."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from scheduler_policy.policy.file import load_policy, parse_policy
from tests.manifests.render import (
    BASE,
    CHART,
    REPO,
    helm_lint,
    helm_notes,
    helm_template,
    kustomize_build,
    kustomize_overlay,
    one,
)

POLICIES = REPO / "manifests" / "policies"
CONF = CHART / "files" / "volcano-scheduler.conf"
DOCKERFILE = BASE / "Dockerfile"

# What the engine does, as (API group, resource, verb): the whole list, nothing else.
ENGINE_CLUSTER_RULES = {
    *(("batch.volcano.sh", "jobs", v) for v in ("get", "list", "watch", "patch")),
    *(("scheduling.volcano.sh", r, v)
      for r in ("queues", "podgroups") for v in ("get", "list", "watch")),
    *(("", r, v) for r in ("pods", "nodes") for v in ("get", "list", "watch")),
    ("", "events", "create"),
}  # fmt: skip
# Leader election in the engine's namespace: create any Lease, get and update its own only.
LEASE_RULES = {
    ("coordination.k8s.io", "leases", "create", None),
    ("coordination.k8s.io", "leases", "get", "tide-engine"),
    ("coordination.k8s.io", "leases", "update", "tide-engine"),
}

# Volcano's default tiers (v1.15.1, overcommit included): tide's configuration adds the extender
# at the end of the first tier and binpack at the end of the second.
VOLCANO_DEFAULT_TIERS = [
    ["priority", "gang", "conformance"],
    ["overcommit", "drf", "predicates", "proportion", "nodeorder"],
]
VOLCANO_DEFAULT_ACTIONS = ["enqueue", "allocate", "backfill"]

# Values unlike every default, to see each one reach the objects.
NON_DEFAULT = {
    "replicas": 3,
    "port": 9090,
    "image": {"repository": "registry.example/tide", "tag": "dev", "pullPolicy": "Always"},
    "prometheus": {"url": "http://prom.monitoring.svc:9090"},
    "dryRun": True,
    "extraArgs": ["--once"],
    "leaderElection": {"leaseName": "tide-leader"},
    "serviceMonitor": {"enabled": True, "labels": {"release": "prom"}, "interval": "15s"},
    "volcanoScheduler": {"configMap": {"create": True, "namespace": "vc"}},
    "priorityClassName": "system-cluster-critical",
    "nodeSelector": {"node-role": "control"},
    "tolerations": [{"key": "control", "operator": "Exists", "effect": "NoSchedule"}],
    "resources": {
        "requests": {"cpu": "200m", "memory": "512Mi"},
        "limits": {"cpu": "2", "memory": "2Gi"},
    },
}
NON_DEFAULT_RELEASE = ("ml-tide", "gpu-ops")  # (release, namespace)


def _chart_default(tmp_path: Path) -> list[dict[str, Any]]:
    return helm_template(workdir=tmp_path)


def _chart_non_default(tmp_path: Path) -> list[dict[str, Any]]:
    release, namespace = NON_DEFAULT_RELEASE
    return helm_template(release=release, namespace=namespace, values=NON_DEFAULT, workdir=tmp_path)


def _base(tmp_path: Path) -> list[dict[str, Any]]:
    return kustomize_build()


RENDERS: dict[str, Callable[[Path], list[dict[str, Any]]]] = {
    "chart-default": _chart_default,
    "chart-non-default": _chart_non_default,
    "kustomize-base": _base,
}


@pytest.fixture(params=list(RENDERS), ids=list(RENDERS))
def rendered(request: pytest.FixtureRequest, tmp_path: Path) -> list[dict[str, Any]]:
    return RENDERS[request.param](tmp_path)


def _pod_spec(objects: list[dict[str, Any]]) -> dict[str, Any]:
    spec: dict[str, Any] = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def _engine(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = _pod_spec(objects)["containers"]
    assert [c["name"] for c in containers] == ["engine"]
    engine: dict[str, Any] = containers[0]
    return engine


def _flags(container: dict[str, Any]) -> dict[str, str | None]:
    """``--name=value`` (or a bare ``--name``) arguments by name."""
    flags: dict[str, str | None] = {}
    for arg in container["args"]:
        name, sep, value = str(arg).partition("=")
        flags[name] = value if sep else None
    return flags


def _rules(role: dict[str, Any]) -> Iterator[tuple[str, str, str, str | None]]:
    for rule in role["rules"]:
        assert set(rule) <= {"apiGroups", "resources", "verbs", "resourceNames"}, rule
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                for verb in rule["verbs"]:
                    for name in rule.get("resourceNames") or [None]:
                        yield group, resource, verb, name


def _conf() -> dict[str, Any]:
    conf: dict[str, Any] = yaml.safe_load(CONF.read_text())
    return conf


def _plugins(conf: dict[str, Any]) -> list[list[str]]:
    return [[p["name"] for p in tier["plugins"]] for tier in conf["tiers"]]


def _plugin(conf: dict[str, Any], name: str) -> dict[str, Any]:
    found = [p for tier in conf["tiers"] for p in tier["plugins"] if p["name"] == name]
    assert len(found) == 1, f"{name}: {len(found)} plugins of that name"
    return found[0]


# --- helm lint -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [None, NON_DEFAULT, {"policy": "apiVersion: tide.io/v1alpha1\nkind: ElasticPolicy\n"}],
    ids=["default", "non-default", "policy-as-text"],
)
def test_helm_lint_passes_strict(tmp_path: Path, values: dict[str, Any] | None) -> None:
    output = helm_lint(values=values, workdir=tmp_path)
    assert "0 chart(s) failed" in output


# --- every render -------------------------------------------------------------------------


def test_every_object_is_namespaced_where_the_engine_runs(rendered: list[dict[str, Any]]) -> None:
    deployment = one(rendered, "Deployment")
    namespace = deployment["metadata"]["namespace"]
    cluster_scoped = {"ClusterRole", "ClusterRoleBinding", "Namespace"}
    for obj in rendered:
        where = obj["metadata"].get("namespace")
        if obj["kind"] in cluster_scoped:
            assert where is None, f"{obj['kind']} {obj['metadata']['name']} is cluster-scoped"
        elif obj["kind"] == "ConfigMap" and "volcano-scheduler.conf" in obj["data"]:
            assert where == "vc"  # Volcano's namespace, from the values
        else:
            assert where == namespace, f"{obj['kind']} {obj['metadata']['name']}: {where}"


def test_the_pod_is_locked_down(rendered: list[dict[str, Any]]) -> None:
    pod = _pod_spec(rendered)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    engine = _engine(rendered)
    context = engine["securityContext"]
    assert context["allowPrivilegeEscalation"] is False
    assert context["readOnlyRootFilesystem"] is True
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context.get("privileged", False) is False
    assert context.get("runAsUser", pod["securityContext"]["runAsUser"]) != 0
    resources = engine["resources"]
    assert resources["requests"]["cpu"] and resources["requests"]["memory"]
    assert resources["limits"]["memory"]
    # The only writable paths are emptyDirs; the policy is mounted read-only as a folder.
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in engine["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    policy_mount = mounts["/etc/tide"]
    assert policy_mount["readOnly"] is True and "subPath" not in policy_mount
    assert "configMap" in volumes[policy_mount["name"]]
    writable = {p for p, m in mounts.items() if not m.get("readOnly")}
    assert all("emptyDir" in volumes[mounts[p]["name"]] for p in writable)


def test_probes_and_service_use_the_one_port(rendered: list[dict[str, Any]]) -> None:
    engine = _engine(rendered)
    [port] = engine["ports"]
    assert port["name"] == "http"
    flags = _flags(engine)
    assert flags["--listen"] == f"0.0.0.0:{port['containerPort']}"
    assert engine["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert engine["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    service = one(rendered, "Service")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": port["containerPort"], "targetPort": "http", "protocol": "TCP"}
    ]
    pod_labels = one(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert (
        one(rendered, "Deployment")["spec"]["selector"]["matchLabels"]
        == service["spec"]["selector"]
    )


def test_the_engine_reads_the_mounted_policy_and_elects_on_its_lease(
    rendered: list[dict[str, Any]],
) -> None:
    engine = _engine(rendered)
    assert engine["command"] == ["tide", "engine"]
    flags = _flags(engine)
    assert flags["--policy"] == "/etc/tide/policy.yaml"
    assert flags["--lease-namespace"] == "$(POD_NAMESPACE)"
    [env] = [e for e in engine["env"] if e["name"] == "POD_NAMESPACE"]
    assert env["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    role = one(rendered, "Role")
    leased = {name for _, _, verb, name in _rules(role) if verb in ("get", "update")}
    assert leased == {flags["--lease-name"]}
    [mount] = [m for m in engine["volumeMounts"] if m["mountPath"] == "/etc/tide"]
    [volume] = [v for v in _pod_spec(rendered)["volumes"] if v["name"] == mount["name"]]
    policy_map = one(rendered, "ConfigMap", volume["configMap"]["name"])
    assert set(policy_map["data"]) == {"policy.yaml"}
    # What the engine will read is a valid policy.
    parse_policy(yaml.safe_load(policy_map["data"]["policy.yaml"]), source="ConfigMap")


def test_cluster_role_grants_exactly_what_the_engine_uses(rendered: list[dict[str, Any]]) -> None:
    role = one(rendered, "ClusterRole")
    granted = list(_rules(role))
    assert not [r for r in granted if "*" in r], "no wildcard group, resource or verb"
    assert all(name is None for *_, name in granted)
    assert {r[:3] for r in granted} == ENGINE_CLUSTER_RULES
    assert len(granted) == len(ENGINE_CLUSTER_RULES), "no rule granted twice"


def test_lease_role_grants_only_leader_election(rendered: list[dict[str, Any]]) -> None:
    role = one(rendered, "Role")
    lease = _flags(_engine(rendered))["--lease-name"]
    expected = {(g, r, v, lease if n else None) for g, r, v, n in LEASE_RULES}
    assert set(_rules(role)) == expected
    assert len(list(_rules(role))) == len(expected)


def test_bindings_name_the_engines_service_account(rendered: list[dict[str, Any]]) -> None:
    deployment = one(rendered, "Deployment")
    account = one(rendered, "ServiceAccount")
    assert _pod_spec(rendered)["serviceAccountName"] == account["metadata"]["name"]
    subject = {
        "kind": "ServiceAccount",
        "name": account["metadata"]["name"],
        "namespace": deployment["metadata"]["namespace"],
    }
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = one(rendered, kind)
        assert binding["subjects"] == [subject]
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": role_kind,
            "name": one(rendered, role_kind)["metadata"]["name"],
        }


# --- the chart's values -------------------------------------------------------------------


def test_defaults_render_the_engine_without_optional_objects(tmp_path: Path) -> None:
    objects = _chart_default(tmp_path)
    assert sorted((o["kind"], o["metadata"]["name"]) for o in objects) == [
        ("ClusterRole", "tide-engine"),
        ("ClusterRoleBinding", "tide-engine"),
        ("ConfigMap", "tide-engine-policy"),
        ("Deployment", "tide-engine"),
        ("Role", "tide-engine-leader-election"),
        ("RoleBinding", "tide-engine-leader-election"),
        ("Service", "tide-engine"),
        ("ServiceAccount", "tide-engine"),
    ]
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 2, "two replicas: one leader, one warm follower"
    flags = _flags(_engine(objects))
    assert "--dry-run" not in flags
    assert flags["--lease-name"] == "tide-engine"
    assert _engine(objects)["image"] == "ghcr.io/tide/tide-engine:0.1.0"


def test_non_default_values_reach_the_objects(tmp_path: Path) -> None:
    release, namespace = NON_DEFAULT_RELEASE
    objects = _chart_non_default(tmp_path)
    name = f"{release}-engine"
    assert {o["metadata"]["name"] for o in objects if o["kind"] != "ConfigMap"} == {
        name,
        f"{name}-leader-election",
    }
    deployment = one(objects, "Deployment", name)
    assert deployment["spec"]["replicas"] == 3
    engine = _engine(objects)
    assert engine["image"] == "registry.example/tide:dev"
    assert engine["imagePullPolicy"] == "Always"
    assert engine["ports"][0]["containerPort"] == 9090
    assert engine["resources"] == NON_DEFAULT["resources"]
    flags = _flags(engine)
    assert flags["--prometheus"] == "http://prom.monitoring.svc:9090"
    assert flags["--lease-name"] == "tide-leader"
    assert "--dry-run" in flags and "--once" in flags
    pod = _pod_spec(objects)
    assert pod["priorityClassName"] == "system-cluster-critical"
    assert pod["nodeSelector"] == {"node-role": "control"}
    assert pod["tolerations"] == NON_DEFAULT["tolerations"]
    monitor = one(objects, "ServiceMonitor", name)
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == one(objects, "Service")["spec"]["selector"]
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": [namespace]}
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]


def test_an_empty_prometheus_url_is_refused_naming_the_value(tmp_path: Path) -> None:
    # The engine cannot run without Prometheus: the chart says so at install, not the pod later.
    with pytest.raises(RuntimeError, match=r"prometheus\.url: the engine reads throughput"):
        helm_template(values={"prometheus": {"url": ""}}, workdir=tmp_path)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [
        (None, POLICIES / "research-and-production.yaml"),
        (POLICIES / "default.yaml", POLICIES / "default.yaml"),
    ],
    ids=["values-default-is-research-and-production", "set-file-default-yaml"],
)
def test_the_policy_configmap_holds_the_shipped_policy(
    tmp_path: Path, policy: Path | None, expected: Path
) -> None:
    objects = helm_template(set_files={"policy": policy} if policy else None, workdir=tmp_path)
    text = one(objects, "ConfigMap", "tide-engine-policy")["data"]["policy.yaml"]
    assert parse_policy(yaml.safe_load(text), source="chart") == load_policy(expected)


def test_notes_give_the_extender_url_prefix(tmp_path: Path) -> None:
    release, namespace = NON_DEFAULT_RELEASE
    notes = helm_notes(
        release=release, namespace=namespace, values={"port": 9090}, workdir=tmp_path
    )
    assert f"http://{release}-engine.{namespace}.svc:9090/extender" in notes
    assert "volcanoScheduler.configMap.create=true" in notes


# --- the Volcano scheduler configuration ----------------------------------------------------


def test_scheduler_conf_is_volcanos_default_plus_reclaim_extender_and_binpack() -> None:
    conf = _conf()
    actions = [a.strip() for a in conf["actions"].split(",")]
    assert actions == [*VOLCANO_DEFAULT_ACTIONS, "reclaim"]
    assert _plugins(conf) == [
        [*VOLCANO_DEFAULT_TIERS[0], "extender"],
        [*VOLCANO_DEFAULT_TIERS[1], "binpack"],
    ]
    assert "overcommit" in _plugins(conf)[1]


def test_scheduler_conf_asks_the_extender_for_reclaim_and_preempt_only() -> None:
    extender = _plugin(_conf(), "extender")
    assert extender in _conf()["tiers"][0]["plugins"], "the extender votes in the first tier"
    arguments = extender["arguments"]
    assert arguments["extender.reclaimableVerb"] == "reclaimable"
    assert arguments["extender.preemptableVerb"] == "preemptable"
    assert arguments["extender.ignorable"] is True
    assert arguments["extender.httpTimeout"] == "1s"
    assert "extender.onSessionOpenVerb" not in arguments
    verbs = {k for k in arguments if k.endswith("Verb")}
    assert verbs == {"extender.reclaimableVerb", "extender.preemptableVerb"}


def test_scheduler_conf_packs_gpus() -> None:
    conf = _conf()
    assert _plugin(conf, "binpack")["arguments"] == {"binpack.resources": "nvidia.com/gpu"}
    assert _plugin(conf, "nodeorder")["arguments"]["leastrequested.weight"] == 0


def test_scheduler_conf_points_at_the_bases_service() -> None:
    base = kustomize_build()
    service = one(base, "Service")
    port = service["spec"]["ports"][0]["port"]
    url = (
        f"http://{service['metadata']['name']}.{service['metadata']['namespace']}.svc:{port}"
        "/extender"
    )
    assert _plugin(_conf(), "extender")["arguments"]["extender.urlPrefix"] == url


@pytest.mark.parametrize(
    ("release", "namespace", "values", "url"),
    [
        ("tide", "tide-system", {}, "http://tide-engine.tide-system.svc:8080/extender"),
        (*NON_DEFAULT_RELEASE, NON_DEFAULT, "http://ml-tide-engine.gpu-ops.svc:9090/extender"),
    ],
    ids=["default-release", "other-release-and-port"],
)
def test_scheduler_conf_configmap_is_the_file_with_the_releases_url(
    tmp_path: Path, release: str, namespace: str, values: dict[str, Any], url: str
) -> None:
    values = {**values, "volcanoScheduler": {"configMap": {"create": True}}}
    objects = helm_template(release=release, namespace=namespace, values=values, workdir=tmp_path)
    config_map = one(objects, "ConfigMap", "volcano-scheduler-configmap")
    assert config_map["metadata"]["namespace"] == "volcano-system"
    text = config_map["data"]["volcano-scheduler.conf"]
    rendered = yaml.safe_load(text)
    assert _plugin(rendered, "extender")["arguments"]["extender.urlPrefix"] == url
    expected = _conf()
    _plugin(expected, "extender")["arguments"]["extender.urlPrefix"] = url
    assert rendered == expected
    assert text.count("\n#") == CONF.read_text().count("\n#"), "the comments travel with it"


def test_scheduler_conf_configmap_is_off_by_default(tmp_path: Path) -> None:
    objects = _chart_default(tmp_path)
    assert not [o for o in objects if "volcano-scheduler.conf" in o.get("data", {})]


# --- chart and base agree -------------------------------------------------------------------


def _comparable(objects: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Objects by (kind, name), without what only helm adds (its labels) or only the base has
    (the Namespace: the chart leaves it to ``helm install --create-namespace``)."""
    helm_only = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/version"}
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for obj in objects:
        if obj["kind"] == "Namespace":
            continue
        obj = yaml.safe_load(yaml.safe_dump(obj))  # a deep copy
        for labels in (
            obj["metadata"].get("labels", {}),
            obj.get("spec", {}).get("template", {}).get("metadata", {}).get("labels", {}),
        ):
            for key in helm_only:
                labels.pop(key, None)
        out[(obj["kind"], obj["metadata"]["name"])] = obj
    return out


def test_chart_and_base_render_the_same_objects(tmp_path: Path) -> None:
    chart = _comparable(_chart_default(tmp_path))
    base_objects = kustomize_build()
    base = _comparable(base_objects)
    assert sorted(chart) == sorted(base)
    for key in chart:
        if key == ("ConfigMap", "tide-engine-policy"):
            # helm writes the policy from values (keys sorted), the base from the file: the same
            # policy, not the same text.
            policies = [
                parse_policy(yaml.safe_load(o["data"]["policy.yaml"]), source=str(key))
                for o in (chart[key], base[key])
            ]
            assert policies[0] == policies[1] == load_policy(BASE / "policy.yaml")
            assert chart[key]["metadata"]["labels"] == base[key]["metadata"]["labels"]
            continue
        assert chart[key] == base[key], f"{key} differs between chart and base"
    assert one(base_objects, "Namespace")["metadata"]["name"] == "tide-system"


def test_an_overlay_moves_every_reference_with_the_names(tmp_path: Path) -> None:
    objects = kustomize_overlay(tmp_path / "overlay", namespace="gpu-ops", name_prefix="ml-")
    account = one(objects, "ServiceAccount")["metadata"]
    assert account == {**account, "name": "ml-tide-engine", "namespace": "gpu-ops"}
    subject = {"kind": "ServiceAccount", "name": "ml-tide-engine", "namespace": "gpu-ops"}
    for kind, role_kind in (("ClusterRoleBinding", "ClusterRole"), ("RoleBinding", "Role")):
        binding = one(objects, kind)
        assert binding["subjects"] == [subject], f"{kind} binds {binding['subjects']}"
        assert binding["roleRef"]["name"] == one(objects, role_kind)["metadata"]["name"]
    pod = _pod_spec(objects)
    assert pod["serviceAccountName"] == "ml-tide-engine"
    [policy] = [v for v in pod["volumes"] if "configMap" in v]
    assert policy["configMap"]["name"] == one(objects, "ConfigMap")["metadata"]["name"]
    assert one(objects, "Namespace")["metadata"]["name"] == "gpu-ops"


def test_the_base_policy_is_the_shipped_research_and_production_policy() -> None:
    assert load_policy(BASE / "policy.yaml") == load_policy(
        POLICIES / "research-and-production.yaml"
    )


# --- the engine image -----------------------------------------------------------------------


def test_engine_image_installs_tide_without_extras_and_runs_as_the_pods_user(
    tmp_path: Path,
) -> None:
    text = DOCKERFILE.read_text()
    instructions = [line for line in text.splitlines() if line and not line.startswith("#")]
    installs = [line for line in instructions if "pip install" in line]
    assert installs and all(re.search(r"pip install \.(\s|$)", line) for line in installs)
    assert "torch" not in "\n".join(instructions)
    # The main dependencies (no TOML reader on Python 3.10): the quoted names in the list.
    block = re.search(
        r"^dependencies = \[(.*?)^\]", (REPO / "pyproject.toml").read_text(), re.M | re.S
    )
    assert block is not None, "pyproject.toml: no dependencies list"
    names = {
        re.split(r"[<>=!~\[ ]", d, maxsplit=1)[0].lower()
        for d in re.findall(r'"([^"]+)"', block[1])
    }
    assert {"kubernetes", "numpy"} <= names
    assert not names & {"torch", "matplotlib"}, "the engine image carries neither"
    copied = [p for line in instructions if line.startswith("COPY") for p in line.split()[1:-1]]
    assert all((REPO / path).exists() for path in copied), copied
    [user] = [line.split()[1] for line in instructions if line.startswith("USER")]
    pod = _pod_spec(_chart_default(tmp_path))["securityContext"]
    assert user == f"{pod['runAsUser']}:{pod['runAsGroup']}"
    [entrypoint] = [line for line in instructions if line.startswith("ENTRYPOINT")]
    assert entrypoint == 'ENTRYPOINT ["tide"]'


# Run in a fresh interpreter in which torch and matplotlib cannot be imported, as in the image.
WITHOUT_EXTRAS = """
import importlib, importlib.abc, pkgutil, sys
class NotInTheImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ("torch", "matplotlib"):
            raise ImportError(f"{name} is not in the engine image")
sys.meta_path.insert(0, NotInTheImage())
# simulations.plots is the `plots` extra itself: the CLI loads it only to draw. tide.__main__
# runs the CLI when imported.
skip = {"simulations.plots", "tide.__main__"}
for package in ("scheduler_policy", "metrics_collector", "simulations", "tide"):
    root = importlib.import_module(package)
    for module in pkgutil.walk_packages(root.__path__, package + "."):
        if module.name not in skip:
            importlib.import_module(module.name)
from typer.testing import CliRunner
from tide.cli import app
commands = [c.name or c.callback.__name__ for c in app.registered_commands]
for args in [["--help"], *([name, "--help"] for name in commands)]:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (args, result.output, result.exception)
print(len(commands), "commands")
"""


def test_the_images_packages_and_cli_work_without_torch_or_matplotlib() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_EXTRAS],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert int(done.stdout.split()[0]) > 0, done.stdout
