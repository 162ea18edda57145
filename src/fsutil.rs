//! File helpers: atomic writes (temporary file + rename) so a crash never leaves half a model
//! or metadata file behind.

use std::fs;
use std::io::Write;
use std::path::Path;

use crate::error::{Error, Result};

/// The directory a file is in: its parent, `.` for a bare file name.
pub fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    write_atomic_with(path, |w| w.write_all(bytes))
}

/// Like `write_atomic`, for content streamed by `write` into a buffered writer.
pub fn write_atomic_with(
    path: &Path,
    write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
) -> Result<()> {
    let dir = dir_of(path);
    fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // created exclusively with an unpredictable name beside the target, removed if anything
    // fails before the rename; readable like any file the user writes (0644 on Unix)
    let result = (|| {
        let prefix = format!(".{file_name}.");
        let mut builder = tempfile::Builder::new();
        builder.prefix(&prefix).suffix(".tmp");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            builder.permissions(fs::Permissions::from_mode(0o644));
        }
        let tmp = builder.tempfile_in(dir)?;
        let mut buf = std::io::BufWriter::new(tmp);
        write(&mut buf)?;
        let tmp = buf.into_inner().map_err(|e| e.into_error())?;
        tmp.as_file().sync_all()?;
        tmp.persist(path).map_err(|e| e.error)?;
        Ok(())
    })();
    result.map_err(|e: std::io::Error| Error::io(path, e))
}

/// The lock file a directory is locked with while stepcast writes it.
pub const LOCK_FILE: &str = ".stepcast.lock";

/// A lock on a directory stepcast writes (a dataset being collected, a models directory being
/// trained): held until dropped, released by the operating system if the process dies.
#[derive(Debug)]
pub struct DirLock {
    _file: Option<fs::File>,
}

impl DirLock {
    /// Locks `dir` for writing; fails at once, naming the directory, if another process holds
    /// it for reading or writing.
    pub fn exclusive(dir: &Path) -> Result<DirLock> {
        Self::take(dir, true)
    }

    /// Locks `dir` for reading: fails at once if a writer holds it.
    pub fn shared(dir: &Path) -> Result<DirLock> {
        Self::take(dir, false)
    }

    fn take(dir: &Path, exclusive: bool) -> Result<DirLock> {
        if !exclusive && !dir.is_dir() {
            // nothing to read: the reader says so in its own words
            return Ok(DirLock { _file: None });
        }
        let path = dir.join(LOCK_FILE);
        let opened = fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&path);
        let file = match opened {
            Ok(f) => f,
            Err(e) if reads_without_a_lock(exclusive, &e) => return Ok(DirLock { _file: None }),
            Err(e) => return Err(Error::io(&path, e)),
        };
        let taken = if exclusive {
            file.try_lock()
        } else {
            file.try_lock_shared()
        };
        match taken {
            Ok(()) => Ok(DirLock { _file: Some(file) }),
            Err(fs::TryLockError::WouldBlock) => Err(Error::bad_file(
                dir,
                if exclusive {
                    "another stepcast is using this directory (collecting, training or reading \
                     it): wait for it to finish, or write to another directory"
                } else {
                    "another stepcast is writing this directory: wait for it to finish"
                },
            )),
            Err(fs::TryLockError::Error(e)) => Err(Error::io(&path, e)),
        }
    }
}

/// A reader of a directory it cannot write (a read-only share or file system) goes without a
/// lock: nobody can be writing it through us, and there is no lock file to take.
fn reads_without_a_lock(exclusive: bool, open_error: &std::io::Error) -> bool {
    const EROFS: i32 = 30;
    !exclusive
        && (open_error.kind() == std::io::ErrorKind::PermissionDenied
            || open_error.raw_os_error() == Some(EROFS))
}

pub fn read_to_string(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|e| Error::io(path, e))
}

/// Parses a YAML file into `T`, naming the file (and the serde path of the bad field) on error.
pub fn read_yaml<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = read_to_string(path)?;
    parse_yaml(path, &text)
}

/// Parses YAML text that came from `path` (named in the message on error).
pub fn parse_yaml<T: serde::de::DeserializeOwned>(path: &Path, text: &str) -> Result<T> {
    serde_norway::from_str(text).map_err(|e| Error::bad_file(path, parse_message(&e)))
}

