"""Kubernetes (Kubeflow TFJob) jobs for the trainer: `python -m trainer.kubernetes`.

    shape      TFJobShape: the job's replicas, pods and policies, checked (frozen)
    manifest   TFJobShape -> the TFJob manifest (kubeflow.org/v1)
    checks     what the training operator and tfdist refuse in any TFJob manifest
    __main__   the command line: --job_config and flags in, the manifest out

Nothing here imports TensorFlow or a Kubernetes client: the command writes a
manifest for `kubectl apply -f` and contacts nothing. See docs/engines.md.
"""
