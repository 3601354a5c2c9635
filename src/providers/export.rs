//! Filesystem exports: a sandbox's files read through its provider's files API into an
//! archive sandgate keeps, and written into a new sandbox on any provider that writes files.
//! This is how a sandbox continues on another provider or account (seed 001): a provider's
//! own snapshot is restorable only where it was taken.
//!
//! Contract:
//! - Regular files and directories under the export's roots, nothing else: symlinks and
//!   other kinds are skipped and counted, and no memory state or process survives (a
//!   continuation starts its processes afresh).
//! - Bounded ([`Limits`]): entries, bytes and depth; over a bound the export fails whole, so
//!   no partial archive passes for a complete one.
//! - Names come from the provider, which is not trusted: a name with `/`, NUL, `.` or `..` is
//!   skipped; restoring refuses any archive path that is not a plain relative path.
//! - The archive is a gzip'd tar of absolute paths made relative (`home/user/x`).

use std::io::Read as _;

use super::ops::{OpError, OpErrorKind};
use super::Provider;

/// Bounds of one export.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_entries: usize,
    pub max_bytes: u64,
    pub max_depth: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_entries: 20_000,
            max_bytes: 512 * 1024 * 1024,
            max_depth: 32,
        }
    }
}

/// What an export or a restore moved.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[schema(as = ExportSummary)]
pub struct Summary {
    pub files: u64,
    pub dirs: u64,
    pub bytes: u64,
    /// Symlinks, devices and entries with unusable names.
    pub skipped: u64,
}

/// Reads the files under `roots` of `instance` into a gzip'd tar.
pub async fn export(
    adapter: &dyn Provider,
    instance: &str,
    roots: &[String],
    limits: Limits,
) -> Result<(Vec<u8>, Summary), OpError> {
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::fast(),
    ));
    let mut summary = Summary::default();
    let mut queue: std::collections::VecDeque<(String, usize)> =
        roots.iter().map(|r| (normalize(r), 0)).collect();
    while let Some((dir, depth)) = queue.pop_front() {
        if depth > limits.max_depth {
            return Err(too_big(format!("deeper than {} levels", limits.max_depth)));
        }
        append_dir(&mut tar, &dir, &mut summary)?;
        for entry in adapter.list_dir(instance, &dir).await? {
            if summary.files + summary.dirs + summary.skipped >= limits.max_entries as u64 {
                return Err(too_big(format!("more than {} entries", limits.max_entries)));
            }
            if !plain_name(&entry.name) {
                summary.skipped += 1;
                continue;
            }
            let path = join(&dir, &entry.name);
            match entry.kind {
                "dir" => queue.push_back((path, depth + 1)),
                "file" => {
                    let data = adapter.read_file(instance, &path).await?;
                    summary.bytes += data.len() as u64;
                    if summary.bytes > limits.max_bytes {
                        return Err(too_big(format!("over {} bytes", limits.max_bytes)));
                    }
                    append_file(&mut tar, &path, entry.mode, &data)?;
                    summary.files += 1;
                }
                _ => summary.skipped += 1,
            }
        }
    }
    let archive = tar
        .into_inner()
        .and_then(|gz| gz.finish())
        .map_err(|e| archive_error(format!("finishing the archive: {e}")))?;
    Ok((archive, summary))
}

/// Writes an archive made by [`export`] into `instance`: directories first (as they come),
/// then each file.
pub async fn restore(
    adapter: &dyn Provider,
    instance: &str,
    archive: &[u8],
) -> Result<Summary, OpError> {
    let mut summary = Summary::default();
    for (path, is_dir, data) in read_archive(archive)? {
        if is_dir {
            match adapter.mkdir(instance, &path, true).await {
                // A provider without mkdir creates parents on write.
                Err(e) if e.kind == OpErrorKind::Unsupported => {}
                other => other?,
            }
            summary.dirs += 1;
        } else {
            summary.bytes += data.len() as u64;
            adapter.write_file(instance, &path, data).await?;
            summary.files += 1;
        }
    }
    Ok(summary)
}

