"""No traceback and no silent acceptance, for any input to any entry point.

Every JSON the programs read (TF_CONFIG, CLUSTER_SPEC, `--config`, `--task_config`, the job
configs of trainer.submit and trainer.kubernetes, `--check` manifests) and the trainer flags
after `--` either give a one-line `UsageError` (exit 2 at the command line: `tfdist.cli.run`
prints it as one `error:` line) or are accepted with the value used. First the inputs found
wrong on main (each case fails there), then a bounded hypothesis fuzz per entry point, run
in-process (the parsing functions the entry points call).
"""

import json
import math
import pathlib
import tempfile

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tfdist import tasks as tasks_lib
from tfdist.distribute import cluster as cluster_lib
from tfdist.errors import UsageError
from trainer import config as config_lib
from trainer import submission, task_flags
from trainer.kubernetes import checks, manifest
from trainer.kubernetes import options as kubernetes_options
from trainer.kubernetes import shape as shape_lib
from trainer.kubernetes.manifest_file import read_manifest
from trainer.vertex import options as vertex_options
from trainer.vertex import tuning
from trainer.vertex.rendering import build_custom_job
from trainer.vertex.spec import JobSpec

# Bounded (the suite is near its time limit), and no example database written to disk.
FUZZ = settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
DEEP = "[" * 5000
IMAGE = "us-docker.pkg.dev/my-project/tfdist/trainer:0.1.0"
VERTEX_BASE = {
    "project": "my-project",
    "region": "us-central1",
    "staging_bucket": "gs://my-bucket",
    "container_uri": IMAGE,
}
K8S_BASE = {"name": "job", "image": IMAGE, "bucket": "gs://bucket"}


def _short_id(value) -> str:
    text = str(value)
    return text if len(text) <= 50 else f"{text[:20]}...({len(text)} chars)"


def refused_in_one_line(call):
    """The UsageError `call` raises (asserting it is one line), or None if it returns."""
    try:
        call()
    except UsageError as error:
        assert "\n" not in str(error), str(error)
        return error
    return None


