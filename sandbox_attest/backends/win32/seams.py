"""The three narrow seams every Win32 call of the AppContainer backend goes through.

`Kernel32`, `Advapi32` and `Userenv` are Protocols, so tests on Linux pass fakes that record
the calls; the real ctypes implementations below them exist only on Windows. The module
imports everywhere; `load_seams()` raises `BackendUnavailable` off Windows.
"""

from __future__ import annotations

import ctypes
import sys
from dataclasses import dataclass
from typing import IO, Protocol

from sandbox_attest.backends.win32.structs import (
    DACL_SECURITY_INFORMATION,
    DWORD,
    EXPLICIT_ACCESS_W,
    GRANT_ACCESS,
    HANDLE,
    JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS,
    JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE,
    JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
    LABEL_SECURITY_INFORMATION,
    LOW_LABEL_SDDL_INHERIT,
    LPVOID,
    NO_INHERITANCE,
    PROCESS_INFORMATION,
    REVOKE_ACCESS,
    SDDL_REVISION_1,
    SE_FILE_OBJECT,
    SECURITY_ATTRIBUTES,
    SECURITY_CAPABILITIES,
    SID_AND_ATTRIBUTES,
    STARTF_USESTDHANDLES,
    STARTUPINFOEXW,
    TRUSTEE_IS_SID,
    TRUSTEE_IS_UNKNOWN,
    WAIT_OBJECT_0,
    WAIT_TIMEOUT,
)
from sandbox_attest.errors import BackendError, BackendUnavailable

# --- errors and plain values the seams exchange ---------------------------------------------


class Win32Error(BackendError):
    """A Win32 call failed; `function` and `code` say which and why."""

    def __init__(self, function: str, code: int, hint: str = "") -> None:
        """Record the failing function and its error code (GetLastError or an HRESULT)."""
        self.function = function
        self.code = code
        text = f"{function} failed with error 0x{code & 0xFFFFFFFF:08X}"
        super().__init__(f"{text}; {hint}" if hint else text)


@dataclass(frozen=True)
class SecurityCapabilities:
    """The value of PROC_THREAD_ATTRIBUTE_SECURITY_CAPABILITIES, before it becomes a struct."""

    app_container_sid: int  # PSID
    capabilities: tuple[int, ...] = ()  # capability PSIDs; the backend always passes none


@dataclass(frozen=True)
class ProcessInfo:
    """What CreateProcessW returned."""

    process: int
    thread: int
    pid: int


# --- the seams ---------------------------------------------------------------------------------


class Kernel32(Protocol):
    """The kernel32 calls the backend makes (handles are plain ints)."""

    def create_job_object(self) -> int:
        """CreateJobObjectW(NULL, NULL)."""
        ...

    def set_kill_on_job_close(self, job: int) -> None:
        """SetInformationJobObject with JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE."""
        ...

    def create_pipe(self) -> tuple[int, int]:
        """CreatePipe with inheritable ends: (read, write)."""
        ...

    def initialize_attribute_list(self, count: int) -> object:
        """InitializeProcThreadAttributeList for `count` attributes; an opaque list."""
        ...

    def update_attribute(
        self, attributes: object, attribute: int, value: SecurityCapabilities | tuple[int, ...]
    ) -> None:
        """UpdateProcThreadAttribute; the list keeps the value's memory alive."""
        ...

    def delete_attribute_list(self, attributes: object) -> None:
        """DeleteProcThreadAttributeList."""
        ...

    def create_process(
        self,
        command_line: str,
        *,
        environment: bytes,
        cwd: str,
        flags: int,
        std_handles: tuple[int, int, int],
        attributes: object,
    ) -> ProcessInfo:
        """CreateProcessW(NULL, cmdline, ..., bInheritHandles=TRUE, flags, env, cwd, &siex)."""
        ...

    def assign_process_to_job(self, job: int, process: int) -> None:
        """AssignProcessToJobObject."""
        ...

    def resume_thread(self, thread: int) -> None:
        """ResumeThread."""
        ...

    def wait(self, handle: int, timeout_ms: int) -> bool:
        """WaitForSingleObject; True when signalled, False on timeout."""
        ...

    def exit_code(self, process: int) -> int:
        """GetExitCodeProcess."""
        ...

    def terminate_job(self, job: int, exit_code: int) -> None:
        """TerminateJobObject: kills every process in the job."""
        ...

    def terminate_process(self, process: int, exit_code: int) -> None:
        """TerminateProcess (only for a child that never made it into the job)."""
        ...

    def close_handle(self, handle: int) -> None:
        """CloseHandle."""
        ...

    def open_reader(self, handle: int) -> IO[bytes]:
        """A binary file over a pipe's read end; the file owns the handle from now on."""
        ...


