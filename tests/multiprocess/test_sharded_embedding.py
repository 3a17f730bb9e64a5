"""ShardedEmbedding: an embedding table partitioned over parameter servers."""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
JOB = str(ROOT / "tests" / "jobs" / "sharded_embedding_job.py")


def test_blocks_are_spread_over_the_parameter_servers_and_train(local_cluster, tmp_path):
    cluster = local_cluster(
        num_workers=1,
        num_ps=2,
        has_chief=True,
        command=[sys.executable, JOB, f"--out={tmp_path}"],
        env={"PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "2", "CUDA_VISIBLE_DEVICES": ""},
        grace_period=5.0,
    )
    cluster.start()
    codes = cluster.wait(timeout=240)
    assert codes["chief:0"] == 0, cluster.format_logs()
    placement = json.loads((tmp_path / "placement.json").read_text())
    assert placement["iterations"] == 20
    ps_tasks = [
        device.split("/job:ps/replica:0/task:")[1].split("/")[0] for device in placement["devices"]
    ]
    assert sorted(set(ps_tasks)) == ["0", "1"], placement["devices"]
    assert placement["loss"][-1] < placement["loss"][0], placement["loss"]