pub fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T> {
    let text = read_to_string(path)?;
    serde_json::from_str(&text).map_err(|e| Error::bad_file(path, parse_message(&e)))
}

/// Longest quoted value a parse error repeats in full; a longer one is cut to its start.
const QUOTED_CHARS_SHOWN: usize = 60;

/// A parser's error as one readable line: the values it quotes from the file cut to their
/// first characters, so a wrong file given as a YAML (a whole `/etc/passwd` is one string to
/// YAML) names its first line instead of printing the file back; a switch written as a word
/// (`on`, `yes`: strings to YAML 1.2 and JSON) gets the spelling that works.
pub fn parse_message(error: &impl std::fmt::Display) -> String {
    let mut out = quoted_values_cut(error);
    if out.contains("expected a boolean") {
        out.push_str(" (write true or false)");
    }
    out
}

fn quoted_values_cut(error: &impl std::fmt::Display) -> String {
    let text = error.to_string();
    let mut out = String::with_capacity(text.len().min(512));
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        out.push(c);
        if c != '"' {
            continue;
        }
        // a quoted value: up to the closing quote, escapes kept whole
        let mut value = String::new();
        let mut closed = false;
        while let Some(v) = chars.next() {
            if v == '\\' {
                value.push(v);
                if let Some(escaped) = chars.next() {
                    value.push(escaped);
                }
                continue;
            }
            if v == '"' {
                closed = true;
                break;
            }
            value.push(v);
        }
        let n = value.chars().count();
        if n > QUOTED_CHARS_SHOWN {
            out.extend(value.chars().take(QUOTED_CHARS_SHOWN));
            out.push_str(&format!("…\" ({n} characters)"));
        } else {
            out.push_str(&value);
            if closed {
                out.push('"');
            }
        }
    }
    out
}

/// A value as a refusal repeats it: whole up to 60 characters, else its start and its length,
/// so a file pasted where a flag's value belongs does not fill the terminal.
pub fn shortened(value: &str) -> String {
    let n = value.chars().count();
    if n <= QUOTED_CHARS_SHOWN {
        return value.to_string();
    }
    let head: String = value.chars().take(QUOTED_CHARS_SHOWN).collect();
    format!("{head}… ({n} characters)")
}

/// Today's date (UTC) as YYYY-MM-DD, from the system clock.
pub fn today_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    date_of_day(secs / 86_400)
}

