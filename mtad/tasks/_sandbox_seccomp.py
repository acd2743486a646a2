"""A small seccomp filter for the sandbox where no cgroup bounds a run (private to
:mod:`mtad.tasks.sandbox`; bubblewrap loads it with ``--seccomp FD`` just before the program's
interpreter starts).

Without a memory cgroup, memory-backed files are what escapes ``RLIMIT_AS``: the scratch folder
and ``/dev`` are size-limited or read-only tmpfs, so what is left are anonymous ones, which the
filter refuses (``EPERM``): ``memfd_create``, ``memfd_secret`` and SysV ``shmget`` (a segment
outlives its mapping). Without a CPU cgroup, with the scheduler's autogroups on, every new
session gets a CPU share of its own, so ``setsid`` is refused too (the run already has its own
session). Calls of another ABI (i386, x32 on x86-64) are refused as a whole, so they cannot
reach the same calls under other numbers.

The filter is classic BPF, built here with :mod:`struct` (no libseccomp needed).
"""

from __future__ import annotations

import errno
import platform
import struct

# linux/bpf_common.h, linux/seccomp.h, linux/audit.h
_LD_W_ABS = 0x00 | 0x00 | 0x20
_JEQ_K = 0x05 | 0x10 | 0x00
_JGE_K = 0x05 | 0x30 | 0x00
_RET_K = 0x06 | 0x00
_RET_ALLOW = 0x7FFF0000
_RET_ERRNO = 0x00050000
_X32_BIT = 0x40000000

# (audit arch, system call numbers) of the calls refused, per machine
_ARCH = {
    "x86_64": (
        0xC000003E,
        {"memfd_create": 319, "memfd_secret": 447, "shmget": 29, "setsid": 112},
    ),
    "aarch64": (
        0xC00000B7,
        {"memfd_create": 279, "memfd_secret": 447, "shmget": 194, "setsid": 157},
    ),
}
MEMORY_CALLS = ("memfd_create", "memfd_secret", "shmget")
SESSION_CALLS = ("setsid",)


def supported() -> bool:
    return platform.machine() in _ARCH


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("=HBBI", code, jt, jf, k)


def program(calls: tuple[str, ...], machine: str | None = None) -> bytes:
    """The filter refusing ``calls`` with ``EPERM`` (and every call of another ABI), for
    ``machine`` (this one's by default); raises KeyError for an unknown machine."""
    arch, numbers = _ARCH[machine or platform.machine()]
    deny = _insn(_RET_K, _RET_ERRNO | errno.EPERM)
    out = [
        _insn(_LD_W_ABS, 4),  # seccomp_data.arch
        _insn(_JEQ_K, arch, jt=1, jf=0),
        deny,
        _insn(_LD_W_ABS, 0),  # seccomp_data.nr
    ]
    if arch == _ARCH["x86_64"][0]:  # x32 calls carry the native arch with this bit set
        out += [_insn(_JGE_K, _X32_BIT, jt=0, jf=1), deny]
    for name in calls:
        out += [_insn(_JEQ_K, numbers[name], jt=0, jf=1), deny]
    out.append(_insn(_RET_K, _RET_ALLOW))
    return b"".join(out)
