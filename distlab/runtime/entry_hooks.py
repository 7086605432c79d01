"""A function's own code that reports each start: a call placed at the head of its bytecode.

Why not a profile or trace hook: ``sys.setprofile`` runs a Python function on every call, return
and C call of the thread, and any hook at all (``sys.settrace`` too) switches CPython 3.11 to its
slow, unspecialized dispatch for every instruction: a rank's Python-heavy torch work (an MLP's
AdamW training) costs ~45% more under ``setprofile``, ~20% more under a global-only ``settrace``.
Python 3.11 has no per-code event (3.12's ``sys.monitoring``), so the guarded code itself carries
the call: nothing else the rank runs pays anything.

``with_entry_call(code, hook)`` is ``code`` with ``hook()`` run right after its ``RESUME`` (once per
call; a generator's first step), everything else (jumps, the exception table, the locations
that tracebacks show) kept as it was. CPython 3.11's bytecode format only: another version says
so (``SUPPORTED``) and the caller falls back.
"""
from __future__ import annotations

import dis
import sys
import types

SUPPORTED = sys.version_info[:2] == (3, 11)
_OP = dis.opmap


def _instruction(name: str, arg: int = 0) -> bytes:
    """One instruction with its EXTENDED_ARG prefixes and its inline cache entries."""
    prefix = []
    high = arg >> 8
    while high:
        prefix.append(high & 0xFF)
        high >>= 8
    out = b"".join(bytes([_OP["EXTENDED_ARG"], byte]) for byte in reversed(prefix))
    return out + bytes([_OP[name], arg & 0xFF]) + bytes(2 * dis._inline_cache_entries[_OP[name]])


def _prologue(const_index: int) -> bytes:
    """``hook()`` with its result dropped (3.11's calling convention: NULL, callable, PRECALL,
    CALL)."""
    return (_instruction("PUSH_NULL") + _instruction("LOAD_CONST", const_index)
            + _instruction("PRECALL", 0) + _instruction("CALL", 0) + _instruction("POP_TOP"))


def _head(code: types.CodeType) -> int:
    """The offset right after the first RESUME: where the body starts (after a generator's
    RETURN_GENERATOR, so the call runs when the body does)."""
    for ins in dis.get_instructions(code):
        if ins.opname == "RESUME":
            return ins.offset + 2
    raise ValueError(f"{code.co_qualname}: no RESUME instruction")


# -- the exception table: entries of (start, end, target, depth, lasti), in code units, each
# number a varint of 6-bit chunks, most significant first, bit 64 = more, bit 128 = entry start

def _except_varint(value: int, first: bool) -> bytes:
    chunks = [value & 63]
    value >>= 6
    while value:
        chunks.append(value & 63)
        value >>= 6
    chunks.reverse()
    out = bytes([c | 64 for c in chunks[:-1]] + [chunks[-1]])
    return bytes([out[0] | 128]) + out[1:] if first else out


def _shifted_exception_table(code: types.CodeType, at: int, size: int) -> bytes:
    """The table with every offset at or after ``at`` moved by ``size`` bytes (an entry that
    spans ``at`` grows: the inserted call is inside it)."""
    out = b""
    for entry in dis._parse_exception_table(code):
        start = entry.start + size if entry.start >= at else entry.start
        end = entry.end + size if entry.end > at else entry.end
        target = entry.target + size if entry.target >= at else entry.target
        out += (_except_varint(start // 2, True) + _except_varint((end - start) // 2, False)
                + _except_varint(target // 2, False)
                + _except_varint(entry.depth << 1 | entry.lasti, False))
    return out


# -- the location table (Objects/locations.md in CPython 3.11): re-encoded from co_positions()
# in its long form, one entry per run of equal positions (at most 8 code units each)

def _loc_varint(value: int) -> bytes:
    out = []
    while value >= 64:
        out.append(64 | (value & 63))
        value >>= 6
    return bytes(out + [value])


def _loc_svarint(value: int) -> bytes:
    return _loc_varint((-value) << 1 | 1 if value < 0 else value << 1)


def _location_table(positions: list, first_line: int) -> bytes:
    out, line, i = b"", first_line, 0
    while i < len(positions):
        n = 1
        while n < 8 and i + n < len(positions) and positions[i + n] == positions[i]:
            n += 1
        start, end, col, end_col = positions[i]
        if start is None:
            out += bytes([0x80 | 15 << 3 | (n - 1)])                      # no location
        elif col is None or end_col is None:
            out += bytes([0x80 | 13 << 3 | (n - 1)]) + _loc_svarint(start - line)   # no column
            line = start
        else:
            out += (bytes([0x80 | 14 << 3 | (n - 1)]) + _loc_svarint(start - line)
                    + _loc_varint((end if end is not None else start) - start)
                    + _loc_varint(col + 1) + _loc_varint(end_col + 1))
            line = start
        i += n
    return out


def with_entry_call(code: types.CodeType, hook) -> types.CodeType:
    """``code`` that calls ``hook()`` (no arguments, result dropped) each time its body starts.
    Jumps in 3.11 are relative and none crosses the head, so only the tables move."""
    at = _head(code)
    prologue = _prologue(len(code.co_consts))
    positions = list(code.co_positions())
    units = len(prologue) // 2
    # the call shows the location of the RESUME before it (the def line) in a traceback
    positions[at // 2:at // 2] = [positions[at // 2 - 1]] * units
    return code.replace(
        co_code=code.co_code[:at] + prologue + code.co_code[at:],
        co_consts=code.co_consts + (hook,),
        co_stacksize=max(code.co_stacksize, 2),
        co_exceptiontable=_shifted_exception_table(code, at, len(prologue)),
        co_linetable=_location_table(positions, code.co_firstlineno))
