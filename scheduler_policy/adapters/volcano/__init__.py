"""The Volcano adapter: the engine's ``ClusterClient`` on a real Kubernetes API server.

``VolcanoClient`` (``client.py``) reads Volcano Jobs, Queues and PodGroups and the pods and
nodes under them from watches (``informer.py``), through pure readers (``read.py``, and
``scheduler_policy.adapters.volcano_job`` for Jobs), and writes replica changes as JSON
patches of Volcano Jobs (``write.py``), each followed by a Kubernetes Event (``events.py``).
Requests are counted (``counts.py``); failures are typed (``errors.py``). With the leader
election, this package is the only importer of ``kubernetes`` (an import-linter contract says
so).

The RBAC the engine's chart grants it, and every verb it uses (no other)::

    batch.volcano.sh       jobs                 get, list, watch, patch
    scheduling.volcano.sh  queues, podgroups    get, list, watch
    "" (core)              pods, nodes          get, list, watch
    "" (core)              events               create
    coordination.k8s.io    leases               get, create, update   (leader election)

It never patches a PodGroup (Volcano's controller rewrites it from the Job) and never writes
to a workload without the ``tide.io/elastic: "true"`` annotation.
"""

from scheduler_policy.adapters.volcano.client import (
    DEFAULT_MAX_CONCURRENT_WRITES,
    JSON_PATCH,
    VolcanoClient,
    from_kubeconfig,
)
from scheduler_policy.adapters.volcano.counts import RequestCounts
from scheduler_policy.adapters.volcano.errors import (
    JobNotFound,
    NotElastic,
    PatchFailed,
    PatchForbidden,
    PatchRefused,
)

__all__ = [
    "DEFAULT_MAX_CONCURRENT_WRITES",
    "JSON_PATCH",
    "JobNotFound",
    "NotElastic",
    "PatchFailed",
    "PatchForbidden",
    "PatchRefused",
    "RequestCounts",
    "VolcanoClient",
    "from_kubeconfig",
]
