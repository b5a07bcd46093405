//! Wiping key schedules of library types that do not zeroize themselves.
//!
//! ring's `LessSafeKey` keeps the expanded AES key and the GHASH table inline
//! and has no `Drop`; when it goes away those bytes stay in freed memory. We
//! keep such values on the heap behind a raw pointer and, on drop, overwrite
//! their bytes with zeros before freeing the allocation, without ever reading
//! the value again (so no invalid value is ever observed).
//!
//! Building such a value leaves copies too: ring returns the key by value
//! through several functions (`UnboundKey::new`, `LessSafeKey::new`, a
//! `Result`), and each may hold it, and the GHASH key H it was derived
//! from, in its stack frame; moving the finished key into a `Box` adds
//! another. [`Wiped::try_new_with`] therefore allocates first, runs the
//! constructor in a frame of its own that writes the value straight into
//! the allocation, and then overwrites the stack those frames used (see
//! [`scrub_stack`]).

use std::alloc::{dealloc, Layout};
use std::hint::black_box;
use std::mem::{needs_drop, MaybeUninit};
use std::ops::Deref;
use std::ptr::NonNull;

use zeroize::Zeroize;

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

// A ring upgrade that gives the key a Drop (perhaps one owning memory) must
// not build: freeing it without running drop glue would then leak, or skip
// the library's own cleanup. `Wiped` checks the same for every T it holds.
const _: () = assert!(!needs_drop::<ring::aead::LessSafeKey>());

/// A heap-allocated `T` whose bytes are zeroed when it is dropped.
pub(crate) struct Wiped<T: InlineKeyState> {
    ptr: NonNull<T>,
}

// SAFETY: Wiped<T> owns its T exclusively, like Box<T>.
unsafe impl<T: InlineKeyState + Send> Send for Wiped<T> {}
// SAFETY: shared access only hands out &T, like Box<T>.
unsafe impl<T: InlineKeyState + Sync> Sync for Wiped<T> {}

impl<T: InlineKeyState> Wiped<T> {
    /// Refuses, at compile time, a T with drop glue (see InlineKeyState).
    const NO_DROP_GLUE: () = assert!(!needs_drop::<T>(), "a wiped key must need no drop");

    /// Builds a value in its wiped heap slot: `init` runs in a frame of its
    /// own ([`construct_into`]) whose result is written into the allocation,
    /// then the stack that frame and everything it called used is
    /// overwritten ([`scrub_stack`]). No copy of the key made while building
    /// it stays on the stack, as far as the compiler keeps those copies in
    /// the frames below this one, which it does unless it inlines
    /// `construct_into` (forbidden) or grows the caller's frame with them.
    /// What remains: vector registers ring's assembly used (overwritten by
    /// the next AES or memcpy work), the raw key bytes the caller passed in
    /// (the caller's to wipe), and per-message temporaries of sealing and
    /// opening (counter blocks, the tag mask), which ring keeps on the stack
    /// while it works on the key in place, by reference.
    pub(crate) fn try_new_with<E>(init: impl FnOnce() -> Result<T, E>) -> Result<Self, E> {
        let () = Self::NO_DROP_GLUE;
        let mut slot: Box<MaybeUninit<T>> = Box::new_uninit();
        let built = construct_into(&mut slot, init);
        scrub_stack();
        built?;
        // SAFETY: construct_into returned Ok, so it wrote the value.
        let raw = Box::into_raw(unsafe { slot.assume_init() });
        // SAFETY: Box::into_raw never returns null.
        let ptr = unsafe { NonNull::new_unchecked(raw) };
        Ok(Wiped { ptr })
    }
}

/// Runs `init` and writes its value into `slot`. Never inlined, so that the
/// copies `init` and its callees make live in frames below the caller's,
/// where [`scrub_stack`] reaches them.
#[inline(never)]
fn construct_into<T, E>(
    slot: &mut MaybeUninit<T>,
    init: impl FnOnce() -> Result<T, E>,
) -> Result<(), E> {
    slot.write(init()?);
    Ok(())
}

