"""Kubernetes jobs (Kubeflow TFJob, JobSet, Kubeflow Trainer v2) for the trainer: `python -m trainer.kubernetes`.

    shape      TFJobShape: the job's replicas, pods and policies, checked (frozen)
    options    the option tables: the shape's flags and --job_config keys, the command's flags
    manifest   TFJobShape -> the TFJob manifest (kubeflow.org/v1)
    jobset     TFJobShape -> a JobSet, or a Kubeflow Trainer v2 TrainingRuntime + TrainJob
    checks     what the training operator and tfdist refuse in any TFJob manifest
    api_schema the TFJob API's field names and types as a JSON Schema, from the
               kubeflow-training SDK's models (needs the `kubernetes` extra)
    __main__   the command line: --job_config and flags in, the manifest out

Nothing here imports TensorFlow, and only api_schema a Kubernetes client's models: the command writes a
manifest for `kubectl apply -f` and contacts nothing. See docs/engines.md.
"""