def _file(directory: pathlib.Path, text: str | bytes, name: str = "input.json") -> str:
    path = directory / name
    path.write_bytes(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    return str(path)


def _resolve(variable: str, text: str) -> cluster_lib.Cluster:
    environ = {variable: text}
    return cluster_lib.resolve_cluster_for_strategy(environ, "auto")


def _load_config(directory: pathlib.Path, text: str) -> config_lib.ExperimentConfig:
    return config_lib.build_config(config_lib.load_config_file(_file(directory, text)))


def _submit_spec(directory: pathlib.Path, values: dict, trainer_args=(), *, study=None) -> JobSpec:
    file_values = submission.read_json_object(
        _file(directory, json.dumps(values)),
        flag="--job_config",
        keys=vertex_options.CONFIG_KEYS,
        example="configs/jobs/mirrored_1x8_gpu.json",
    )
    merged = vertex_options.merge_options(file_values, {"trainer_args": tuple(trainer_args)})
    spec = JobSpec.from_options(merged, timestamp="t")
    tuning.check_trial_flags(spec, study)  # as trainer.submit's main
    build_custom_job(spec)
    return spec


def _tfjob_shape(directory: pathlib.Path, values: dict) -> shape_lib.TFJobShape:
    file_values = submission.read_json_object(
        _file(directory, json.dumps(values)),
        flag="--job_config",
        keys=kubernetes_options.CONFIG_KEYS,
        example="configs/kubernetes/multiworker_cpu.json",
    )
    file_values.pop("description", None)
    shape = shape_lib.shape_from_options(file_values)
    checks.check_tfjob(manifest.build_tfjob(shape))
    return shape


# ---------------------------------------------------------------- found on main


@pytest.mark.parametrize(
    "variable, text",
    [
        ("TF_CONFIG", DEEP),  # RecursionError on main
        ("CLUSTER_SPEC", DEEP),  # RecursionError on main
        ("TF_CONFIG", '{"cluster": {"worker": ["[::1"]}, "task": {"type": "worker"}}'),
        ("TF_CONFIG", '{"cluster": {"worker": ["[::1:2222"]}, "task": {"type": "worker"}}'),
        ("TF_CONFIG", '{"cluster": {"worker": ["a b:2222"]}, "task": {"type": "worker"}}'),
        # TypeError on main (auto strategy reads pool 2):
        (
            "CLUSTER_SPEC",
            '{"cluster": {"workerpool0": ["a:1"], "workerpool2": 3}, '
            '"task": {"type": "workerpool0"}}',
        ),
        ("CLUSTER_SPEC", '{"cluster": {"workerpool0": ["a:1"]}, "task": {"type": ["x"]}}'),
        (
            "TF_CONFIG",
            '{"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 1}, '
            '"task": {"type": "worker", "index": 0}}',
        ),
    ],
    ids=_short_id,
)
def test_cluster_variables_refused_in_one_line(variable, text):
    assert refused_in_one_line(lambda: _resolve(variable, text)) is not None


@pytest.mark.parametrize(
    "text, field",
    [
        (DEEP, ""),  # RecursionError on main
        ('{"exclude_from_weight_decay": [null, true]}', "exclude_from_weight_decay"),
        ('{"decay_boundaries": [true, 0.5]}', "decay_boundaries"),
        ('{"learning_rate": Infinity}', ""),
        ('{"preemption_grace_seconds": 1e999}', ""),
        ('{"epochs": 3, "epochs": 4}', ""),
        ('{"task_config": "{not json"}', "task"),
    ],
    ids=_short_id,
)
def test_config_files_refused_in_one_line(tmp_path, text, field):
    error = refused_in_one_line(lambda: _load_config(tmp_path, text))
    assert error is not None and field in str(error)


@pytest.mark.parametrize(
    "flag_values",
    [
        {"preemption_grace_seconds": math.inf},  # disabled the watchdog on main
        {"learning_rate": math.nan},
        {"warmup_epochs": math.inf},
        {"task_config": "{not json"},  # ignored without --task on main
        {"seed": -1},  # a NumPy ValueError traceback on main
        {"seed": 2**32},
        {"steps_per_epoch": 2**63},
    ],
)
def test_flags_refused_in_one_line(flag_values):
    assert refused_in_one_line(lambda: config_lib.build_config(flag_values=flag_values))


@pytest.mark.parametrize(
    "text", [DEEP, '{"a": NaN}', '{"a": 1, "a": 2}', "9" * 5000], ids=_short_id
)
def test_task_config_refused_in_one_line(text, tmp_path):
    assert refused_in_one_line(lambda: tasks_lib.parse_task_config(text))
    assert refused_in_one_line(lambda: tasks_lib.parse_task_config(_file(tmp_path, text)))


@pytest.mark.parametrize(
    "values",
    [
        {"labels": 0},  # dropped on main
        {"labels": {"team": 1}},
        {"env": 0},
        {"env": ["A=1", 2]},
        {"trainer_args": 1},  # TypeError on main
        {"nfs_mount": 1},  # TypeError on main
        {"nfs_mount": [1]},
        {"trainer_args": None},  # read as no arguments on main
    ],
)
def test_submit_job_configs_refused_in_one_line(tmp_path, values):
    assert refused_in_one_line(lambda: _submit_spec(tmp_path, {**VERTEX_BASE, **values}))


@pytest.mark.parametrize(
    "values",
    [
        # TypeError / AttributeError on main:
        {"name": 5},
        {"image": 5},
        {"volume_claim": 5, "bucket": ""},
        {"bucket": 5},
        {"mount_path": 5},
        {"gpu_resource": ["x"]},
        {"node_selector": [1]},
        {"trainer_args": [None]},
        {"trainer_args": 5},
        {"workers": "2"},
        {"chief": "yes"},
    ],
)
def test_kubernetes_job_configs_refused_in_one_line(tmp_path, values):
    assert refused_in_one_line(lambda: _tfjob_shape(tmp_path, {**K8S_BASE, **values}))


@pytest.mark.parametrize("text", [DEEP, b"\xff\xfe{", "a:\n" + "  - " * 2000], ids=_short_id)
def test_kubernetes_manifest_check_refuses_deep_or_binary_files(tmp_path, text):
    path = _file(tmp_path, text)  # DEEP: RecursionError on main; bytes: UnicodeDecodeError
    assert refused_in_one_line(lambda: read_manifest(path))


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--epochs=-1"], "epochs"),
        (["--bogus"], "bogus"),
        (["--epochs=3", "stray"], "stray"),
        (["--learning_rate=inf"], "finite"),
        (["--lr_scaling=linear"], "reference_batch_size"),
        (["--optimizer=nope"], "optimizer"),
    ],
)
def test_trainer_flags_after_dashdash_are_checked_before_a_job_is_written(tmp_path, args, expected):
    shape_error = refused_in_one_line(
        lambda: _tfjob_shape(tmp_path, {**K8S_BASE, "trainer_args": args})
    )
    submit_error = refused_in_one_line(lambda: _submit_spec(tmp_path, VERTEX_BASE, args))
    assert shape_error and expected in str(shape_error), shape_error
    assert submit_error and expected in str(submit_error), submit_error


