"""Examples of using tfdist; `examples.tasks` holds tasks for `python -m trainer.task --task=...`."""
