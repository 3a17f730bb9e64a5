"""Each command's flag set, pinned: names, kinds and defaults (tests of the option tables).

Every trainer command derives its absl flags from option tables of one row type,
`trainer.options.Option` (the trainer's `option(...)` fields): `trainer.task` from
`trainer.config.ExperimentConfig`, `trainer.submit` from `trainer.vertex.command`,
`trainer.kubernetes` from `trainer.kubernetes.options`, `trainer.ray` from
`trainer.ray.RayOptions`. A flag added, dropped,
renamed or given another default or kind here is a change of a command's interface:
it fails below until the pin is updated with it (and its docs).
"""

import ast
import dataclasses
import functools
import pathlib
import re
import typing

import pytest
from absl import flags

from trainer import options as options_lib
from trainer import ray, task_flags
from trainer.kubernetes import options as kubernetes_options
from trainer.kubernetes import shape as shape_lib
from trainer.vertex import command, network, serving, tuning
from trainer.vertex import options as vertex_options

REPO = pathlib.Path(__file__).resolve().parents[2]

# What absl calls each kind, as `tfdist.cli.FlagSpec` names it.
_KINDS = {
    "string": "string",
    "int": "integer",
    "float": "float",
    "bool": "boolean",
    "multi string": "multi_string",
    "comma separated list of strings": "list",
}