def test_tuned_flags_count_in_the_check_of_a_tuning_job(tmp_path):
    def study(name, values):
        parameters = (tuning.parse_parameter(name, values),)
        return tuning.TuningSpec(metric="val_accuracy", goal="maximize", parameters=parameters)

    args = ["--lr_scaling=linear", "--validation_steps=5"]
    # Each trial sets --reference_batch_size, which --lr_scaling needs: accepted.
    _submit_spec(tmp_path, VERTEX_BASE, args, study=study("reference_batch_size", "integer:64:512"))
    error = refused_in_one_line(
        lambda: _submit_spec(
            tmp_path, VERTEX_BASE, args, study=study("learning_rate", "double:0.01:0.1")
        )
    )
    assert error and "reference_batch_size" in str(error)


def test_good_trainer_flags_pass_the_check():
    task_flags.check_trainer_args(["--epochs=3", "--optimizer", "adam", "--nodeterministic"])
    task_flags.check_trainer_args(["--config=/in/the/image.json", "--lr_scaling=linear"])


# ---------------------------------------------------------------- fuzz

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=12),
)
_json = st.recursive(
    _scalars,
    lambda children: st.one_of(
        st.lists(children, max_size=3), st.dictionaries(st.text(max_size=6), children, max_size=3)
    ),
    max_leaves=8,
)
_raw = st.one_of(
    st.text(max_size=40),
    st.sampled_from([DEEP, "{" * 40, "NaN", "1e999", "[1, Infinity]", '{"a":1,"a":1}', "9" * 5000]),
)
_hosts = st.one_of(
    st.sampled_from(["localhost:2222", "10.0.0.1:1", "[::1]:2222", "[::1", "a:0", "a:65536"]),
    st.text(max_size=12),
    _scalars,
)


def _maybe_raw(structured):
    return st.one_of(structured.map(json.dumps), _raw)


@st.composite
def _tf_config(draw):
    roles = draw(
        st.dictionaries(
            st.sampled_from([*cluster_lib.ROLES, "master", "x"]),
            st.one_of(st.lists(_hosts, max_size=3), _json),
            max_size=3,
        )
    )
    task = draw(
        st.one_of(
            st.fixed_dictionaries(
                {
                    "type": st.one_of(st.sampled_from(cluster_lib.ROLES), _json),
                    "index": st.one_of(st.integers(-1, 3), _json),
                }
            ),
            _json,
        )
    )
    return {"cluster": roles, "task": task}


@st.composite
def _cluster_spec(draw):
    pools = draw(
        st.dictionaries(
            st.sampled_from([*cluster_lib.VERTEX_POOLS, "workerpool9"]),
            st.one_of(st.lists(_hosts, max_size=3), _json),
            max_size=4,
        )
    )
    task = draw(
        st.fixed_dictionaries(
            {
                "type": st.one_of(st.sampled_from(cluster_lib.VERTEX_POOLS), _json),
                "index": st.one_of(st.integers(-1, 3), _json),
            }
        )
    )
    return {"cluster": pools, "task": task}


def _assert_cluster_used(value, cluster: cluster_lib.Cluster, pools: dict | None = None):
    """An accepted variable was used: its task and its addresses are the cluster's."""
    given_type = value["task"]["type"]
    assert cluster.task_type == (pools[given_type] if pools else given_type)
    index = value["task"].get("index", 0)
    assert cluster.task_index == int(index)
    for role, hosts in value["cluster"].items():
        role = pools.get(role, role) if pools else role
        if hosts and role in cluster.addresses:
            assert list(cluster.addresses[role]) == hosts


@FUZZ
@given(st.one_of(_tf_config().map(lambda v: (v, json.dumps(v))), _raw.map(lambda t: (None, t))))
def test_fuzz_tf_config(case):
    value, text = case
    cluster = None

    def call():
        nonlocal cluster
        cluster = _resolve("TF_CONFIG", text)

    if refused_in_one_line(call) is None and value is not None:
        _assert_cluster_used(value, cluster)


_POOLS = {
    "workerpool0": "chief",
    "workerpool1": "worker",
    "workerpool2": "ps",
    "workerpool3": "evaluator",
}


