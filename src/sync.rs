//! The one mutex lock the daemon uses: a panic while a guard was held poisons the mutex,
//! and the data is still the best there is, so the lock is taken anyway.

use std::sync::{Mutex, MutexGuard};

/// Locks `mutex`, poisoned or not.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