TRAINER_TASK = {
    "strategy": ("string", "auto"),
    "all_reduce": ("string", "auto"),
    "num_cpu_devices": ("integer", 0),
    "tpu": ("string", ""),
    "peer_timeout_seconds": ("float", 30.0),
    "config": ("string", None),
    "chief_start_timeout_seconds": ("float", 1800.0),
    "task": ("string", ""),
    "task_config": ("string", ""),
    "model": ("string", "mlp"),
    "dataset": ("string", "synthetic"),
    "data_dir": ("string", ""),
    "num_examples": ("integer", 8192),
    "epochs": ("integer", 3),
    "steps_per_epoch": ("integer", 0),
    "validation_steps": ("integer", 0),
    "global_batch_size": ("integer", 64),
    "steps_per_execution": ("string", "auto"),
    "jit_compile": ("string", "auto"),
    "all_reduce_dtype": ("string", "float32"),
    "optimizer": ("string", "sgd"),
    "learning_rate": ("float", 0.05),
    "momentum": ("float", 0.9),
    "weight_decay": ("float", 0.0),
    "lr_scaling": ("string", "none"),
    "reference_batch_size": ("integer", 0),
    "warmup_epochs": ("float", 0.0),
    "warmup_steps": ("integer", 0),
    "lr_decay": ("string", "constant"),
    "decay_power": ("float", 2.0),
    "decay_boundaries": ("list", ()),
    "decay_rate": ("float", 0.1),
    "exclude_from_weight_decay": ("list", ()),
    "exclude_from_layer_adaptation": ("list", ()),
    "seed": ("integer", 0),
    "deterministic": ("boolean", False),
    "mixed_precision": ("string", "none"),
    "model_dir": ("string", ""),
    "backup_dir": ("string", ""),
    "backup_every_steps": ("integer", 0),
    "max_input_state_mb": ("integer", 128),
    "keep_backup": ("boolean", False),
    "preemption_grace_seconds": ("float", 25.0),
    "max_restarts_without_progress": ("integer", 3),
    "tensorboard_dir": ("string", ""),
    "evaluation_checkpoints": ("boolean", False),
    "export": ("string", ""),
    "hparam_metric": ("string", ""),
}
TRAINER_SUBMIT = {
    "project": ("string", ""),
    "region": ("string", ""),
    "staging_bucket": ("string", ""),
    "display_name": ("string", ""),
    "strategy": ("string", "auto"),
    "machine_type": ("string", "n2-standard-4"),
    "accelerator_type": ("string", ""),
    "accelerator_count": ("integer", 0),
    "tpu_topology": ("string", ""),
    "workers": ("integer", 0),
    "parameter_servers": ("integer", 0),
    "parameter_server_machine_type": ("string", ""),
    "reduction_servers": ("integer", 0),
    "reduction_server_machine_type": ("string", network.REDUCTION_SERVER_MACHINE_TYPE),
    "reduction_server_image": ("string", network.REDUCTION_SERVER_IMAGE),
    "evaluators": ("integer", 0),
    "evaluator_machine_type": ("string", ""),
    "boot_disk_type": ("string", ""),
    "boot_disk_size_gb": ("integer", 100),
    "container_uri": ("string", ""),
    "image_architecture": ("string", ""),
    "allow_ended_image": ("boolean", False),
    "allow_fewer_reducers": ("boolean", False),
    "task_package": ("string", ""),
    "service_account": ("string", ""),
    "scheduling": ("string", "standard"),
    "max_wait_duration": ("string", ""),
    "restart_job_on_worker_restart": ("boolean", False),
    "disable_retries": ("boolean", False),
    "timeout": ("string", ""),
    "base_output_dir": ("string", ""),
    "tensorboard": ("string", ""),
    "enable_web_access": ("boolean", False),
    "enable_dashboard_access": ("boolean", False),
    "psc_network_attachment": ("string", ""),
    "reserved_ip_ranges": ("string", ""),
    "gpu_partition_size": ("string", ""),
    "network": ("string", ""),
    "reservation_affinity": ("string", ""),
    "kms_key_name": ("string", ""),
    "labels": ("string", ""),
    "persistent_resource_id": ("string", ""),
    "experiment": ("string", ""),
    "experiment_run": ("string", ""),
    "nfs_mount": ("multi_string", ()),
    "lustre_mount": ("multi_string", ()),
    "env": ("multi_string", ()),
    "hparam_metric": ("string", ""),
    "hparam_goal": ("string", ""),
    "hparam": ("multi_string", ()),
    "hparam_algorithm": ("string", "bayesian"),
    "max_trial_count": ("integer", 10),
    "parallel_trial_count": ("integer", 1),
    "max_failed_trial_count": ("integer", 0),
    "hparam_early_stopping": ("string", ""),
    "job_config": ("string", ""),
    "hparam_tuning": ("string", ""),
    "dry_run": ("boolean", False),
    "wait": ("boolean", False),
    "attach": ("string", ""),
    "cancel": ("string", ""),
    "poll_seconds": ("float", 30.0),
    "api_endpoint": ("string", ""),
    "serving_commands": ("boolean", False),
    "serving_container_uri": ("string", serving.DEFAULT_SERVING_IMAGE),
    "upload": ("boolean", False),
    "artifact_uri": ("string", ""),
}
TRAINER_KUBERNETES = {
    "job_config": ("string", ""),
    "format": ("string", "json"),
    "api": ("string", "tfjob"),
    "check": ("string", ""),
    "name": ("string", ""),
    "image": ("string", ""),
    "namespace": ("string", ""),
    "strategy": ("string", "multiworker"),
    "chief": ("boolean", True),
    "workers": ("integer", 1),
    "parameter_servers": ("integer", 0),
    "evaluators": ("integer", 0),
    "cpu": ("string", "4"),
    "memory": ("string", "16Gi"),
    "gpus": ("integer", 0),
    "gpu_resource": ("string", "nvidia.com/gpu"),
    "ps_cpu": ("string", "4"),
    "ps_memory": ("string", "16Gi"),
    "volume_claim": ("string", ""),
    "bucket": ("string", ""),
    "mount_path": ("string", "/mnt/tfdist"),
    "backup_every_steps": ("integer", 100),
    "restart_policy": ("string", "ExitCode"),
    "backoff_limit": ("integer", 6),
    "clean_pod_policy": ("string", "None"),
    "termination_grace_seconds": ("integer", 30),
    "service_account": ("string", ""),
    "node_selector": ("list", ()),
}
TRAINER_RAY = {
    "num_workers": ("integer", 2),
    "chief": ("boolean", False),
    "num_ps": ("integer", 0),
    "evaluator": ("boolean", False),
    "cpus_per_task": ("integer", 1),
    "use_gpu": ("boolean", False),
    "gpus_per_task": ("float", 0.0),
    "resources_per_task": ("string", ""),
    "accelerator_type": ("string", ""),
    "max_failures": ("integer", 0),
    "max_preemption_failures": ("integer", -1),
    "storage_path": ("string", ""),
    "name": ("string", "tfdist-trainer"),
    "address": ("string", ""),
}


def _defined(define) -> dict:
    """`{name: (kind, default)}` of the flags `define(flag_values)` defines (absl's own left out)."""
    flag_values = flags.FlagValues()
    define(flag_values)
    return _pinned(flag_values)


