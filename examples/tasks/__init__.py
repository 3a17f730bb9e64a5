"""Real-shaped tasks for `python -m trainer.task --task=examples.tasks.MODULE:NAME`.

- `examples.tasks.resnet:ResNetTask`: a small ResNet-style image classifier with
  batch normalization and augmentation layers that run only in training.
- `examples.tasks.transformer:TransformerTask`: a small Transformer text classifier
  on fixed-length, zero-padded token sequences.
- `examples.tasks.subclassed:SubclassedTask`: a subclassed `keras.Model` built from
  custom layers.

Each makes its own data offline, deterministically, and trains in seconds on a CPU.
"""
