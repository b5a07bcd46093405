//! Wiping key schedules of library types that do not zeroize themselves.
//!
//! ring's `LessSafeKey` keeps the expanded AES key and the GHASH table inline
//! and has no `Drop`; when it goes away those bytes stay in freed memory. We
//! keep such values on the heap behind a raw pointer and, on drop, overwrite
//! their bytes with zeros before freeing the allocation, without ever reading
//! the value again (so no invalid value is ever observed).

use std::alloc::{dealloc, Layout};
use std::ops::Deref;
use std::ptr::NonNull;

/// Marker for types whose whole state lives inline (no heap pointers, no
/// `Drop` with effects), so that zeroing their bytes and freeing them is a
/// complete and sound disposal.
///
/// # Safety
/// Implement only for types that own no heap memory or other resources and
/// whose drop glue does nothing.
pub(crate) unsafe trait InlineKeyState {}

// SAFETY: ring 0.17's LessSafeKey is an enum of inline AES/GHASH state plus a
// `&'static Algorithm`; it owns no allocation and has no Drop impl.
unsafe impl InlineKeyState for ring::aead::LessSafeKey {}

/// A heap-allocated `T` whose bytes are zeroed when it is dropped.
pub(crate) struct Wiped<T: InlineKeyState> {
    ptr: NonNull<T>,
}

// SAFETY: Wiped<T> owns its T exclusively, like Box<T>.
unsafe impl<T: InlineKeyState + Send> Send for Wiped<T> {}
// SAFETY: shared access only hands out &T, like Box<T>.
unsafe impl<T: InlineKeyState + Sync> Sync for Wiped<T> {}

impl<T: InlineKeyState> Wiped<T> {
    pub(crate) fn new(value: T) -> Self {
        let raw = Box::into_raw(Box::new(value));
        // SAFETY: Box::into_raw never returns null.
        let ptr = unsafe { NonNull::new_unchecked(raw) };
        Wiped { ptr }
    }
}

impl<T: InlineKeyState> Deref for Wiped<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // SAFETY: ptr came from Box::into_raw and stays valid until drop.
        unsafe { self.ptr.as_ref() }
    }
}

impl<T: InlineKeyState> Drop for Wiped<T> {
    fn drop(&mut self) {
        let layout = Layout::new::<T>();
        let bytes = self.ptr.as_ptr().cast::<u8>();
        // SAFETY: the allocation is `layout.size()` bytes, owned by us, and
        // not used after this point; volatile writes keep the compiler from
        // eliding the wipe. T needs no drop (InlineKeyState), so freeing
        // without running drop glue leaks nothing.
        unsafe {
            for i in 0..layout.size() {
                std::ptr::write_volatile(bytes.add(i), 0);
            }
            std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
            if layout.size() != 0 {
                dealloc(bytes, layout);
            }
        }
    }
}
