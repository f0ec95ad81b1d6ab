"""Win32 for the AppContainer backend: SDK constants and structures, behind three seams.

- `structs`: the constants and ctypes structures, with explicit x64 widths (`struct_sizes`
  lets a test on any host compare them with the Windows SDK's sizes).
- `seams`: the `Kernel32`, `Advapi32` and `Userenv` Protocols every Win32 call goes through,
  the values they exchange, and their ctypes implementations (Windows only; `load_seams`).

The backend and its tests (which pin the constants by name) read these as one namespace
(`from sandbox_attest.backends import win32 as w`), so the names they use are re-exported
here; new code may import either module.
"""

from sandbox_attest.backends.win32.seams import (
    Advapi32,
    Kernel32,
    ProcessInfo,
    Seams,
    SecurityCapabilities,
    Userenv,
    Win32Error,
    load_seams,
)
from sandbox_attest.backends.win32.structs import (
    ACCESS_MODIFY,
    ACCESS_READ_EXECUTE,
    CREATE_NO_WINDOW,
    CREATE_SUSPENDED,
    CREATE_UNICODE_ENVIRONMENT,
    EXTENDED_STARTUPINFO_PRESENT,
    FILE_CREATE_PIPE_INSTANCE,
    FILE_READ_ATTRIBUTES,
    FILE_READ_DATA,
    FILE_WRITE_DATA,
    HRESULT_ALREADY_EXISTS,
    JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS,
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    JOBOBJECT_BASIC_LIMIT_INFORMATION,
    NO_INHERITANCE,
    PROC_THREAD_ATTRIBUTE_HANDLE_LIST,
    PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES,
    READ_CONTROL,
    STARTUPINFOEXW,
    SUB_CONTAINERS_AND_OBJECTS_INHERIT,
    SYNCHRONIZE,
    struct_sizes,
)

__all__ = [
    "ACCESS_MODIFY",
    "ACCESS_READ_EXECUTE",
    "CREATE_NO_WINDOW",
    "CREATE_SUSPENDED",
    "CREATE_UNICODE_ENVIRONMENT",
    "EXTENDED_STARTUPINFO_PRESENT",
    "FILE_CREATE_PIPE_INSTANCE",
    "FILE_READ_ATTRIBUTES",
    "FILE_READ_DATA",
    "FILE_WRITE_DATA",
    "HRESULT_ALREADY_EXISTS",
    "JOBOBJECT_BASIC_LIMIT_INFORMATION",
    "JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS",
    "JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE",
    "NO_INHERITANCE",
    "PROC_THREAD_ATTRIBUTE_HANDLE_LIST",
    "PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES",
    "READ_CONTROL",
    "STARTUPINFOEXW",
    "SUB_CONTAINERS_AND_OBJECTS_INHERIT",
    "SYNCHRONIZE",
    "Advapi32",
    "Kernel32",
    "ProcessInfo",
    "Seams",
    "SecurityCapabilities",
    "Userenv",
    "Win32Error",
    "load_seams",
    "struct_sizes",
]
