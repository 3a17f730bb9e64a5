"""`python -m tfdist.launch`: see `tfdist.launch`."""

from absl import flags

from tfdist import launch

__doc__ = launch.__doc__  # what absl prints for --help
flags.adopt_module_key_flags(launch)

launch.launch_from_argv()
