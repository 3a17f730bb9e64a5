"""One gradient all-reduce between 2 local workers against a loopback socket transfer.

For 1, 16 and 128 MB of float32 "gradient", each of 2 workers of a
MultiWorkerMirroredStrategy (started on loopback by `tfdist.launch`) times a
SUM all-reduce of the tensor (median of several, after a warm-up), with the
`ring` implementation and TensorFlow's default (`auto`), in float32 and with
the tensor cast to bfloat16 first (what `--all_reduce_dtype=bfloat16` sends).
In the same run, the driver times a plain TCP transfer of the same bytes
between two threads over loopback (one direction, `sendall` into `recv_into`)
as the floor of what moving the bytes costs. A 2-worker ring all-reduce sends
and receives about the tensor's size per worker (half in reduce-scatter, half
in all-gather).

    python bench/bench_allreduce.py                  # ~2 min on 2 CPUs
    python bench/bench_allreduce.py --sizes_mb=1,16 --repeats=5
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)


def load_average() -> list[float]:
    return [round(value, 2) for value in os.getloadavg()]


def socket_seconds(num_bytes: int, repeats: int) -> float:
    """Median seconds to send `num_bytes` over a loopback TCP connection."""
    payload = bytearray(os.urandom(1024)) * (num_bytes // 1024)
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    received = bytearray(len(payload))
    done = threading.Event()

    def receive():
        connection, _ = server.accept()
        with connection:
            for _ in range(repeats + 1):
                view, got = memoryview(received), 0
                while got < len(received):
                    count = connection.recv_into(view[got:])
                    if not count:
                        return
                    got += count
                connection.sendall(b"k")
        done.set()

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    times = []
    with socket.create_connection(("127.0.0.1", port), timeout=120) as client:
        for index in range(repeats + 1):
            started = time.perf_counter()
            client.sendall(payload)
            client.recv(1)  # the receiver has every byte
            if index:
                times.append(time.perf_counter() - started)
    thread.join(timeout=120)
    server.close()
    return statistics.median(times)


def worker(args) -> None:
    """One task of the 2-worker cluster: times all-reduces, the chief prints JSON."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf  # pylint: disable=g-import-not-at-top

    implementation = {
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
    }
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=implementation[args.implementation]
        )
    )
    results = {}
    for size_mb in [int(s) for s in args.sizes_mb.split(",")]:
        elements = size_mb * 2**20 // 4
        with strategy.scope():
            gradient = tf.Variable(tf.random.stateless_normal([elements], seed=[1, 2]))
        for dtype in ("float32", "bfloat16"):

            @tf.function
            def all_reduce(value, dtype=dtype):
                def replica_fn(variable):
                    context = tf.distribute.get_replica_context()
                    # A gradient-like tensor made from a variable, as in training.
                    cast = tf.cast(variable * 1.0, dtype)
                    return tf.cast(context.all_reduce(tf.distribute.ReduceOp.SUM, cast), tf.float32)

                return strategy.run(replica_fn, args=(value,))

            times = []
            for index in range(args.repeats + 1):
                started = time.perf_counter()
                out = all_reduce(gradient)
                strategy.experimental_local_results(out)[0].numpy()[:1]
                if index:
                    times.append(time.perf_counter() - started)
            results[f"{size_mb}MB/{dtype}"] = statistics.median(times)
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    if task["index"] == 0:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(results, handle)


def run_cluster(implementation: str, sizes_mb: str, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as scratch:
        output = os.path.join(scratch, "result.json")
        env = dict(
            os.environ,
            PYTHONPATH=os.pathsep.join(filter(None, [REPO, os.environ.get("PYTHONPATH")])),
            TF_CPP_MIN_LOG_LEVEL="3",
        )
        env.pop("TF_CONFIG", None)
        command = [
            sys.executable,
            "-m",
            "tfdist.launch",
            "--workers",
            "2",
            "--timeout",
            "900",
            "--",
            sys.executable,
            os.path.abspath(__file__),
            "--side=worker",
            f"--implementation={implementation}",
            f"--sizes_mb={sizes_mb}",
            f"--repeats={repeats}",
            f"--output={output}",
        ]
        result = subprocess.run(
            command, cwd=REPO, env=env, capture_output=True, text=True, timeout=1200, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"cluster exited {result.returncode}:\n{result.stdout[-3000:]}"
                f"\n{result.stderr[-3000:]}"
            )
        with open(output, encoding="utf-8") as handle:
            return json.load(handle)


def measure(sizes_mb: str = "1,16,128", repeats: int = 5, rounds: int = 1) -> dict:
    """Alternates ring, auto and the socket transfer in `rounds`; medians of rounds."""
    sizes = [int(s) for s in sizes_mb.split(",")]
    runs = {"ring": [], "auto": [], "socket": []}
    load_before = load_average()
    for round_index in range(rounds):
        order = ["ring", "socket", "auto"] if round_index % 2 == 0 else ["auto", "socket", "ring"]
        for side in order:
            if side == "socket":
                runs["socket"].append(
                    {f"{size}MB": socket_seconds(size * 2**20, repeats) for size in sizes}
                )
            else:
                runs[side].append(run_cluster(side, sizes_mb, repeats))
            print(f"round {round_index + 1}: {side} {runs[side][-1]}", file=sys.stderr)
    rows = []
    for size in sizes:
        sock = statistics.median(run[f"{size}MB"] for run in runs["socket"])
        row = {"size_mb": size, "socket_seconds": sock}
        for side in ("ring", "auto"):
            for dtype in ("float32", "bfloat16"):
                seconds = statistics.median(run[f"{size}MB/{dtype}"] for run in runs[side])
                row[f"{side}_{dtype}_seconds"] = seconds
                row[f"{side}_{dtype}_vs_socket"] = seconds / sock
        rows.append(row)
    return {
        "rows": rows,
        "runs": runs,
        "load_average_before": load_before,
        "load_average_after": load_average(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--side", choices=("driver", "worker"), default="driver")
    parser.add_argument("--implementation", default="ring")
    parser.add_argument("--sizes_mb", default="1,16,128")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--output", default="")
    args = parser.parse_args()
    if args.side == "worker":
        worker(args)
        return
    results = measure(args.sizes_mb, args.repeats, args.rounds)
    for row in results["rows"]:
        print(
            f"{row['size_mb']:4d} MB: socket {1e3 * row['socket_seconds']:.1f} ms, "
            f"ring f32 {1e3 * row['ring_float32_seconds']:.1f} ms "
            f"({row['ring_float32_vs_socket']:.1f}x), ring bf16 "
            f"{1e3 * row['ring_bfloat16_seconds']:.1f} ms, auto f32 "
            f"{1e3 * row['auto_float32_seconds']:.1f} ms, auto bf16 "
            f"{1e3 * row['auto_bfloat16_seconds']:.1f} ms",
            file=sys.stderr,
        )
    print(json.dumps(results))
    if args.output:
        with open(args.output, "w", encoding="utf-8") as handle:
            json.dump(results, handle, indent=2)


if __name__ == "__main__":
    main()