class Advapi32(Protocol):
    """The advapi32 calls: SIDs, DACL grants and integrity labels."""

    def current_user_sid(self) -> str:
        """The string SID of this process's user (TokenUser)."""
        ...

    def sid_to_string(self, sid: int) -> str:
        """ConvertSidToStringSidW."""
        ...

    def free_sid(self, sid: int) -> None:
        """FreeSid (SIDs from the Userenv calls)."""
        ...

    def grant(self, path: str, sid: str, mask: int, inheritance: int) -> None:
        """Add an allow ACE for `sid` to `path`'s DACL (SetEntriesInAclW GRANT_ACCESS)."""
        ...

    def revoke(self, path: str, sid: str) -> None:
        """Remove every ACE for `sid` from `path`'s DACL (SetEntriesInAclW REVOKE_ACCESS)."""
        ...

    def set_low_integrity_label(self, path: str) -> None:
        """Label `path` Low integrity, inherited by children (LABEL_SECURITY_INFORMATION)."""
        ...


class Userenv(Protocol):
    """The userenv calls that manage AppContainer profiles."""

    def create_profile(self, name: str, display_name: str, description: str) -> int:
        """CreateAppContainerProfile with no capabilities; raises Win32Error with the HRESULT."""
        ...

    def derive_sid(self, name: str) -> int:
        """DeriveAppContainerSidFromAppContainerName."""
        ...

    def delete_profile(self, name: str) -> None:
        """DeleteAppContainerProfile."""
        ...


@dataclass(frozen=True)
class Seams:
    """The three seams together."""

    kernel32: Kernel32
    advapi32: Advapi32
    userenv: Userenv


def load_seams() -> Seams:
    """The real ctypes seams.

    Raises:
        BackendUnavailable: not on Windows.
    """
    return _load_real()


