"""Import first in every benchmark script: ``import _isolate  # noqa: F401``.

``python benchmarks/<name>.py`` puts ``benchmarks/`` first on ``sys.path``, where the
label-efficiency script ``ssl.py`` would shadow the standard library's ``ssl`` module that
torch, wandb and urllib import. This moves the folder to the end of the path: the standard
library wins, and the scripts' helpers (``_figures``) stay importable.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE] + [_HERE]
