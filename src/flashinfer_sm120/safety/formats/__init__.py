"""The input boundary (threat-model: P2, P6): what others could have written enters here once, bounded,
and leaves as a typed value or a :class:`~flashinfer_sm120.errors.FormatError`; import from the module."""
