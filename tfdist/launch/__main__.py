"""`python -m tfdist.launch`: see `tfdist.launch.launcher`."""

from absl import flags

from tfdist.launch import launcher

__doc__ = launcher.__doc__  # what absl prints for --help
flags.adopt_module_key_flags(launcher)

launcher.launch_from_argv()