/// (absolute path, is a directory, contents) of each entry, refusing unsafe paths.
fn read_archive(archive: &[u8]) -> Result<Vec<(String, bool, Vec<u8>)>, OpError> {
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(archive));
    let mut out = Vec::new();
    let entries = tar
        .entries()
        .map_err(|e| archive_error(format!("reading the archive: {e}")))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| archive_error(format!("reading the archive: {e}")))?;
        let raw = entry
            .path()
            .map_err(|e| archive_error(format!("an entry's path: {e}")))?
            .to_string_lossy()
            .into_owned();
        let relative = raw.trim_end_matches('/');
        if relative.is_empty() || !relative.split('/').all(plain_name) {
            return Err(archive_error(format!("unsafe path {raw:?} in the archive")));
        }
        let path = format!("/{relative}");
        let kind = entry.header().entry_type();
        if kind.is_dir() {
            out.push((path, true, Vec::new()));
        } else if kind.is_file() {
            let mut data = Vec::new();
            entry
                .read_to_end(&mut data)
                .map_err(|e| archive_error(format!("reading {path}: {e}")))?;
            out.push((path, false, data));
        }
    }
    Ok(out)
}

type Tar = tar::Builder<flate2::write::GzEncoder<Vec<u8>>>;

fn append_dir(tar: &mut Tar, dir: &str, summary: &mut Summary) -> Result<(), OpError> {
    let relative = dir.trim_start_matches('/');
    if relative.is_empty() {
        return Ok(());
    }
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_size(0);
    tar.append_data(&mut header, format!("{relative}/"), std::io::empty())
        .map_err(|e| archive_error(format!("adding {dir}: {e}")))?;
    summary.dirs += 1;
    Ok(())
}

fn append_file(tar: &mut Tar, path: &str, mode: u32, data: &[u8]) -> Result<(), OpError> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(if mode == 0 { 0o644 } else { mode & 0o777 });
    header.set_size(data.len() as u64);
    tar.append_data(&mut header, path.trim_start_matches('/'), data)
        .map_err(|e| archive_error(format!("adding {path}: {e}")))
}

/// A name that is one path component and not `.` or `..`.
fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// `/a/b/` → `/a/b`; relative roots are taken from `/`.
fn normalize(root: &str) -> String {
    let trimmed = root.trim_end_matches('/');
    if trimmed.starts_with('/') {
        trimmed.to_string()
    } else {
        format!("/{trimmed}")
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir == "/" || dir.is_empty() {
        format!("/{name}")
    } else {
        format!("{dir}/{name}")
    }
}

fn too_big(what: String) -> OpError {
    OpError::new(
        OpErrorKind::Invalid,
        format!("the export is too large: {what}"),
    )
}

fn archive_error(message: String) -> OpError {
    OpError::new(OpErrorKind::Invalid, message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archives_refuse_paths_that_leave_the_root() {
        for bad in ["../etc/passwd", "home/../../x", "./x", "a//b"] {
            let mut header = tar::Header::new_gnu();
            header.set_size(1);
            header.set_entry_type(tar::EntryType::Regular);
            // Written raw: the tar crate's own checks would refuse some of these.
            let name = bad.as_bytes();
            header.as_old_mut().name[..name.len()].copy_from_slice(name);
            header.set_cksum();
            let mut raw = Vec::new();
            raw.extend_from_slice(header.as_bytes());
            raw.extend_from_slice(&[b'x'; 512]);
            raw.extend_from_slice(&[0; 1024]);
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut gz, &raw).unwrap();
            let archive = gz.finish().unwrap();
            assert!(read_archive(&archive).is_err(), "{bad}");
        }
    }

    #[test]
    fn names_and_roots() {
        assert!(plain_name("a.txt"));
        for bad in ["", ".", "..", "a/b", "a\0"] {
            assert!(!plain_name(bad), "{bad:?}");
        }
        assert_eq!(normalize("/home/user/"), "/home/user");
        assert_eq!(normalize("tmp"), "/tmp");
        assert_eq!(join("/", "x"), "/x");
        assert_eq!(join("/home", "x"), "/home/x");
    }
}
