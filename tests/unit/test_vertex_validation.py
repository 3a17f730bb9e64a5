"""`python -m trainer.submit` refuses, as Vertex AI would, before anything is
built or sent: one `error:` line, exit 2, at most ~100 characters of the value.

Every case here was accepted by the dry run (or crashed) before these checks."""


def test_regions_are_the_sdks_own_list():
    from google.cloud.aiplatform.constants import base

    from trainer.vertex import regions

    assert regions.sdk_regions() == base.SUPPORTED_REGIONS


def test_every_machine_in_the_table_passes_its_own_check():
    from trainer.vertex import machines

    for machine_type, built_in in machines.BUILT_IN.items():
        for topology in built_in.topologies:
            machines.check_machine(
                flag="--machine_type",
                machine_type=machine_type,
                accelerator_type=built_in.accelerator,
                accelerator_count=built_in.count,
                tpu_topology=topology,
            )
