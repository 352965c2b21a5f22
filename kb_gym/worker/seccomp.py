"""A seccomp filter for runners: no new sockets, no reaching into other processes' memory.

The network namespace leaves a runner no network, but a UNIX socket bound to a path on a shared
file system stays reachable through it, and Landlock (ABI <= 7) does not cover connecting to one.
A kernel needs neither sockets nor ptrace: ``socket``, ``socketpair``, ``ptrace``,
``process_vm_readv`` and ``process_vm_writev`` fail with EPERM. The runner's own pipes were made
before, so its protocol is unaffected. Installed with no_new_privs; every process the candidate
starts inherits it, and nothing can lift it.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _RET_K = 0x20, 0x15, 0x06
# (audit architecture, {name: syscall number})
_ARCHES = {
    "x86_64": (0xC000003E, {"socket": 41, "socketpair": 53, "ptrace": 101, "process_vm_readv": 310,
                            "process_vm_writev": 311}),
    "aarch64": (0xC00000B7, {"socket": 198, "socketpair": 199, "ptrace": 117, "process_vm_readv": 270,
                             "process_vm_writev": 271}),
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def deny_sockets_and_ptrace() -> dict[str, object]:
    """Install the filter on this process; returns what was denied (empty where unsupported)."""
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return {"seccomp": False, "why": f"no syscall table for {platform.machine()}"}
    audit_arch, numbers = arch
    denied = list(numbers.values())
    prog = [_insn(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
            _insn(_JEQ_K, 1, 0, audit_arch), _insn(_RET_K, 0, 0, _RET_ALLOW),
            _insn(_LD_W_ABS, 0, 0, 0)]  # seccomp_data.nr
    for i, nr in enumerate(denied):
        # Match: jump to the final ERRNO return, past the remaining checks and the ALLOW.
        prog.append(_insn(_JEQ_K, len(denied) - i, 0, nr))
    prog += [_insn(_RET_K, 0, 0, _RET_ALLOW), _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]
    code = b"".join(prog)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return {"seccomp": False, "why": "prctl(NO_NEW_PRIVS) failed"}
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return {"seccomp": False, "why": f"prctl(SECCOMP) failed: errno {ctypes.get_errno()}"}
    return {"seccomp": True, "denied": sorted(numbers)}