@FUZZ
@given(st.one_of(_cluster_spec().map(lambda v: (v, json.dumps(v))), _raw.map(lambda t: (None, t))))
def test_fuzz_cluster_spec(case):
    value, text = case
    cluster = None

    def call():
        nonlocal cluster
        cluster = _resolve("CLUSTER_SPEC", text)

    if refused_in_one_line(call) is None and value is not None:
        pools = dict(_POOLS)
        if not cluster.num_ps and value["cluster"].get("workerpool2"):
            pools.pop("workerpool2")  # read as Reduction Server: not a role of ours
        _assert_cluster_used(value, cluster, pools)


_config_values = st.dictionaries(
    st.sampled_from([*config_lib.FIELDS, "bogus"]), _json, min_size=1, max_size=3
)


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory(prefix="tfdist-fuzz-") as directory:
        yield pathlib.Path(directory)


def _normalized(field: str, value):
    expected = config_lib.FIELDS[field].type
    if isinstance(value, list):
        return tuple(float(v) if expected == tuple[float, ...] else v for v in value)
    if expected is float and isinstance(value, int):
        return float(value)
    return value


@FUZZ
@given(st.one_of(_config_values.map(lambda v: (v, json.dumps(v))), _raw.map(lambda t: (None, t))))
def test_fuzz_config_file(scratch, case):
    value, text = case
    config = None

    def call():
        nonlocal config
        config = _load_config(scratch, text)

    if refused_in_one_line(call) is None and value is not None:
        for field, given_value in value.items():
            used = getattr(config, field)
            if (
                isinstance(given_value, str)
                and field in ("decay_boundaries",)
                or (isinstance(given_value, str) and isinstance(used, tuple))
            ):
                continue  # a comma-separated list, split as the flag splits it
            assert used == _normalized(field, given_value), (field, given_value, used)


@FUZZ
@given(st.one_of(_json.map(json.dumps), _raw))
def test_fuzz_task_config(text):
    parsed = None

    def call():
        nonlocal parsed
        parsed = tasks_lib.parse_task_config(text)

    if refused_in_one_line(call) is None:
        assert parsed == (json.loads(text) if text.strip() else {})


@FUZZ
@given(
    st.dictionaries(
        st.sampled_from([*shape_lib.TFJobShape.field_names(), "bogus"]), _json, max_size=3
    )
)
def test_fuzz_kubernetes_job_config(scratch, values):
    shape = None
    given_values = {**K8S_BASE, **values}

    def call():
        nonlocal shape
        shape = _tfjob_shape(scratch, given_values)

    if refused_in_one_line(call) is None:
        for field, value in given_values.items():
            used = getattr(shape, field)
            if isinstance(value, str) and isinstance(used, tuple):
                value = tuple(part for part in value.split(",") if part)
            assert used == (tuple(value) if isinstance(value, list) else value), field


@FUZZ
@given(st.dictionaries(st.sampled_from([*vertex_options.CONFIG_KEYS, "bogus"]), _json, max_size=3))
def test_fuzz_submit_job_config(scratch, values):
    given_values = {**VERTEX_BASE, **values}
    spec = None

    def call():
        nonlocal spec
        spec = _submit_spec(scratch, given_values)

    if refused_in_one_line(call) is None:
        if "trainer_args" in values:
            assert spec.trainer_args == tuple(values["trainer_args"])
        if isinstance(values.get("labels"), dict):
            assert dict(spec.labels) == values["labels"]


_flag_names = st.sampled_from(
    [*config_lib.FIELDS, "config", "verbosity", "bogus", "flagfile", "noseed"]
)
_flag_args = st.lists(
    st.one_of(
        st.builds(lambda name, value: f"--{name}={value}", _flag_names, _scalars),
        st.builds(lambda name: f"--{name}", _flag_names),
        st.text(max_size=8),
    ),
    max_size=4,
)


@FUZZ
@given(_flag_args)
def test_fuzz_trainer_flags_after_dashdash(args):
    passed = None

    def call():
        nonlocal passed
        passed = task_flags.check_trainer_args(args)

    # Only `--name=value` lists: `--tpu --strategy` gives --tpu the value "--strategy", as absl does.
    if refused_in_one_line(call) is None and all("=" in arg for arg in args):
        for arg in args:  # every option flag given is one trainer.task reads
            name = arg.lstrip("-").split("=", 1)[0]
            if name in config_lib.FIELDS:
                assert name in passed, (arg, passed)
