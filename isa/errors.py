"""The project's one error root: every user-facing failure is a DynfuseError.

The CLI prints these without a traceback; anything else escaping is a bug.
"""

from __future__ import annotations


class DynfuseError(Exception):
    """Base of every error a user can cause (bad source, binary, config, model)."""


class IsaTableError(DynfuseError):
    """The ISA table itself is inconsistent (overlapping encodings, oversize fields)."""


class EncodingError(DynfuseError):
    """An operand value does not fit its field, or a word decodes to no instruction."""
