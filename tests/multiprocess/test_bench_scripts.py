"""The benchmark scripts import only what exists.

Benchmarks are not run by the suite (they take minutes), and most import the
project lazily inside functions, so a module moved in a refactoring broke
`bench/bench_fused_multiworker.py` and `bench/bench_replica_jit.py` unnoticed
until someone ran them. This reads every import of `tfdist`/`trainer` in
`bench/*.py` and resolves it.
"""

import json
import os
import pathlib
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_the_data_scale_benchmark_runs_and_counts_decodes(tmp_path):
    """`bench_data_scale.py --smoke` runs every pipeline and reports decode counts per kind."""
    out = tmp_path / "results.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "bench_data_scale.py"),
            "--smoke",
            "--cache_dir",
            str(tmp_path / "data"),
            "--json",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads(out.read_text())
    counts = results["counts"]
    assert sorted(counts) == sorted(
        ["dataset", "dataset_files", "files", "grain", "plain", "random", "random1"]
    )
    # Decoding is counted: every pipeline decoded at least its first batch of 32.
    assert all(row["first_batch"] >= 32 for row in counts.values()), counts
    assert results["rss"]["files"]["main"] > 0
    assert set(results["throughput"]["median"]) == set(counts)
