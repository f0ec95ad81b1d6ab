"""Win32 constants and ctypes structures for the AppContainer backend.

The values come from the Windows SDK headers, and tests pin each one. The structures are
declared with explicit widths (DWORD = 32 bits, pointers and handles = `c_void_p`) so their x64
layout can be checked on any host against the sizes in the SDK headers (`struct_sizes`). This
module imports everywhere: declaring a structure calls nothing in Windows.
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Sequence

# --- constants (values from the Windows SDK headers; tests pin each one) ---------------------

# processthreadsapi.h builds these with ProcThreadAttributeValue: the attribute number, plus
# the INPUT flag (not thread-scoped, not additive).
PROC_THREAD_ATTRIBUTE_INPUT: Final = 0x00020000
PROC_THREAD_ATTRIBUTE_HANDLE_LIST: Final = 2 | PROC_THREAD_ATTRIBUTE_INPUT  # 0x00020002
PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES: Final = 9 | PROC_THREAD_ATTRIBUTE_INPUT  # 0x00020009

CREATE_SUSPENDED: Final = 0x00000004
CREATE_UNICODE_ENVIRONMENT: Final = 0x00000400
EXTENDED_STARTUPINFO_PRESENT: Final = 0x00080000
CREATE_NO_WINDOW: Final = 0x08000000
STARTF_USESTDHANDLES: Final = 0x00000100

JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE: Final = 0x00002000
JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS: Final = 9  # JobObjectExtendedLimitInformation

WAIT_OBJECT_0: Final = 0x00000000
WAIT_TIMEOUT: Final = 0x00000102
INFINITE: Final = 0xFFFFFFFF

# File rights (winnt.h). FILE_GENERIC_* are the generic-mapped sets for files.
FILE_READ_DATA: Final = 0x0001
FILE_WRITE_DATA: Final = 0x0002
FILE_APPEND_DATA: Final = 0x0004  # on a named pipe this bit is FILE_CREATE_PIPE_INSTANCE
FILE_CREATE_PIPE_INSTANCE: Final = 0x0004
FILE_READ_ATTRIBUTES: Final = 0x0080
DELETE: Final = 0x00010000
READ_CONTROL: Final = 0x00020000
SYNCHRONIZE: Final = 0x00100000
FILE_GENERIC_READ: Final = 0x00120089
FILE_GENERIC_WRITE: Final = 0x00120116
FILE_GENERIC_EXECUTE: Final = 0x001200A0
# What the payload gets: read/execute on the interpreter and probe dir, modify on the workspace.
ACCESS_READ_EXECUTE: Final = FILE_GENERIC_READ | FILE_GENERIC_EXECUTE  # 0x001200A9
ACCESS_MODIFY: Final = FILE_GENERIC_READ | FILE_GENERIC_WRITE | FILE_GENERIC_EXECUTE | DELETE

# accctrl.h
GRANT_ACCESS: Final = 1
REVOKE_ACCESS: Final = 4
NO_INHERITANCE: Final = 0
SUB_CONTAINERS_AND_OBJECTS_INHERIT: Final = 3
TRUSTEE_IS_SID: Final = 0
TRUSTEE_IS_UNKNOWN: Final = 0
SE_FILE_OBJECT: Final = 1
DACL_SECURITY_INFORMATION: Final = 0x00000004
LABEL_SECURITY_INFORMATION: Final = 0x00000010
SDDL_REVISION_1: Final = 1
# A Low mandatory label that child files and folders inherit: AppContainer tokens run at Low
# integrity, and no-write-up would otherwise refuse writes to a Medium-labelled workspace.
LOW_LABEL_SDDL_INHERIT: Final = "S:(ML;OICI;NW;;;LW)"

# HRESULT_FROM_WIN32(ERROR_ALREADY_EXISTS): CreateAppContainerProfile's "derive instead".
HRESULT_ALREADY_EXISTS: Final = 0x800700B7
ERROR_INSUFFICIENT_BUFFER: Final = 122

# --- structures (x64 layout; tests/backends/test_appcontainer.py pins the sizes) -------------

DWORD = ctypes.c_uint32
WORD = ctypes.c_uint16
HANDLE = ctypes.c_void_p
LPVOID = ctypes.c_void_p


class SECURITY_ATTRIBUTES(ctypes.Structure):  # noqa: N801  (the SDK's name)
    """winbase.h SECURITY_ATTRIBUTES."""

    _fields_ = (
        ("nLength", DWORD),
        ("lpSecurityDescriptor", LPVOID),
        ("bInheritHandle", ctypes.c_int32),
    )


class SID_AND_ATTRIBUTES(ctypes.Structure):  # noqa: N801
    """winnt.h SID_AND_ATTRIBUTES."""

    _fields_ = (("Sid", LPVOID), ("Attributes", DWORD))


class SECURITY_CAPABILITIES(ctypes.Structure):  # noqa: N801
    """winnt.h SECURITY_CAPABILITIES: the package SID and its (here: zero) capabilities."""

    _fields_ = (
        ("AppContainerSid", LPVOID),
        ("Capabilities", ctypes.POINTER(SID_AND_ATTRIBUTES)),
        ("CapabilityCount", DWORD),
        ("Reserved", DWORD),
    )


class STARTUPINFOW(ctypes.Structure):
    """processthreadsapi.h STARTUPINFOW."""

    _fields_ = (
        ("cb", DWORD),
        ("lpReserved", ctypes.c_wchar_p),
        ("lpDesktop", ctypes.c_wchar_p),
        ("lpTitle", ctypes.c_wchar_p),
        ("dwX", DWORD),
        ("dwY", DWORD),
        ("dwXSize", DWORD),
        ("dwYSize", DWORD),
        ("dwXCountChars", DWORD),
        ("dwYCountChars", DWORD),
        ("dwFillAttribute", DWORD),
        ("dwFlags", DWORD),
        ("wShowWindow", WORD),
        ("cbReserved2", WORD),
        ("lpReserved2", LPVOID),
        ("hStdInput", HANDLE),
        ("hStdOutput", HANDLE),
        ("hStdError", HANDLE),
    )


class STARTUPINFOEXW(ctypes.Structure):
    """winbase.h STARTUPINFOEXW: STARTUPINFOW plus the attribute list."""

    _fields_ = (("StartupInfo", STARTUPINFOW), ("lpAttributeList", LPVOID))


class PROCESS_INFORMATION(ctypes.Structure):  # noqa: N801
    """processthreadsapi.h PROCESS_INFORMATION."""

    _fields_ = (
        ("hProcess", HANDLE),
        ("hThread", HANDLE),
        ("dwProcessId", DWORD),
        ("dwThreadId", DWORD),
    )


class JOBOBJECT_BASIC_LIMIT_INFORMATION(ctypes.Structure):  # noqa: N801
    """winnt.h JOBOBJECT_BASIC_LIMIT_INFORMATION."""

    _fields_ = (
        ("PerProcessUserTimeLimit", ctypes.c_int64),
        ("PerJobUserTimeLimit", ctypes.c_int64),
        ("LimitFlags", DWORD),
        ("MinimumWorkingSetSize", ctypes.c_size_t),
        ("MaximumWorkingSetSize", ctypes.c_size_t),
        ("ActiveProcessLimit", DWORD),
        ("Affinity", ctypes.c_size_t),
        ("PriorityClass", DWORD),
        ("SchedulingClass", DWORD),
    )


class IO_COUNTERS(ctypes.Structure):  # noqa: N801
    """winnt.h IO_COUNTERS."""

    _fields_ = tuple(
        (name, ctypes.c_uint64)
        for name in (
            "ReadOperationCount",
            "WriteOperationCount",
            "OtherOperationCount",
            "ReadTransferCount",
            "WriteTransferCount",
            "OtherTransferCount",
        )
    )


class JOBOBJECT_EXTENDED_LIMIT_INFORMATION(ctypes.Structure):  # noqa: N801
    """winnt.h JOBOBJECT_EXTENDED_LIMIT_INFORMATION."""

    _fields_ = (
        ("BasicLimitInformation", JOBOBJECT_BASIC_LIMIT_INFORMATION),
        ("IoInfo", IO_COUNTERS),
        ("ProcessMemoryLimit", ctypes.c_size_t),
        ("JobMemoryLimit", ctypes.c_size_t),
        ("PeakProcessMemoryUsed", ctypes.c_size_t),
        ("PeakJobMemoryUsed", ctypes.c_size_t),
    )


class TRUSTEE_W(ctypes.Structure):  # noqa: N801
    """accctrl.h TRUSTEE_W (TrusteeForm = TRUSTEE_IS_SID: ptstrName holds a PSID)."""

    _fields_ = (
        ("pMultipleTrustee", LPVOID),
        ("MultipleTrusteeOperation", ctypes.c_int32),
        ("TrusteeForm", ctypes.c_int32),
        ("TrusteeType", ctypes.c_int32),
        ("ptstrName", LPVOID),
    )


class EXPLICIT_ACCESS_W(ctypes.Structure):  # noqa: N801
    """accctrl.h EXPLICIT_ACCESS_W."""

    _fields_ = (
        ("grfAccessPermissions", DWORD),
        ("grfAccessMode", ctypes.c_int32),
        ("grfInheritance", DWORD),
        ("Trustee", TRUSTEE_W),
    )


def struct_sizes() -> dict[str, int]:
    """The sizeof of every declared structure (tests compare them with the SDK's x64 sizes)."""
    structures: Sequence[type[ctypes.Structure]] = (
        SECURITY_ATTRIBUTES,
        SID_AND_ATTRIBUTES,
        SECURITY_CAPABILITIES,
        STARTUPINFOW,
        STARTUPINFOEXW,
        PROCESS_INFORMATION,
        JOBOBJECT_BASIC_LIMIT_INFORMATION,
        IO_COUNTERS,
        JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
        TRUSTEE_W,
        EXPLICIT_ACCESS_W,
    )
    return {s.__name__: ctypes.sizeof(s) for s in structures}
