"""The input boundary: everything flashinfer-sm120 reads that someone else could have written
enters here once and leaves as a typed value (threat-model: P2, P6).  Reads are capped while reading
and never wait on a FIFO; JSON depth is measured before parsing, ``NaN`` refused; one grammar per
kind of value; paths we write are joined by :func:`safe_join` and created by
:func:`make_private_dirs`; messages quote values cut by :func:`shown`.  Every refusal is a
:class:`FormatError` naming the source, the value (cut) and the fix.

This package exports what every process reads through (:mod:`.base`, :mod:`.reads`, :mod:`.grammar`,
:mod:`.paths`); parsers only commands need are imported from their module so ``import flashinfer``
loads none: :mod:`.flags`, :mod:`.params`, :mod:`.binary`, :mod:`.cli`, :mod:`.tar`.
"""
