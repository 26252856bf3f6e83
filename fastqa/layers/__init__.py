# glu_conv1d
from .glu_conv1d import GLUConv1d  # noqa: E402,F401
