"""Import first in every benchmark script: ``import _isolate  # noqa: F401``.

``python benchmarks/<name>.py`` puts ``benchmarks/`` first on ``sys.path``, where the
label-efficiency script ``ssl.py`` would shadow the standard library's ``ssl`` module that
torch, wandb and urllib import. This drops the folder from the path again.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
