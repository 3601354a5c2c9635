//! File operations confined to a sandbox's root directory.
//!
//! Paths are sandbox paths: absolute (`/home/user/a.txt`) or relative to the working
//! directory `/home/user`. A `..` component is refused outright; every lookup then goes
//! through `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` from a descriptor of the
//! sandbox root, so a symlink the sandbox planted (even `/home/user/x -> /etc` or
//! `-> ../../..`) resolves *inside* the root, never to the host. The final component of a
//! write is opened with `O_NOFOLLOW`, and deletes act on the link itself.
//!
//! Mutations (write, mkdir, delete) are allowed only below the writable areas
//! `/home/user` and `/tmp` (checked on the resolved parent directory); reads may see the
//! whole of the sandbox's own tree (for example `/sandgate/ca.pem`). The shared read-only
//! base (`/usr`, `/etc`, ...) is mounted only inside the sandbox's mount namespace and is
//! not visible here.

use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::{EntryKind, FileEntry, LocalboxError};

/// The writable areas, relative to the root.
pub(crate) const WRITABLE: [&str; 2] = ["home/user", "tmp"];
/// Working directory of the sandbox's processes, relative to the root.
pub(crate) const HOME: &str = "home/user";

/// A sandbox root, with the owner given to whatever the gateway writes into it.
pub(crate) struct Confined<'a> {
    pub root: &'a Path,
    pub uid: u32,
    pub gid: u32,
}

/// Splits a sandbox path into normal components relative to the root.
pub(crate) fn components(path: &str) -> Result<Vec<String>, LocalboxError> {
    let invalid = |why: &str| LocalboxError::InvalidPath {
        path: path.to_string(),
        reason: why.to_string(),
    };
    if path.is_empty() {
        return Err(invalid("empty path"));
    }
    if path.contains('\0') {
        return Err(invalid("contains a NUL byte"));
    }
    let mut out: Vec<String> = Vec::new();
    if !path.starts_with('/') {
        out.extend(HOME.split('/').map(str::to_string));
    }
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err(invalid("`..` is not allowed (path traversal)")),
            other => out.push(other.to_string()),
        }
    }
    Ok(out)
}

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

