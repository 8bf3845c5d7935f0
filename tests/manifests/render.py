"""Render tide's Helm chart and kustomize base with the real helm and kustomize binaries.

The binaries are the ones ``scripts/cluster-deps.sh`` (``make cluster-deps``) builds into the
cache folder (``TIDE_CACHE``, default ``~/.cache/tide``), one folder per tool and version; the
versions are read from that script, so a version bump there moves the tests with it.

Typical use::

    objects = helm_template(release="tide", namespace="tide-system", values={"replicas": 3})
    deployment = one(objects, "Deployment")
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "tide"
BASE = REPO / "manifests" / "deploy"
DEPS_SCRIPT = REPO / "scripts" / "cluster-deps.sh"
BUILD_COMMAND = "make cluster-deps"


class ToolUnavailable(RuntimeError):
    """helm or kustomize is not in the cache folder."""


def cache_root() -> Path:
    """The folder ``scripts/cluster-deps.sh`` builds into: ``TIDE_CACHE`` or ``~/.cache/tide``."""
    return Path(os.environ.get("TIDE_CACHE") or Path.home() / ".cache" / "tide")


def tool_version(name: str) -> str:
    """The version of ``name`` that ``scripts/cluster-deps.sh`` builds (its ``NAME_VERSION=``).

    Raises:
        ToolUnavailable: the script does not name a version for ``name``.
    """
    variable = f"{name.upper()}_VERSION"
    found = re.search(rf"^{variable}=(\S+)", DEPS_SCRIPT.read_text(), re.MULTILINE)
    if found is None:
        raise ToolUnavailable(f"{DEPS_SCRIPT}: no {variable}= line")
    return found.group(1)


def find_tool(name: str) -> Path:
    """The path of the cached ``helm`` or ``kustomize`` binary.

    Raises:
        ToolUnavailable: it is not there; the message names the path and the build command.
    """
    path = cache_root() / f"{name}-{tool_version(name)}" / "bin" / name
    if not os.access(path, os.X_OK):
        raise ToolUnavailable(f"{name} is not built at {path}: run `{BUILD_COMMAND}`")
    return path


def require_tool(name: str) -> Path:
    """``find_tool(name)``, or skip the test when it is missing, except under CI (``CI=true``),
    where ``make test`` builds it first and a missing binary fails the test."""
    import pytest  # only the tests need pytest; the helpers above are plain Python

    try:
        return find_tool(name)
    except ToolUnavailable as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"CI: {e}")
        pytest.skip(str(e))


def run_tool(args: Sequence[str | Path], *, timeout_s: float = 120.0) -> str:
    """Run a binary with no kubeconfig in reach; its standard output.

    Raises:
        RuntimeError: it exited non-zero; the message carries the command and its output.
    """
    # Nothing here reads a cluster: point helm at no kubeconfig.
    env = {**os.environ, "KUBECONFIG": os.devnull}
    done = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(str(a) for a in args)} exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        )
    return done.stdout


def parse_objects(text: str, *, source: str) -> list[dict[str, Any]]:
    """The Kubernetes objects of a multi-document YAML stream, empty documents dropped.

    Raises:
        ValueError: a document is not a mapping with apiVersion, kind and metadata.name.
    """
    objects: list[dict[str, Any]] = []
    for number, document in enumerate(yaml.safe_load_all(text), start=1):
        if document is None:
            continue
        if not isinstance(document, dict) or not {"apiVersion", "kind", "metadata"} <= set(
            document
        ):
            raise ValueError(f"{source}: document {number} is not a Kubernetes object")
        if not document["metadata"].get("name"):
            raise ValueError(f"{source}: document {number} ({document['kind']}) has no name")
        objects.append(document)
    return objects


def _values_args(
    values: Mapping[str, Any] | None, set_files: Mapping[str, Path] | None, workdir: Path | None
) -> list[str]:
    args: list[str] = []
    if values:
        if workdir is None:
            raise ValueError("values need a workdir to write the values file in")
        path = workdir / f"values-{len(list(workdir.glob('values-*.yaml')))}.yaml"
        # JSON is YAML: no YAML writer needed, and the file says exactly what was passed.
        path.write_text(json.dumps(values, indent=2))
        args += ["--values", str(path)]
    for key, file in (set_files or {}).items():
        args += ["--set-file", f"{key}={file}"]
    return args


def helm_lint(
    *,
    values: Mapping[str, Any] | None = None,
    workdir: Path | None = None,
) -> str:
    """``helm lint --strict`` of the chart with ``values``; its output.

    Raises:
        RuntimeError: lint failed (the message carries its findings).
    """
    helm = require_tool("helm")
    return run_tool([helm, "lint", "--strict", CHART, *_values_args(values, None, workdir)])


def helm_template(
    *,
    release: str = "tide",
    namespace: str = "tide-system",
    values: Mapping[str, Any] | None = None,
    set_files: Mapping[str, Path] | None = None,
    workdir: Path | None = None,
) -> list[dict[str, Any]]:
    """The chart's objects as ``helm template`` renders them.

    Args:
        release: the release name.
        namespace: the release namespace.
        values: values to pass (written to a file under ``workdir``).
        set_files: ``--set-file key=path`` pairs.
        workdir: where to write the values file.

    Returns:
        The rendered objects, in helm's order.
    """
    helm = require_tool("helm")
    text = run_tool(
        [
            helm,
            "template",
            release,
            CHART,
            "--namespace",
            namespace,
            *_values_args(values, set_files, workdir),
        ]
    )
    return parse_objects(text, source=f"helm template {release}")


def helm_notes(
    *,
    release: str = "tide",
    namespace: str = "tide-system",
    values: Mapping[str, Any] | None = None,
    workdir: Path | None = None,
) -> str:
    """NOTES.txt as ``helm install --dry-run=client`` renders it (no cluster contacted)."""
    helm = require_tool("helm")
    text = run_tool(
        [
            helm,
            "install",
            release,
            CHART,
            "--namespace",
            namespace,
            "--dry-run=client",
            *_values_args(values, None, workdir),
        ]
    )
    _, found, notes = text.partition("\nNOTES:\n")
    if not found:
        raise RuntimeError(f"helm install --dry-run printed no NOTES:\n{text[-2000:]}")
    return notes


def kustomize_build(path: Path = BASE) -> list[dict[str, Any]]:
    """The objects ``kustomize build path`` renders (the base, or an overlay of it)."""
    kustomize = require_tool("kustomize")
    return parse_objects(run_tool([kustomize, "build", path]), source=f"kustomize build {path}")


def kustomize_overlay(
    folder: Path, *, namespace: str, name_prefix: str = ""
) -> list[dict[str, Any]]:
    """The base as an overlay in ``folder`` renders it: in ``namespace``, names prefixed.

    Args:
        folder: an empty folder for the overlay's kustomization.yaml.
        namespace: the overlay's ``namespace``.
        name_prefix: its ``namePrefix`` ("" for none).

    Returns:
        The rendered objects.
    """
    kustomization: dict[str, Any] = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        # kustomize takes a relative path to another kustomization only, never an absolute one.
        "resources": [os.path.relpath(BASE, folder)],
        "namespace": namespace,
    }
    if name_prefix:
        kustomization["namePrefix"] = name_prefix
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kustomization.yaml").write_text(json.dumps(kustomization, indent=2))
    return kustomize_build(folder)


def one(objects: Sequence[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    """The only object of ``kind`` (and ``name``, when given).

    Raises:
        LookupError: none or several match; the message lists what there is.
    """
    found = [
        o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)
    ]
    if len(found) != 1:
        listed = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects)
        raise LookupError(f"{len(found)} {kind} {name or ''} among {listed}")
    return found[0]
