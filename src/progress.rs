//! Progress of long computations (a search's layouts, an evaluation's refits), reported to
//! whoever shows it — the command line draws a bar — without the library knowing how.

/// Told how much work there is, then each time a piece of it is done. Called from worker
/// threads, so it must be `Sync`.
pub trait Progress: Sync {
    /// `total` pieces of `what` (e.g. "layouts") are about to be done.
    fn start(&self, what: &str, total: u64);
    /// One more piece is done.
    fn advance(&self);
}

/// Progress nobody watches.
pub struct Unwatched;

impl Progress for Unwatched {
    fn start(&self, _: &str, _: u64) {}
    fn advance(&self) {}
}
