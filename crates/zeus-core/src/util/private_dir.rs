//! Directories and files that only this user (and root) can change.
//!
//! A root process that creates, truncates or locks files in a directory another user controls
//! can be pointed anywhere (a symlink in its place) or stalled (a lock held through a file the
//! other user may open). [`ensure_private_dir`] creates a directory as 0700 or checks an
//! existing one: every component of its path is a directory owned by root or by us, writable by
//! others only when sticky (as `/tmp`), and the directory itself is ours and writable by no one
//! else. Symlinks on the way are followed only when owned by root or by us.
//! [`open_private_file`] opens a file in such a directory without following a symlink and
//! replaces one that someone else could open.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

/// The effective uid of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() }
}

fn refuse(path: &Path, why: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!(
            "{}: {why}; refusing to keep state there (another user could redirect or stall this \
             process). Point ZEUS_STATE_DIR at a directory only uid {} can write",
            path.display(),
            euid()
        ),
    )
}

fn trusted(uid: u32) -> bool {
    uid == 0 || uid == euid()
}

/// Check every component of `dir`'s path (see the module docs), creating the missing ones:
/// parents as the umask says, the last one 0700. Returns the directory.
pub fn ensure_private_dir(dir: &Path) -> io::Result<PathBuf> {
    let dir = std::path::absolute(dir)?;
    let mut at = PathBuf::new();
    let parts: Vec<Component> = dir.components().collect();
    for (k, part) in parts.iter().enumerate() {
        at.push(part);
        if matches!(part, Component::RootDir | Component::Prefix(_)) {
            continue;
        }
        let last = k + 1 == parts.len();
        let link = match fs::symlink_metadata(&at) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                let mut b = fs::DirBuilder::new();
                if last {
                    b.mode(0o700);
                }
                match b.create(&at) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                    Err(e) => {
                        return Err(io::Error::new(e.kind(), format!("{}: {e}", at.display())))
                    }
                }
                fs::symlink_metadata(&at)?
            }
            Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", at.display()))),
        };
        if link.file_type().is_symlink() && !trusted(link.uid()) {
            return Err(refuse(
                &at,
                format!("a symlink owned by uid {}", link.uid()),
            ));
        }
        let m = fs::metadata(&at)
            .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", at.display())))?;
        if !m.is_dir() {
            return Err(refuse(&at, "not a directory".into()));
        }
        let mode = m.permissions().mode();
        if last {
            if m.uid() != euid() {
                return Err(refuse(&at, format!("owned by uid {}", m.uid())));
            }
            if mode & 0o022 != 0 {
                return Err(refuse(
                    &at,
                    format!("writable by others (mode {:o})", mode & 0o7777),
                ));
            }
        } else {
            if !trusted(m.uid()) {
                return Err(refuse(&at, format!("owned by uid {}", m.uid())));
            }
            if mode & 0o022 != 0 && mode & 0o1000 == 0 {
                return Err(refuse(
                    &at,
                    format!(
                        "writable by others and not sticky (mode {:o})",
                        mode & 0o7777
                    ),
                ));
            }
        }
    }
    Ok(dir)
}

/// Open `path` (in a directory [`ensure_private_dir`] checked) for writing, creating it 0600,
/// never through a symlink. An existing file that is not ours or that others may open is
/// replaced by a new one: whoever opened the old one keeps only that.
pub fn open_private_file(path: &Path) -> io::Result<fs::File> {
    let open = |create_new: bool| {
        let mut o = fs::OpenOptions::new();
        o.write(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC);
        if create_new {
            o.create_new(true);
        } else {
            o.create(true).truncate(false);
        }
        o.open(path)
    };
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    match open(false) {
        Ok(f) => {
            let m = f.metadata().map_err(named)?;
            if m.uid() == euid() && m.permissions().mode() & 0o077 == 0 && m.nlink() == 1 {
                return Ok(f);
            }
            drop(f);
            replace(path).map_err(named)?;
            open(true).map_err(named)
        }
        // ELOOP: a symlink where the file should be; it goes, the file is made anew.
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            replace(path).map_err(named)?;
            open(true).map_err(named)
        }
        Err(e) => Err(named(e)),
    }
}

