"""A seccomp filter for runners: the system calls a kernel never needs and an escape would.

The network namespace leaves a runner no network, but a UNIX socket bound to a path on a shared
file system stays reachable through it, and Landlock (ABI <= 7) does not cover connecting to one, so
new sockets are refused (``socket``, ``socketpair``, and io_uring, whose IORING_OP_SOCKET makes one
without the ``socket`` call). Then what reaches other processes or the host (``ptrace``,
``process_vm_*``, mounts, ``setns``, device nodes, kernel modules, kexec, swap, reboot), what sets the
clocks a timing could be skewed with (``adjtimex``, ``clock_adjtime``, ``clock_settime``,
``settimeofday``), the kernel keyring, which outlives the runner (``add_key``, ``request_key``,
``keyctl``), and what a root evaluator's capabilities would otherwise lend a runner (I/O ports, BPF,
perf events, file handles, other processes' descriptors). A call of another architecture (i386's
``int 0x80``, x32's numbers) is refused whole: a filter that checks numbers of one table must not let
the other tables through (round 4 reached a host socket that way). Everything denied fails with
EPERM. Installed with no_new_privs; every process the candidate starts inherits it, and nothing can
lift it. The runner's own pipes were made before, so its protocol is unaffected; its setup mounts
happen before, too.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import struct

_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_RET_ALLOW, _RET_ERRNO = 0x7FFF0000, 0x00050000
_LD_W_ABS, _JEQ_K, _JGE_K, _RET_K = 0x20, 0x15, 0x35, 0x06
_X32_BIT = 0x40000000  # x86_64's x32 ABI: the same architecture word, numbers with this bit set

DENIED = ("socket", "socketpair", "io_uring_setup", "io_uring_enter", "io_uring_register",
          "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root", "setns",
          "mknodat", "mknod", "init_module", "finit_module", "delete_module", "kexec_load", "kexec_file_load",
          "swapon", "swapoff", "reboot", "adjtimex", "clock_adjtime", "clock_settime", "settimeofday",
          "add_key", "request_key", "keyctl", "iopl", "ioperm", "bpf", "perf_event_open", "open_by_handle_at",
          "pidfd_getfd", "process_madvise")
# (audit architecture, {name: syscall number}); a name missing from a table has no such call there
_ARCHES = {
    "x86_64": (0xC000003E, {
        "socket": 41, "socketpair": 53, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "mount": 165, "umount2": 166,
        "pivot_root": 155, "setns": 308, "mknodat": 259, "mknod": 133, "init_module": 175, "finit_module": 313,
        "delete_module": 176, "kexec_load": 246, "kexec_file_load": 320, "swapon": 167, "swapoff": 168,
        "reboot": 169, "adjtimex": 159, "clock_adjtime": 305, "clock_settime": 227, "settimeofday": 164,
        "add_key": 248, "request_key": 249, "keyctl": 250, "iopl": 172, "ioperm": 173, "bpf": 321,
        "perf_event_open": 298, "open_by_handle_at": 304, "pidfd_getfd": 438, "process_madvise": 440}),
    "aarch64": (0xC00000B7, {
        "socket": 198, "socketpair": 199, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "mount": 40, "umount2": 39,
        "pivot_root": 41, "setns": 268, "mknodat": 33, "init_module": 105, "finit_module": 273,
        "delete_module": 106, "kexec_load": 104, "kexec_file_load": 294, "swapon": 224, "swapoff": 225,
        "reboot": 142, "adjtimex": 171, "clock_adjtime": 266, "clock_settime": 112, "settimeofday": 170,
        "add_key": 217, "request_key": 218, "keyctl": 219, "bpf": 280, "perf_event_open": 241,
        "open_by_handle_at": 265, "pidfd_getfd": 438, "process_madvise": 440}),
}


def _insn(code: int, jt: int, jf: int, k: int) -> bytes:
    return struct.pack("HBBI", code, jt, jf, k)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _program(audit_arch: int, numbers: list[int], x32: bool) -> list[bytes]:
    """arch != ours -> deny; (x86_64) nr >= x32 bit -> deny; nr in numbers -> deny; else allow."""
    checks = ([(_JGE_K, _X32_BIT)] if x32 else []) + [(_JEQ_K, nr) for nr in numbers]
    prog = [_insn(_LD_W_ABS, 0, 0, 4),  # seccomp_data.arch
            _insn(_JEQ_K, 0, len(checks) + 2, audit_arch),  # another architecture: to the deny at the end
            _insn(_LD_W_ABS, 0, 0, 0)]  # seccomp_data.nr
    # a match jumps past the remaining checks and the ALLOW, to the deny
    prog += [_insn(code, len(checks) - i, 0, k) for i, (code, k) in enumerate(checks)]
    return prog + [_insn(_RET_K, 0, 0, _RET_ALLOW), _insn(_RET_K, 0, 0, _RET_ERRNO | errno.EPERM)]


def deny_escape_syscalls() -> dict[str, object]:
    """Install the filter on this process; returns what was denied (empty where unsupported)."""
    arch = _ARCHES.get(platform.machine())
    if arch is None:
        return {"seccomp": False, "why": f"no syscall table for {platform.machine()}"}
    audit_arch, table = arch
    names = [n for n in DENIED if n in table]
    prog = _program(audit_arch, [table[n] for n in names], x32=platform.machine() == "x86_64")
    code = b"".join(prog)
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = _SockFprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        return {"seccomp": False, "why": "prctl(NO_NEW_PRIVS) failed"}
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        return {"seccomp": False, "why": f"prctl(SECCOMP) failed: errno {ctypes.get_errno()}"}
    return {"seccomp": True, "denied": sorted(names), "other_architectures": "denied"}
