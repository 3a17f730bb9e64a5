"""A local multi-node Ray cluster on loopback for tests/multiprocess/test_ray.py.

    python tests/jobs/ray_cluster.py --nodes=2 --cpus_per_node=3 [--lifetime_seconds=900]

A head without CPUs and `--nodes` nodes of `--cpus_per_node` CPUs, all on 127.0.0.1, no dashboard
(`ray.cluster_utils.Cluster`, as Ray's own tests build them). Prints
`ray_cluster: up at ADDRESS` once it accepts drivers (a job joins it with
`python -m trainer.ray --address=ADDRESS`), then keeps it up until SIGTERM (or
the lifetime ends) and shuts it down. A node can be drained for preemption from
outside, as Ray's autoscaler does on a spot reclaim (GCS `DrainNode`).
"""

import argparse
import signal
import sys

UP = "ray_cluster: up at "


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, required=True)
    parser.add_argument("--cpus_per_node", type=int, default=1)
    parser.add_argument("--lifetime_seconds", type=float, default=900.0)
    args = parser.parse_args()

    from ray.cluster_utils import Cluster  # pylint: disable=g-import-not-at-top

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "node_ip_address": "127.0.0.1", "include_dashboard": False},
    )
    try:
        for _ in range(args.nodes):
            cluster.add_node(num_cpus=args.cpus_per_node, node_ip_address="127.0.0.1")
        cluster.wait_for_nodes()
        # Blocked in this thread only, after Ray's processes started (they keep SIGTERM).
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        print(f"{UP}{cluster.address}", flush=True)
        signal.sigtimedwait({signal.SIGTERM}, args.lifetime_seconds)  # never outlives a test
    finally:
        cluster.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