/// Create `path` anew, 0600, never through a symlink: a leftover of that name (a stale
/// temporary file, or a symlink someone placed) is removed first.
pub fn create_private_file(path: &Path) -> io::Result<fs::File> {
    let named = |e: io::Error| io::Error::new(e.kind(), format!("{}: {e}", path.display()));
    replace(path).map_err(named)?;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(named)
}

fn replace(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{chown, symlink};

    /// Whether this process may give files away (root, as in CI): tests of other owners need it.
    fn can_chown() -> bool {
        euid() == 0
    }

    #[test]
    fn creates_the_directory_private() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b/zeus");
        let got = ensure_private_dir(&d).unwrap();
        assert_eq!(got, d);
        let mode = fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // Checking it again is fine.
        ensure_private_dir(&d).unwrap();
    }

    #[test]
    fn refuses_a_directory_others_can_write() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("zeus");
        fs::create_dir(&d).unwrap();
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_private_dir(&d).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("writable by others"), "{e}");
        assert!(e.to_string().contains("ZEUS_STATE_DIR"), "{e}");
    }

    #[test]
    fn refuses_a_directory_or_symlink_another_user_made_first() {
        if !can_chown() {
            eprintln!("skipped: giving files to another uid needs root");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        // As in /var/tmp: a sticky, world-writable parent where another user got there first.
        let tmp = t.path().join("vartmp");
        fs::create_dir(&tmp).unwrap();
        fs::set_permissions(&tmp, fs::Permissions::from_mode(0o1777)).unwrap();
        let d = tmp.join("zeus");
        fs::create_dir(&d).unwrap();
        chown(&d, Some(65534), Some(65534)).unwrap();
        let e = ensure_private_dir(&d).unwrap_err();
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
        // A symlink the other user placed, pointing at a directory of ours.
        let ours = t.path().join("ours");
        fs::create_dir(&ours).unwrap();
        let link = tmp.join("zeus-link");
        symlink(&ours, &link).unwrap();
        std::os::unix::fs::lchown(&link, Some(65534), Some(65534)).unwrap();
        let e = ensure_private_dir(&link).unwrap_err();
        assert!(e.to_string().contains("symlink owned by uid 65534"), "{e}");
        // Our own symlink is followed.
        let mine = t.path().join("mine");
        symlink(&ours, &mine).unwrap();
        fs::set_permissions(&ours, fs::Permissions::from_mode(0o700)).unwrap();
        ensure_private_dir(&mine).unwrap();
        // A parent another user owns is refused too.
        let theirs = t.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = ensure_private_dir(&theirs.join("zeus")).unwrap_err();
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    }

    #[test]
    fn a_file_others_could_open_is_replaced_and_symlinks_are_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join(".lock");
        fs::write(&p, b"").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        // Someone opened it read-only and holds a lock through it.
        let theirs = fs::File::open(&p).unwrap();
        use std::os::unix::io::AsRawFd;
        // SAFETY: flock on descriptors this test owns.
        assert_eq!(unsafe { libc::flock(theirs.as_raw_fd(), libc::LOCK_SH) }, 0);
        let f = open_private_file(&p).unwrap();
        let m = f.metadata().unwrap();
        assert_ne!(m.ino(), theirs.metadata().unwrap().ino(), "a new file");
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        // SAFETY: as above.
        let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        assert_eq!(rc, 0, "their lock does not hold ours");
        // Opening it again keeps it.
        let again = open_private_file(&p).unwrap();
        assert_eq!(again.metadata().unwrap().ino(), m.ino());
        // A symlink in its place is removed, not followed.
        let target = t.path().join("target");
        fs::write(&target, b"keep").unwrap();
        let q = t.path().join(".tmp");
        symlink(&target, &q).unwrap();
        create_private_file(&q).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"keep");
        assert!(!fs::symlink_metadata(&q).unwrap().file_type().is_symlink());
        fs::remove_file(&q).unwrap();
        symlink(&target, &q).unwrap();
        open_private_file(&q).unwrap();
        assert_eq!(fs::read(&target).unwrap(), b"keep");
    }
}
