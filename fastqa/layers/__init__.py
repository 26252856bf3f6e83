# dwsep_conv1d
from .dwsep_conv1d import DepthwiseSeparableConv1d  # noqa: E402,F401