/// The date (YYYY-MM-DD) `days` days after 1970-01-01 (civil-from-days, Howard Hinnant).
fn date_of_day(days: u64) -> String {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_shortened_only_past_the_characters_shown() {
        let exact = "é".repeat(QUOTED_CHARS_SHOWN);
        assert_eq!(shortened(&exact), exact);
        assert_eq!(shortened(""), "");
        let long = format!("{exact}xyz");
        assert_eq!(shortened(&long), format!("{exact}… (63 characters)"));
    }

    #[test]
    fn a_parse_error_cuts_long_quoted_values_and_keeps_short_ones() {
        let long = format!(
            "invalid type: string \"{}\", expected struct ArchSpec",
            "ab".repeat(500)
        );
        let m = parse_message(&long);
        assert!(m.starts_with("invalid type: string \"abab"), "{m}");
        assert!(
            m.contains("…\" (1000 characters), expected struct ArchSpec"),
            "{m}"
        );
        assert!(m.len() < 140, "{m}");
        let short = "unknown variant `x`, expected \"a \\\"b\\\"\" at line 2";
        assert_eq!(parse_message(&short), short);
        let switch = "parallel.tp_comm_overlap: invalid type: string \"on\", expected a boolean";
        assert_eq!(
            parse_message(&switch),
            format!("{switch} (write true or false)")
        );
        assert_eq!(parse_message(&"unclosed \"abc"), "unclosed \"abc");
        // exactly the most characters shown is kept whole; one more is cut
        let at_most = format!("value \"{}\"", "x".repeat(QUOTED_CHARS_SHOWN));
        assert_eq!(parse_message(&at_most), at_most);
        let one_more = format!("value \"{}\"", "x".repeat(QUOTED_CHARS_SHOWN + 1));
        assert!(parse_message(&one_more).ends_with("…\" (61 characters)"));
    }

    /// Days since 1970 against dates Python's `datetime` gives: leap days, the turn of a
    /// century that is not a leap year (2100) and of one that is (2000, 2400).
    #[test]
    fn days_become_dates_across_leap_years_and_centuries() {
        for (days, date) in [
            (0, "1970-01-01"),
            (364, "1970-12-31"),
            (789, "1972-02-29"),
            (10_956, "1999-12-31"),
            (11_016, "2000-02-29"),
            (11_017, "2000-03-01"),
            (20_788, "2026-12-01"),
            (47_540, "2100-02-28"),
            (47_541, "2100-03-01"),
            (157_113, "2400-02-29"),
            (2_932_896, "9999-12-31"),
        ] {
            assert_eq!(date_of_day(days), date, "{days}");
        }
    }

    #[test]
    fn today_is_a_plausible_date() {
        let d = today_utc();
        assert_eq!(d.len(), 10);
        assert!(
            d.as_str() > "2024-01-01" && d.as_str() < "2100-01-01",
            "{d}"
        );
        // the year the clock's seconds make in Gregorian years of 365.2425 days
        let secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let year = 1970 + secs / 31_556_952;
        let shown: u64 = d[..4].parse().unwrap();
        assert!(shown.abs_diff(year) <= 1, "{d} in about {year}");
    }

    #[test]
    fn a_locked_directory_refuses_a_second_writer_until_released() {
        let dir = tempfile::tempdir().unwrap();
        let first = DirLock::exclusive(dir.path()).unwrap();
        let e = DirLock::exclusive(dir.path()).unwrap_err().to_string();
        assert!(e.contains("another stepcast"), "{e}");
        assert!(DirLock::shared(dir.path()).is_err());
        drop(first);
        let a = DirLock::shared(dir.path()).unwrap();
        let _b = DirLock::shared(dir.path()).unwrap();
        assert!(DirLock::exclusive(dir.path()).is_err());
        drop(a);
    }

    #[test]
    fn a_reader_of_a_missing_directory_takes_no_lock_and_creates_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("absent");
        DirLock::shared(&missing).unwrap();
        assert!(!missing.exists());
        let e = DirLock::exclusive(&missing).unwrap_err().to_string();
        assert!(e.contains(LOCK_FILE), "{e}");
        assert!(!missing.exists());
    }

    /// Only a reader that cannot write the directory goes without a lock; any other failure to
    /// open the lock file (here: it is a directory) is an error for readers and writers alike.
    #[test]
    fn a_lock_file_that_cannot_be_opened_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir(dir.path().join(LOCK_FILE)).unwrap();
        for lock in [DirLock::shared(dir.path()), DirLock::exclusive(dir.path())] {
            let e = lock.unwrap_err().to_string();
            assert!(e.contains(LOCK_FILE), "{e}");
        }
    }

    /// Tests may run as root, which is never refused a write, so the two errors a read-only
    /// directory gives are made here rather than met.
    #[test]
    fn only_a_reader_of_a_read_only_directory_goes_without_a_lock() {
        use std::io::{Error as IoError, ErrorKind};
        let denied = IoError::from(ErrorKind::PermissionDenied);
        let read_only = IoError::from_raw_os_error(30);
        let other = IoError::from(ErrorKind::NotFound);
        assert!(reads_without_a_lock(false, &denied));
        assert!(reads_without_a_lock(false, &read_only));
        assert!(!reads_without_a_lock(false, &other));
        for e in [denied, read_only, other] {
            assert!(!reads_without_a_lock(true, &e));
        }
    }

    #[test]
    fn a_failed_write_keeps_the_old_file_and_leaves_no_temporary() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("model.json");
        write_atomic(&p, b"old").unwrap();
        let e = write_atomic_with(&p, |w| {
            w.write_all(b"half")?;
            Err(std::io::Error::other("disk full"))
        })
        .unwrap_err()
        .to_string();
        assert!(e.contains("model.json") && e.contains("disk full"), "{e}");
        assert_eq!(fs::read_to_string(&p).unwrap(), "old");
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn a_bare_file_name_lies_in_the_current_directory() {
        assert_eq!(dir_of(Path::new("m.bin")), Path::new("."));
        assert_eq!(dir_of(Path::new("a/b/m.bin")), Path::new("a/b"));
        assert_eq!(dir_of(Path::new("/m.bin")), Path::new("/"));
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporaries() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("sub/model.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "two");
        let names: Vec<_> = fs::read_dir(p.parent().unwrap()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
