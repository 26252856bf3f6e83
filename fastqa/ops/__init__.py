# dwsep_conv1d
from .dwsep_conv1d import dwsep_conv1d  # noqa: E402,F401