impl Confined<'_> {
    fn root_fd(&self) -> io::Result<OwnedFd> {
        let path = CString::new(self.root.as_os_str().as_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: path is a valid C string; the returned fd is owned below.
        let fd = unsafe {
            libc::open(
                path.as_ptr(),
                libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// `openat2` below the root with every symlink resolved inside it.
    pub(super) fn open_in_root(&self, parts: &[String], flags: libc::c_int) -> io::Result<OwnedFd> {
        let root = self.root_fd()?;
        let rel = if parts.is_empty() {
            ".".to_string()
        } else {
            parts.join("/")
        };
        let rel = cstring(&rel)?;
        // SAFETY: open_how is plain old data; zeroed is a valid value.
        let mut how: libc::open_how = unsafe { std::mem::zeroed() };
        how.flags = (flags | libc::O_CLOEXEC) as u64;
        how.resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS;
        // SAFETY: the pointers are valid for the duration of the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_openat2,
                root.as_raw_fd(),
                rel.as_ptr(),
                &how as *const libc::open_how,
                std::mem::size_of::<libc::open_how>(),
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a fresh descriptor we own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
    }

    /// Host path a descriptor resolved to.
    fn resolved(fd: &OwnedFd) -> io::Result<PathBuf> {
        std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))
    }

    /// Opens the parent directory of `parts` and checks it lies in a writable area.
    fn writable_parent(&self, path: &str, parts: &[String]) -> Result<OwnedFd, LocalboxError> {
        let Some((_, parent)) = parts.split_last() else {
            return Err(read_only(path));
        };
        let fd = self
            .open_in_root(parent, libc::O_PATH | libc::O_DIRECTORY)
            .map_err(|e| io_error(path, e))?;
        let resolved = Self::resolved(&fd).map_err(|e| io_error(path, e))?;
        let writable = WRITABLE
            .iter()
            .any(|area| resolved.starts_with(self.root.join(area)));
        if !writable {
            return Err(read_only(path));
        }
        Ok(fd)
    }

    pub fn read(&self, path: &str) -> Result<Vec<u8>, LocalboxError> {
        let parts = components(path)?;
        let fd = self
            .open_in_root(&parts, libc::O_RDONLY)
            .map_err(|e| io_error(path, e))?;
        let mut file = File::from(fd);
        let meta = file.metadata().map_err(|e| io_error(path, e))?;
        if !meta.is_file() {
            return Err(io_error(
                path,
                io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
            ));
        }
        let mut data = Vec::with_capacity(meta.len() as usize);
        file.read_to_end(&mut data).map_err(|e| io_error(path, e))?;
        Ok(data)
    }

    pub fn write(&self, path: &str, data: &[u8]) -> Result<(), LocalboxError> {
        let parts = components(path)?;
        let parent = self.writable_parent(path, &parts)?;
        let name = cstring(parts.last().map(String::as_str).unwrap_or_default())
            .map_err(|e| io_error(path, e))?;
        // SAFETY: valid dirfd and C string; the fd is owned below.
        let fd = unsafe {
            libc::openat(
                parent.as_raw_fd(),
                name.as_ptr(),
                libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC | libc::O_NOFOLLOW | libc::O_CLOEXEC,
                0o644 as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io_error(path, io::Error::last_os_error()));
        }
        // SAFETY: fd is a fresh descriptor we own.
        let mut file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let meta = file.metadata().map_err(|e| io_error(path, e))?;
        if !meta.is_file() {
            return Err(io_error(
                path,
                io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"),
            ));
        }
        std::os::unix::fs::fchown(&file, Some(self.uid), Some(self.gid))
            .map_err(|e| io_error(path, e))?;
        file.write_all(data).map_err(|e| io_error(path, e))?;
        Ok(())
    }

    pub fn list(&self, path: &str) -> Result<Vec<FileEntry>, LocalboxError> {
        let parts = components(path)?;
        let fd = self
            .open_in_root(&parts, libc::O_RDONLY | libc::O_DIRECTORY)
            .map_err(|e| io_error(path, e))?;
        let dir = format!("/proc/self/fd/{}", fd.as_raw_fd());
        let mut out = Vec::new();
        for entry in std::fs::read_dir(dir).map_err(|e| io_error(path, e))? {
            let entry = entry.map_err(|e| io_error(path, e))?;
            // DirEntry::metadata is lstat-like: a symlink is reported as itself.
            let meta = entry.metadata().map_err(|e| io_error(path, e))?;
            let kind = if meta.is_dir() {
                EntryKind::Dir
            } else if meta.is_file() {
                EntryKind::File
            } else if meta.file_type().is_symlink() {
                EntryKind::Symlink
            } else {
                EntryKind::Other
            };
            out.push(FileEntry {
                name: entry.file_name().to_string_lossy().into_owned(),
                kind,
                size: meta.len(),
                mode: meta.mode() & 0o7777,
                modified_unix: meta.mtime(),
            });
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    pub fn remove(&self, path: &str, recursive: bool) -> Result<(), LocalboxError> {
        let parts = components(path)?;
        let parent = self.writable_parent(path, &parts)?;
        let name_str = parts.last().map(String::as_str).unwrap_or_default();
        let name = cstring(name_str).map_err(|e| io_error(path, e))?;
        // SAFETY: stat is plain old data; the pointers are valid for the call.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        let rc = unsafe {
            libc::fstatat(
                parent.as_raw_fd(),
                name.as_ptr(),
                &mut st,
                libc::AT_SYMLINK_NOFOLLOW,
            )
        };
        if rc != 0 {
            return Err(io_error(path, io::Error::last_os_error()));
        }
        let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
        if is_dir && recursive {
            // std's remove_dir_all never follows symlinks below the directory.
            let target = format!("/proc/self/fd/{}/{}", parent.as_raw_fd(), name_str);
            return std::fs::remove_dir_all(target).map_err(|e| io_error(path, e));
        }
        let flags = if is_dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: valid dirfd and C string.
        let rc = unsafe { libc::unlinkat(parent.as_raw_fd(), name.as_ptr(), flags) };
        if rc != 0 {
            return Err(io_error(path, io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Moves `from` to `to`, both below the writable areas, replacing what `to` names (as
    /// rename(2) does); a symlink moves itself, never what it points to.
    pub fn rename(&self, from: &str, to: &str) -> Result<(), LocalboxError> {
        let from_parts = components(from)?;
        let to_parts = components(to)?;
        let from_dir = self.writable_parent(from, &from_parts)?;
        let to_dir = self.writable_parent(to, &to_parts)?;
        let name = |parts: &[String], path: &str| {
            cstring(parts.last().map(String::as_str).unwrap_or_default())
                .map_err(|e| io_error(path, e))
        };
        let (from_name, to_name) = (name(&from_parts, from)?, name(&to_parts, to)?);
        // SAFETY: valid dirfds and C strings.
        let rc = unsafe {
            libc::renameat(
                from_dir.as_raw_fd(),
                from_name.as_ptr(),
                to_dir.as_raw_fd(),
                to_name.as_ptr(),
            )
        };
        if rc != 0 {
            return Err(io_error(from, io::Error::last_os_error()));
        }
        Ok(())
    }

    pub fn mkdir(&self, path: &str, parents: bool) -> Result<(), LocalboxError> {
        let parts = components(path)?;
        let start = if parents { 1 } else { parts.len() };
        for depth in start..=parts.len() {
            let prefix = &parts[..depth];
            let last = depth == parts.len();
            if !last
                && self
                    .open_in_root(prefix, libc::O_PATH | libc::O_DIRECTORY)
                    .is_ok()
            {
                continue;
            }
            let parent = self.writable_parent(path, prefix)?;
            let name = cstring(&prefix[depth - 1]).map_err(|e| io_error(path, e))?;
            // SAFETY: valid dirfd and C string.
            let rc = unsafe { libc::mkdirat(parent.as_raw_fd(), name.as_ptr(), 0o755) };
            if rc != 0 {
                let err = io::Error::last_os_error();
                if parents && err.kind() == io::ErrorKind::AlreadyExists {
                    continue;
                }
                return Err(io_error(path, err));
            }
            // SAFETY: valid dirfd and C string.
            let rc = unsafe {
                libc::fchownat(
                    parent.as_raw_fd(),
                    name.as_ptr(),
                    self.uid,
                    self.gid,
                    libc::AT_SYMLINK_NOFOLLOW,
                )
            };
            if rc != 0 {
                return Err(io_error(path, io::Error::last_os_error()));
            }
        }
        Ok(())
    }
}

fn read_only(path: &str) -> LocalboxError {
    LocalboxError::InvalidPath {
        path: path.to_string(),
        reason: "outside the writable areas /home/user and /tmp".to_string(),
    }
}

fn io_error(path: &str, source: io::Error) -> LocalboxError {
    LocalboxError::File {
        path: path.to_string(),
        source,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn components_are_normalized_and_traversal_refused() {
        assert_eq!(components("a/b").unwrap(), ["home", "user", "a", "b"]);
        assert_eq!(components("/tmp//x/./y").unwrap(), ["tmp", "x", "y"]);
        assert_eq!(components("/").unwrap(), Vec::<String>::new());
        assert!(components("../etc/passwd").is_err());
        assert!(components("/home/user/../../etc").is_err());
        assert!(components("").is_err());
        assert!(components("a\0b").is_err());
    }
}
