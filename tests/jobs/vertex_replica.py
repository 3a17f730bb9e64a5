"""Runs a command as a Vertex AI replica would see it (not a test module).

    python tests/jobs/vertex_replica.py [--no-job] -- python -m trainer.task ...

`tfdist.launch` / `LocalCluster` give each task a `TF_CONFIG`; Vertex AI also
sets `CLUSTER_SPEC`, naming worker pools instead of roles and carrying the job
spec under "job". This wrapper derives that `CLUSTER_SPEC` from the task's
`TF_CONFIG` (chief -> workerpool0, worker -> workerpool1, ps -> workerpool2,
evaluator -> workerpool3), with a job spec whose pool 2 runs our trainer image,
then replaces itself with the command. `--no-job` leaves the job spec out.
"""

import json
import os
import sys

POOLS = {
    "chief": "workerpool0",
    "worker": "workerpool1",
    "ps": "workerpool2",
    "evaluator": "workerpool3",
}
TRAINER_POOL = {
    "machine_spec": {"machine_type": "n2-standard-4"},
    "replica_count": 1,
    "container_spec": {"image_uri": "us-docker.pkg.dev/p/tfdist/trainer:0.1.0"},
}


def cluster_spec(tf_config: dict, with_job: bool) -> dict:
    cluster = {POOLS[role]: hosts for role, hosts in tf_config["cluster"].items()}
    task = tf_config["task"]
    spec = {
        "cluster": cluster,
        "environment": "cloud",
        "task": {"type": POOLS[task["type"]], "index": task["index"], "trial": ""},
    }
    if with_job:
        spec["job"] = {"worker_pool_specs": [TRAINER_POOL] * len(cluster)}
    return spec


def main(argv):
    split = argv.index("--")
    options, command = argv[1:split], argv[split + 1 :]
    tf_config = json.loads(os.environ["TF_CONFIG"])
    os.environ["CLUSTER_SPEC"] = json.dumps(cluster_spec(tf_config, "--no-job" not in options))
    os.execvp(command[0], command)


if __name__ == "__main__":
    main(sys.argv)
