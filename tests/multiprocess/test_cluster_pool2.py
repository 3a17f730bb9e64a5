"""What Vertex AI's worker pool 2 runs: one policy for every entry point.

Pool 2 holds parameter servers (our trainer) or Reduction Server (Vertex's
image). `tfdist.distribute.cluster.pool2_is_reduction_server` decides it the same way
for `trainer.task`, `tfdist.distribute.flags` and `tfdist.resumable`.
"""

import json
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_auto_on_vertex_style_variables_runs_parameter_server_training(local_cluster, tmp_path):
    """Chief, 2 workers and a PS, each with Vertex's CLUSTER_SPEC beside TF_CONFIG."""
    model_dir = tmp_path / "model"
    cluster = local_cluster(
        num_workers=2,
        num_ps=1,
        has_chief=True,
        grace_period=5.0,
        env={"PYTHONPATH": str(REPO), "TF_CPP_MIN_LOG_LEVEL": "2"},
        command=[
            sys.executable,
            str(REPO / "tests" / "jobs" / "vertex_replica.py"),
            "--",
            sys.executable,
            "-m",
            "trainer.task",
            "--strategy=auto",
            f"--model_dir={model_dir}",
            "--epochs=1",
            "--steps_per_epoch=8",
            "--num_examples=256",
        ],
    )
    cluster.start()
    codes = cluster.wait(timeout=150)
    assert codes["chief:0"] == 0, cluster.format_logs()
    summary = json.loads((model_dir / "summary.json").read_text())
    assert (summary["strategy"], summary["num_workers"]) == ("parameter_server", 2), summary
    assert summary["steps_completed"] == 8, summary