if sys.platform == "win32":
    import msvcrt
    import os
    from ctypes import wintypes

    def _check_bool(function: str, ok: object, hint: str = "") -> None:
        if not ok:
            raise Win32Error(function, ctypes.get_last_error(), hint)

    class _AttributeList:
        """An attribute list buffer plus the values it points at (kept alive here)."""

        def __init__(self, buffer: ctypes.Array[ctypes.c_char]) -> None:
            self.buffer = buffer
            self.keep: list[object] = []

        @property
        def address(self) -> int:
            return ctypes.addressof(self.buffer)

    class RealKernel32:
        """kernel32 through ctypes."""

        def __init__(self) -> None:
            self.dll = ctypes.WinDLL("kernel32", use_last_error=True)
            d = self.dll
            d.CreateJobObjectW.restype = HANDLE
            d.CreateJobObjectW.argtypes = (LPVOID, wintypes.LPCWSTR)
            d.SetInformationJobObject.argtypes = (HANDLE, ctypes.c_int, LPVOID, DWORD)
            d.CreatePipe.argtypes = (
                ctypes.POINTER(HANDLE),
                ctypes.POINTER(HANDLE),
                ctypes.POINTER(SECURITY_ATTRIBUTES),
                DWORD,
            )
            d.InitializeProcThreadAttributeList.argtypes = (
                LPVOID,
                DWORD,
                DWORD,
                ctypes.POINTER(ctypes.c_size_t),
            )
            d.UpdateProcThreadAttribute.argtypes = (
                LPVOID,
                DWORD,
                ctypes.c_size_t,
                LPVOID,
                ctypes.c_size_t,
                LPVOID,
                LPVOID,
            )
            d.DeleteProcThreadAttributeList.argtypes = (LPVOID,)
            d.CreateProcessW.argtypes = (
                wintypes.LPCWSTR,
                wintypes.LPWSTR,
                LPVOID,
                LPVOID,
                wintypes.BOOL,
                DWORD,
                LPVOID,
                wintypes.LPCWSTR,
                ctypes.POINTER(STARTUPINFOEXW),
                ctypes.POINTER(PROCESS_INFORMATION),
            )
            d.AssignProcessToJobObject.argtypes = (HANDLE, HANDLE)
            d.ResumeThread.argtypes = (HANDLE,)
            d.ResumeThread.restype = DWORD
            d.WaitForSingleObject.argtypes = (HANDLE, DWORD)
            d.WaitForSingleObject.restype = DWORD
            d.GetExitCodeProcess.argtypes = (HANDLE, ctypes.POINTER(DWORD))
            d.TerminateJobObject.argtypes = (HANDLE, ctypes.c_uint)
            d.TerminateProcess.argtypes = (HANDLE, ctypes.c_uint)
            d.CloseHandle.argtypes = (HANDLE,)

        def create_job_object(self) -> int:
            handle = self.dll.CreateJobObjectW(None, None)
            _check_bool("CreateJobObjectW", handle)
            return int(handle)

        def set_kill_on_job_close(self, job: int) -> None:
            info = JOBOBJECT_EXTENDED_LIMIT_INFORMATION()
            info.BasicLimitInformation.LimitFlags = JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
            ok = self.dll.SetInformationJobObject(
                job,
                JOB_OBJECT_EXTENDED_LIMIT_INFORMATION_CLASS,
                ctypes.byref(info),
                ctypes.sizeof(info),
            )
            _check_bool("SetInformationJobObject", ok)

        def create_pipe(self) -> tuple[int, int]:
            attrs = SECURITY_ATTRIBUTES(ctypes.sizeof(SECURITY_ATTRIBUTES), None, 1)
            read, write = HANDLE(), HANDLE()
            ok = self.dll.CreatePipe(ctypes.byref(read), ctypes.byref(write), attrs, 0)
            _check_bool("CreatePipe", ok)
            return int(read.value or 0), int(write.value or 0)

        def initialize_attribute_list(self, count: int) -> object:
            size = ctypes.c_size_t(0)
            # The first call only reports the size (and fails with ERROR_INSUFFICIENT_BUFFER).
            self.dll.InitializeProcThreadAttributeList(None, count, 0, ctypes.byref(size))
            buffer = ctypes.create_string_buffer(size.value)
            ok = self.dll.InitializeProcThreadAttributeList(buffer, count, 0, ctypes.byref(size))
            _check_bool("InitializeProcThreadAttributeList", ok)
            return _AttributeList(buffer)

        def update_attribute(
            self,
            attributes: object,
            attribute: int,
            value: SecurityCapabilities | tuple[int, ...],
        ) -> None:
            assert isinstance(attributes, _AttributeList)  # noqa: S101  (only ours exist)
            if isinstance(value, SecurityCapabilities):
                caps = (SID_AND_ATTRIBUTES * max(1, len(value.capabilities)))()
                for i, sid in enumerate(value.capabilities):
                    caps[i].Sid = sid
                    caps[i].Attributes = 0x00000004  # SE_GROUP_ENABLED
                struct: ctypes.Structure | ctypes.Array[HANDLE] = SECURITY_CAPABILITIES(
                    value.app_container_sid,
                    caps if value.capabilities else None,
                    len(value.capabilities),
                    0,
                )
                attributes.keep.append(caps)
            else:
                struct = (HANDLE * len(value))(*value)
            attributes.keep.append(struct)
            ok = self.dll.UpdateProcThreadAttribute(
                attributes.address,
                0,
                attribute,
                ctypes.addressof(struct),
                ctypes.sizeof(struct),
                None,
                None,
            )
            _check_bool("UpdateProcThreadAttribute", ok)

        def delete_attribute_list(self, attributes: object) -> None:
            assert isinstance(attributes, _AttributeList)  # noqa: S101
            self.dll.DeleteProcThreadAttributeList(attributes.address)

        def create_process(
            self,
            command_line: str,
            *,
            environment: bytes,
            cwd: str,
            flags: int,
            std_handles: tuple[int, int, int],
            attributes: object,
        ) -> ProcessInfo:
            assert isinstance(attributes, _AttributeList)  # noqa: S101
            info = STARTUPINFOEXW()
            info.StartupInfo.cb = ctypes.sizeof(STARTUPINFOEXW)
            info.StartupInfo.dwFlags = STARTF_USESTDHANDLES
            info.StartupInfo.hStdInput, info.StartupInfo.hStdOutput = std_handles[:2]
            info.StartupInfo.hStdError = std_handles[2]
            info.lpAttributeList = attributes.address
            # CreateProcessW may write into the command line buffer, so it must be mutable.
            cmdline = ctypes.create_unicode_buffer(command_line)
            env = ctypes.create_string_buffer(environment, len(environment))
            pi = PROCESS_INFORMATION()
            ok = self.dll.CreateProcessW(
                None,
                cmdline,
                None,
                None,
                True,  # noqa: FBT003  (bInheritHandles: the HANDLE_LIST narrows it to our pipes)
                flags,
                env,
                cwd,
                info,
                ctypes.byref(pi),
            )
            _check_bool("CreateProcessW", ok, "check the interpreter path and its grants")
            return ProcessInfo(int(pi.hProcess), int(pi.hThread), int(pi.dwProcessId))

        def assign_process_to_job(self, job: int, process: int) -> None:
            _check_bool("AssignProcessToJobObject", self.dll.AssignProcessToJobObject(job, process))

        def resume_thread(self, thread: int) -> None:
            if self.dll.ResumeThread(thread) == 0xFFFFFFFF:
                raise Win32Error("ResumeThread", ctypes.get_last_error())

        def wait(self, handle: int, timeout_ms: int) -> bool:
            result = self.dll.WaitForSingleObject(handle, timeout_ms)
            if result == WAIT_TIMEOUT:
                return False
            if result != WAIT_OBJECT_0:
                raise Win32Error("WaitForSingleObject", ctypes.get_last_error())
            return True

        def exit_code(self, process: int) -> int:
            code = DWORD()
            ok = self.dll.GetExitCodeProcess(process, ctypes.byref(code))
            _check_bool("GetExitCodeProcess", ok)
            return int(code.value)

        def terminate_job(self, job: int, exit_code: int) -> None:
            _check_bool("TerminateJobObject", self.dll.TerminateJobObject(job, exit_code))

        def terminate_process(self, process: int, exit_code: int) -> None:
            _check_bool("TerminateProcess", self.dll.TerminateProcess(process, exit_code))

        def close_handle(self, handle: int) -> None:
            self.dll.CloseHandle(handle)

        def open_reader(self, handle: int) -> IO[bytes]:
            fd = msvcrt.open_osfhandle(handle, os.O_RDONLY)
            return os.fdopen(fd, "rb")

    class RealAdvapi32:
        """advapi32 through ctypes."""

        def __init__(self) -> None:
            self.dll = ctypes.WinDLL("advapi32", use_last_error=True)
            self.kernel = ctypes.WinDLL("kernel32", use_last_error=True)
            d = self.dll
            d.ConvertSidToStringSidW.argtypes = (LPVOID, ctypes.POINTER(wintypes.LPWSTR))
            d.ConvertStringSidToSidW.argtypes = (wintypes.LPCWSTR, ctypes.POINTER(LPVOID))
            d.FreeSid.argtypes = (LPVOID,)
            d.GetNamedSecurityInfoW.restype = DWORD
            d.GetNamedSecurityInfoW.argtypes = (
                wintypes.LPCWSTR,
                ctypes.c_int,
                DWORD,
                LPVOID,
                LPVOID,
                ctypes.POINTER(LPVOID),
                ctypes.POINTER(LPVOID),
                ctypes.POINTER(LPVOID),
            )
            d.SetNamedSecurityInfoW.restype = DWORD
            d.SetNamedSecurityInfoW.argtypes = (
                wintypes.LPWSTR,
                ctypes.c_int,
                DWORD,
                LPVOID,
                LPVOID,
                LPVOID,
                LPVOID,
            )
            d.SetEntriesInAclW.restype = DWORD
            d.SetEntriesInAclW.argtypes = (
                ctypes.c_ulong,
                ctypes.POINTER(EXPLICIT_ACCESS_W),
                LPVOID,
                ctypes.POINTER(LPVOID),
            )
            d.ConvertStringSecurityDescriptorToSecurityDescriptorW.argtypes = (
                wintypes.LPCWSTR,
                DWORD,
                ctypes.POINTER(LPVOID),
                LPVOID,
            )
            d.GetSecurityDescriptorSacl.argtypes = (
                LPVOID,
                ctypes.POINTER(wintypes.BOOL),
                ctypes.POINTER(LPVOID),
                ctypes.POINTER(wintypes.BOOL),
            )
            d.OpenProcessToken.argtypes = (HANDLE, DWORD, ctypes.POINTER(HANDLE))
            d.GetTokenInformation.argtypes = (
                HANDLE,
                ctypes.c_int,
                LPVOID,
                DWORD,
                ctypes.POINTER(DWORD),
            )
            self.kernel.LocalFree.argtypes = (LPVOID,)
            self.kernel.GetCurrentProcess.restype = HANDLE
            self.kernel.CloseHandle.argtypes = (HANDLE,)

        def sid_to_string(self, sid: int) -> str:
            text = wintypes.LPWSTR()
            _check_bool(
                "ConvertSidToStringSidW", self.dll.ConvertSidToStringSidW(sid, ctypes.byref(text))
            )
            try:
                return str(text.value)
            finally:
                self.kernel.LocalFree(text)

        def current_user_sid(self) -> str:
            token = HANDLE()
            ok = self.dll.OpenProcessToken(
                self.kernel.GetCurrentProcess(), 0x0008, ctypes.byref(token)
            )
            _check_bool("OpenProcessToken", ok)
            try:
                size = DWORD()
                self.dll.GetTokenInformation(token, 1, None, 0, ctypes.byref(size))  # TokenUser
                buffer = ctypes.create_string_buffer(size.value)
                ok = self.dll.GetTokenInformation(token, 1, buffer, size, ctypes.byref(size))
                _check_bool("GetTokenInformation", ok)
                user = SID_AND_ATTRIBUTES.from_buffer(buffer)
                return self.sid_to_string(int(user.Sid))
            finally:
                self.kernel.CloseHandle(token)

        def free_sid(self, sid: int) -> None:
            self.dll.FreeSid(sid)

        def _set_entry(self, path: str, sid: str, mask: int, mode: int, inheritance: int) -> None:
            psid = LPVOID()
            ok = self.dll.ConvertStringSidToSidW(sid, ctypes.byref(psid))
            _check_bool("ConvertStringSidToSidW", ok, f"is {sid!r} a SID?")
            dacl, descriptor, new_dacl = LPVOID(), LPVOID(), LPVOID()
            try:
                err = self.dll.GetNamedSecurityInfoW(
                    path, SE_FILE_OBJECT, DACL_SECURITY_INFORMATION,
                    None, None, ctypes.byref(dacl), None, ctypes.byref(descriptor),
                )  # fmt: skip
                if err:
                    raise Win32Error("GetNamedSecurityInfoW", err, f"path {path!r}")
                entry = EXPLICIT_ACCESS_W()
                entry.grfAccessPermissions = mask
                entry.grfAccessMode = mode
                entry.grfInheritance = inheritance
                entry.Trustee.TrusteeForm = TRUSTEE_IS_SID
                entry.Trustee.TrusteeType = TRUSTEE_IS_UNKNOWN
                entry.Trustee.ptstrName = psid
                err = self.dll.SetEntriesInAclW(
                    1, ctypes.byref(entry), dacl, ctypes.byref(new_dacl)
                )
                if err:
                    raise Win32Error("SetEntriesInAclW", err, f"path {path!r}")
                err = self.dll.SetNamedSecurityInfoW(
                    path, SE_FILE_OBJECT, DACL_SECURITY_INFORMATION, None, None, new_dacl, None
                )
                if err:
                    raise Win32Error(
                        "SetNamedSecurityInfoW", err, f"can this user change {path!r}?"
                    )
            finally:
                for pointer in (new_dacl, descriptor, psid):
                    if pointer.value:
                        self.kernel.LocalFree(pointer)

        def grant(self, path: str, sid: str, mask: int, inheritance: int) -> None:
            self._set_entry(path, sid, mask, GRANT_ACCESS, inheritance)

        def revoke(self, path: str, sid: str) -> None:
            self._set_entry(path, sid, 0, REVOKE_ACCESS, NO_INHERITANCE)

        def set_low_integrity_label(self, path: str) -> None:
            descriptor, sacl = LPVOID(), LPVOID()
            present, defaulted = wintypes.BOOL(), wintypes.BOOL()
            ok = self.dll.ConvertStringSecurityDescriptorToSecurityDescriptorW(
                LOW_LABEL_SDDL_INHERIT, SDDL_REVISION_1, ctypes.byref(descriptor), None
            )
            _check_bool("ConvertStringSecurityDescriptorToSecurityDescriptorW", ok)
            try:
                ok = self.dll.GetSecurityDescriptorSacl(
                    descriptor, ctypes.byref(present), ctypes.byref(sacl), ctypes.byref(defaulted)
                )
                _check_bool("GetSecurityDescriptorSacl", ok)
                err = self.dll.SetNamedSecurityInfoW(
                    path, SE_FILE_OBJECT, LABEL_SECURITY_INFORMATION, None, None, None, sacl
                )
                if err:
                    raise Win32Error("SetNamedSecurityInfoW(label)", err, f"path {path!r}")
            finally:
                self.kernel.LocalFree(descriptor)

    class RealUserenv:
        """userenv through ctypes."""

        def __init__(self) -> None:
            self.dll = ctypes.WinDLL("userenv", use_last_error=True)
            d = self.dll
            d.CreateAppContainerProfile.restype = ctypes.c_long
            d.CreateAppContainerProfile.argtypes = (
                wintypes.LPCWSTR,
                wintypes.LPCWSTR,
                wintypes.LPCWSTR,
                LPVOID,
                DWORD,
                ctypes.POINTER(LPVOID),
            )
            d.DeriveAppContainerSidFromAppContainerName.restype = ctypes.c_long
            d.DeriveAppContainerSidFromAppContainerName.argtypes = (
                wintypes.LPCWSTR,
                ctypes.POINTER(LPVOID),
            )
            d.DeleteAppContainerProfile.restype = ctypes.c_long
            d.DeleteAppContainerProfile.argtypes = (wintypes.LPCWSTR,)

        def create_profile(self, name: str, display_name: str, description: str) -> int:
            sid = LPVOID()
            hr = self.dll.CreateAppContainerProfile(
                name, display_name, description, None, 0, ctypes.byref(sid)
            )
            if hr < 0:
                raise Win32Error("CreateAppContainerProfile", hr)
            return int(sid.value or 0)

        def derive_sid(self, name: str) -> int:
            sid = LPVOID()
            hr = self.dll.DeriveAppContainerSidFromAppContainerName(name, ctypes.byref(sid))
            if hr < 0:
                raise Win32Error("DeriveAppContainerSidFromAppContainerName", hr)
            return int(sid.value or 0)

        def delete_profile(self, name: str) -> None:
            hr = self.dll.DeleteAppContainerProfile(name)
            if hr < 0:
                raise Win32Error("DeleteAppContainerProfile", hr)

    def _load_real() -> Seams:
        return Seams(RealKernel32(), RealAdvapi32(), RealUserenv())

else:

    def _load_real() -> Seams:
        raise BackendUnavailable(
            f"the AppContainer backend needs Windows (this is {sys.platform}); run the "
            "appcontainer leg on a Windows runner"
        )
