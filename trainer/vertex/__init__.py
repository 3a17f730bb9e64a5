"""Vertex AI jobs for the trainer: what `python -m trainer.submit` is made of.

One job per module, in the order a submission uses them:

    command        the flags of trainer.submit: the job, tuning and command tables
    options        the job's option table: flags, --job_config keys and defaults
    option_values  turning raw option values into typed ones (durations, labels, env)
    spec           the job model: MachineSpec, Scheduling, JobSpec (frozen, checked)
    machines       which accelerators, counts and TPU topologies each machine takes;
                   boot disks per family, ARM machines, the GPUs DWS provisions
    network        machines' egress bandwidth, for sizing Reduction Server (dated)
    images         prebuilt images Vertex lists (dated), image architecture
    tables         the dated tables those three use, as data files (tables/*.json):
                   loaded once at import and checked against their shapes
    regions        the regions Vertex AI runs in (the SDK's own list)
    validation     every rule a JobSpec is checked against, before anything is built
    rendering      JobSpec -> the CustomJob JSON the REST API takes
    tuning         hyperparameter tuning: its options, model and HyperparameterTuningJob JSON
    staging        building our sdist and the user's task package, uploading them
    client         sending a job through the Vertex AI client library
    bill           what a job will run, printed before every submission
    serving        uploading the exported SavedModel (Model.upload), and the gcloud lines
    dependencies   optional packages, named by the extra that installs them

Reading `--job_config`/`--hparam_tuning` files (size-capped) and the trainer flags a
spec carries (the crash-loop guard) are `trainer.submission`'s, shared with
`trainer.kubernetes`, which imports nothing from here.

Nothing here imports TensorFlow; only `client`, `serving.upload_model` and `staging`'s
upload import `google.cloud`, and only for a real submission.
"""
