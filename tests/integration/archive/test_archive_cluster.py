"""``hetmm inspect --address`` on a 3-node ``ray.cluster_utils.Cluster``: every node's actors score a share.

Each node is its own raylet with 3 logical CPUs (on this 2-core machine: the cluster is about
placement, not speed); the job joins with the address, as the CLI's ``--address`` does. Detector
actors take 2 CPUs, so exactly one fits per node (the third CPU runs the read and write tasks):
3 actors, one on each node, whatever Ray Data's best-effort SPREAD would do.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
from archive_helpers import PRODUCT, read_rows, write_images

from hetmm_ray.archive import JobOptions, inspect_archive
from hetmm_ray.distributed import shutdown_ray

pytestmark = pytest.mark.usefixtures("one_torch_thread")

NODES = 3


@pytest.fixture(scope="module")
def cluster(own_ray) -> Iterator[Any]:
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 3, "include_dashboard": False})
    for _ in range(1, NODES):
        c.add_node(num_cpus=3)
    c.wait_for_nodes()
    yield c
    shutdown_ray()
    c.shutdown()


def test_every_node_scores_a_share_and_every_image_is_written_once(
    cluster: Any, gear_store: str, tmp_path: Path
) -> None:
    n = 30
    write_images(tmp_path / "in", n)
    opts = JobOptions(
        store=gear_store,
        address=cluster.address,
        concurrency=(NODES, NODES),
        batch_size=2,
        block_size=2,
        progress=False,
    )
    report = inspect_archive(str(tmp_path / "in"), PRODUCT, str(tmp_path / "out"), opts)
    nodes = {node["NodeID"] for node in ray.nodes() if node["Alive"]}
    assert len(nodes) == NODES
    assert set(report.per_node) == nodes, report.summary()  # every node's actor scored a share
    assert sum(report.per_node.values()) == report.written == n
    rows = read_rows(str(tmp_path / "out"))
    assert Counter(r["node"] for r in rows) == Counter(report.per_node)  # the rows say where they were scored
    paths = Counter(r["path"] for r in rows)
    assert len(paths) == n and max(paths.values()) == 1
    # A driver that joins a cluster has Ray's usage stats on, and Ray Data's usage collection would
    # start a thread polling a Prometheus on localhost:9090 for the rest of the process (archive/job.py).
    assert "data-usage-metrics-poller" not in {t.name for t in threading.enumerate()}
