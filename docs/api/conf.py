"""Sphinx configuration of hogrod's API reference (autodoc + napoleon, Google style).

Built by the suite with warnings as errors (tests/test_docstrings.py):
``python -m sphinx -b html -W docs/api docs/api/_build``.
"""

project = "hogrod"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False
# a record's `Attributes:` as fields of its class, not attribute entries of their own, which
# would clash with autodoc's entries for the namedtuple/dataclass fields (duplicate objects)
napoleon_use_ivar = True
autodoc_default_options = {"members": True, "imported-members": True, "undoc-members": False,
                           "show-inheritance": True}
autodoc_member_order = "bysource"
# signatures show the aliases of hogrod.types by name, not expanded
autodoc_type_aliases = {name: f"hogrod.types.{name}" for name in
                        ["Tensor", "TensorLike", "Tree", "Params", "Batch", "DType", "Seed",
                         "Loss", "Objective", "OutputLoss", "MatVec", "Scalar"]}
autodoc_typehints = "signature"
# TensorFlow's, Keras's and numpy's classes in annotations are not documented here
nitpicky = False
suppress_warnings = ["ref.python"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
