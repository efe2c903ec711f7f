"""Where hogrod's data sets are: a folder the caller gives, else `$HOGROD_DATA/<name>`.

The caller's folder comes from a gin binding or an argument.
HOGROD_DATA names one folder holding a subfolder per data set (`omniglot/` with Omniglot's
two zips, `pinnacle/` with PINNacle's reference files). A relative path is relative to the
working directory. No shipped config binds a data path: an installed package has no folder
beside it to point at.
"""

import os
from typing import Optional

__all__ = ["ENV", "data_dir"]

ENV = "HOGROD_DATA"


def data_dir(name: str, binding: str, directory: Optional[str | os.PathLike] = None) -> str:
    """The folder of the data set `name`: `directory` when given, else `$HOGROD_DATA/<name>`.

    Args:
      name: the data set's subfolder of HOGROD_DATA ("omniglot", "pinnacle").
      binding: what sets `directory` (a gin binding, an argument), named in the error.
      directory: the folder given by the caller (relative to the working directory, or
        absolute), or None: `$HOGROD_DATA/<name>`.

    Returns:
      The folder's path, normalized (whether it exists is the reader's to check, naming the
      files it wants).

    Raises:
      ValueError: `directory` is None and HOGROD_DATA is unset or empty; the message names
        `binding` and HOGROD_DATA.
    """
    if directory is None:
        root = os.environ.get(ENV)
        if not root:
            raise ValueError(f"no folder for the {name} data: bind {binding}, or set the "
                             f"environment variable {ENV} to a folder holding {name}/")
        directory = os.path.join(root, name)
    return os.path.normpath(os.fspath(directory))
