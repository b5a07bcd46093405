//! How much memory the process holds, for the metrics: what the allocator
//! has handed out and not had back (the heap in use), and what the kernel
//! counts against the process (its resident set). The two tell a leak from
//! an allocator that keeps freed pages: a leak grows the first, while
//! fragmentation and per-thread arenas grow only the second.
//!
//! The heap figure is glibc's own count (`mallinfo2`: the binary needs
//! glibc 2.33 or later, as Debian 12 and every supported distribution
//! has), read when the gauges are refreshed; no allocation is wrapped,
//! so the data path pays nothing for it. Elsewhere (musl, other systems)
//! it is None and the gauge is not set.

/// Bytes the allocator has handed out and not had back: small blocks in
/// its arenas and large ones mapped on their own.
pub fn heap_in_use() -> Option<u64> {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        // SAFETY: mallinfo2 takes no arguments and only reads the
        // allocator's statistics under its own locks.
        let info = unsafe { libc::mallinfo2() };
        Some(info.uordblks as u64 + info.hblkhd as u64)
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    {
        None
    }
}

/// The resident set in bytes, from /proc/self/statm (its second field, in
/// pages); None where there is no /proc.
pub fn resident() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    // SAFETY: sysconf only reads a system constant.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    (page > 0).then(|| pages * page as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_held_shows_in_the_heap_and_its_free_takes_it_away() {
        let Some(before) = heap_in_use() else { return };
        // Mapped on its own, and far larger than what the other tests
        // running beside this one allocate or free meanwhile.
        let block = std::hint::black_box(vec![1u8; 256 << 20]);
        let held = heap_in_use().unwrap_or(0);
        assert!(held >= before + (192 << 20), "{before} then {held}");
        drop(std::hint::black_box(block));
        let after = heap_in_use().unwrap_or(u64::MAX);
        assert!(after + (192 << 20) <= held, "{held} then {after}");
        assert!(resident().is_some_and(|r| r > 0));
    }
}