/// How much stack below the caller's frame [`scrub_stack`] overwrites.
/// Building an AES-256-GCM `LessSafeKey` (about 560 bytes) by value left
/// copies of its first round key on the stack: nine, down to 4 KiB below
/// the caller, in a release build; over thirty, down to 22 KiB, in a debug
/// build (measured by the test `building_leaves_no_key_on_the_stack`).
/// 32 KiB covers both. It costs about 6 µs (release), next to 4 µs for
/// building the key, twice per encrypted session, and stays far from the
/// end of a 2 MiB thread stack.
const SCRUB_BYTES: usize = 32 * 1024;

/// Overwrites [`SCRUB_BYTES`] of the stack below the caller's frame: the
/// region where the frames of the functions it called before lived. Never
/// inlined, so that its buffer is placed there and not in the caller's
/// frame; `zeroize` writes volatile, so the writes are not elided.
#[inline(never)]
fn scrub_stack() {
    let mut scratch = [0u8; SCRUB_BYTES];
    scratch.zeroize();
    black_box(&scratch);
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

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use ring::aead::{LessSafeKey, UnboundKey, AES_256_GCM};

    /// Copies the `out.len()` bytes of this thread's stack just below the
    /// stack pointer into `out`: the dead frames of the functions called
    /// before. In assembly, because reading memory no Rust value owns is
    /// not expressible in Rust; no call on the way, so nothing overwrites
    /// that memory first.
    #[inline(never)]
    fn dead_stack(out: &mut [u8]) {
        // SAFETY: reads out.len() bytes below the stack pointer, inside the
        // test thread's stack (2 MiB; we are near its top), and writes only
        // into `out`.
        unsafe {
            std::arch::asm!(
                "mov rsi, rsp",
                "sub rsi, rcx",
                "rep movsb",
                inout("rcx") out.len() => _,
                inout("rdi") out.as_mut_ptr() => _,
                out("rsi") _,
                options(nostack),
            );
        }
    }

    /// How far below the stack pointer each copy of `needle` lies.
    fn depths(stack: &[u8], needle: &[u8]) -> Vec<usize> {
        let at = stack.windows(needle.len()).enumerate();
        at.filter(|(_, w)| *w == needle)
            .map(|(i, _)| stack.len() - i)
            .collect()
    }

    #[inline(never)]
    fn build_wiped(key: &[u8]) -> Wiped<LessSafeKey> {
        Wiped::try_new_with(|| UnboundKey::new(&AES_256_GCM, key).map(LessSafeKey::new))
            .expect("a 32-byte key")
    }

    /// How the key was built before: on the stack, then moved to the heap.
    #[inline(never)]
    fn build_moved(key: &[u8]) -> Box<LessSafeKey> {
        Box::new(LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, key).expect("a 32-byte key"),
        ))
    }

    /// The first AES round key is the key itself, so a copy of the key
    /// schedule on the stack shows as the key's bytes there. The key lives
    /// on the heap only, so any copy on the stack is one the building made.
    #[test]
    fn building_leaves_no_key_on_the_stack() {
        let key: Vec<u8> = (0..32u8).map(|i| i.wrapping_mul(37) ^ 0xA5).collect();
        let mut stack = vec![0u8; 4 * SCRUB_BYTES];

        let wiped = build_wiped(&key);
        dead_stack(&mut stack);
        let after_wiped = depths(&stack, &key[..16]);

        let moved = build_moved(&key);
        dead_stack(&mut stack);
        let after_moved = depths(&stack, &key[..16]);

        println!("key copies on the stack, bytes deep: built in place {after_wiped:?}, moved {after_moved:?}");
        assert!(
            after_wiped.is_empty(),
            "copies of the key schedule stayed on the stack"
        );
        // The control: without the scrub, copies stay, within the scrubbed
        // depth. (If a compiler ever leaves none, this check proves nothing
        // for that build, but nothing is wrong either.)
        if let Some(depth) = after_moved.iter().max() {
            assert!(
                *depth < SCRUB_BYTES,
                "copies {depth} bytes deep: scrub more"
            );
        }
        // Both keys are the same key.
        let seal = |k: &LessSafeKey| {
            let nonce = ring::aead::Nonce::assume_unique_for_key([7; 12]);
            let mut data = *b"message";
            k.seal_in_place_separate_tag(nonce, ring::aead::Aad::empty(), &mut data)
                .map(|tag| (data, tag.as_ref().to_vec()))
                .expect("seal")
        };
        assert_eq!(seal(&wiped), seal(&moved));
    }
}
