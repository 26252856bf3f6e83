# glu_conv1d
from .glu_conv1d import glu_conv1d, glu_conv1d_step  # noqa: E402,F401