def _pinned(flag_values: flags.FlagValues) -> dict:
    return {
        flag.name: (
            _KINDS[flag.flag_type()],
            tuple(flag.default) if isinstance(flag.default, list) else flag.default,
        )
        for module, module_flags in flag_values.flags_by_module_dict().items()
        if not module.startswith("absl.")
        for flag in module_flags
    }


def test_the_flags_of_trainer_task_are_pinned():
    define = functools.partial(task_flags.define_task_flags, module_name="trainer.task")
    assert _defined(define) == TRAINER_TASK


def test_the_flags_of_trainer_submit_are_pinned():
    assert _defined(command.define_flags) == TRAINER_SUBMIT


def test_the_flags_of_trainer_kubernetes_are_pinned():
    assert _defined(kubernetes_options.define_flags) == TRAINER_KUBERNETES


def test_the_flags_of_trainer_ray_are_pinned():
    assert _pinned(ray.RAY_FLAGS) == TRAINER_RAY
    bounds = {row.name: row.lower_bound for row in ray.RAY_OPTIONS if row.lower_bound is not None}
    assert bounds == {
        "num_workers": 0,
        "num_ps": 0,
        "cpus_per_task": 1,
        "gpus_per_task": 0,
        "max_failures": -1,
        "max_preemption_failures": -1,
    }
    assert {name: ray.RAY_FLAGS[name].parser.lower_bound for name in bounds} == bounds


def test_config_file_keys_are_the_tables_options_plus_the_file_only_ones():
    assert vertex_options.CONFIG_KEYS == (
        *(row.name for row in vertex_options.OPTIONS if row.is_flag),
        "trainer_args",
        "description",
    )
    assert tuning.TUNING_KEYS == (
        *(row.name for row in tuning.TUNING_OPTIONS if row.is_flag),
        "description",
    )
    assert kubernetes_options.CONFIG_KEYS == (
        *(row.name for row in kubernetes_options.SHAPE_OPTIONS if row.is_flag),
        "trainer_args",
        "description",
    )
    for rows in (command.COMMAND_OPTIONS, kubernetes_options.COMMAND_OPTIONS, ray.RAY_OPTIONS):
        assert options_lib.config_keys(rows) == ()


def test_the_kubernetes_shape_options_are_the_shape_fields_with_their_types_and_defaults():
    shape_types = typing.get_type_hints(shape_lib.TFJobShape)
    rows = {row.name: row for row in kubernetes_options.SHAPE_OPTIONS if row.name != "description"}
    assert tuple(rows) == shape_lib.TFJobShape.field_names()
    for field in dataclasses.fields(shape_lib.TFJobShape):
        assert rows[field.name].value_type == shape_types[field.name], field.name
        if field.default is not dataclasses.MISSING:
            assert rows[field.name].default == field.default, field.name


# The module that turns option rows into absl flags.
_DEFINES_FLAGS = {"trainer/options.py"}


def _flag_definitions(path: pathlib.Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = owner.id if isinstance(owner, ast.Name) else ""
            if (name == "cli" and node.func.attr in ("FlagSpec", "define_flags")) or (
                name == "flags" and node.func.attr.startswith("DEFINE")
            ):
                yield node.lineno, f"{name}.{node.func.attr}"


def test_no_trainer_command_defines_a_flag_outside_an_option_table():
    found = [
        f"{path.relative_to(REPO)}:{line} calls {call}"
        for path in sorted((REPO / "trainer").rglob("*.py"))
        if str(path.relative_to(REPO)) not in _DEFINES_FLAGS
        for line, call in _flag_definitions(path)
    ]
    assert not found, "declare the flag with option(...) in the command's table:\n" + "\n".join(
        found
    )


@pytest.mark.parametrize(
    "doc, names",
    [
        ("docs/vertex.md", tuple(TRAINER_SUBMIT)),
        ("docs/engines.md", tuple(TRAINER_KUBERNETES)),
        ("docs/engines.md", tuple(TRAINER_RAY)),
        ("docs/flags.md", tuple(TRAINER_TASK)),
    ],
)
def test_every_flag_is_in_its_command_s_docs(doc, names):
    text = (REPO / doc).read_text()
    missing = [name for name in names if not re.search(rf"(`|--){name}(?![A-Za-z0-9_])", text)]
    assert not missing, f"{doc} does not name {missing}"
