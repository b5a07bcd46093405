//! The end of every input: what is left under way is brought to an end
//! the way clients and timers would, and then nothing may be left.

use nimbus_state::caching::{self, Holder};
use nimbus_state::FileKey;

use crate::check;
use crate::input::{FILES, MAX_OPS};
use crate::world::World;

impl World {
    /// The end of the story: stalled CREATEs go ahead; every break under
    /// way is acknowledged with what it asked (`ack`) or else times out;
    /// then one handle closes; again, until nothing is left. Every request
    /// that waited must have been answered by then, and no state kept.
    pub fn drain(&mut self, ack: bool) {
        // Each round closes a handle, and every handle comes from one of the
        // input's CREATEs; breaks within a round are bounded likewise.
        let rounds = 4 * MAX_OPS + 16;
        for _ in 0..rounds {
            while !self.stalled.is_empty() {
                self.finish(0, false);
                check::world(self);
            }
            let mut budget = 16 * MAX_OPS;
            while let Some((file, holder, sent)) = self.oplocks.first_breaking() {
                budget -= 1;
                assert!(budget > 0, "breaks keep starting while others end");
                self.end_break(file, holder, sent, ack);
                check::world(self);
            }
            if self.opens.is_empty() && self.stalled.is_empty() {
                break;
            }
            if !self.opens.is_empty() {
                self.close(0);
                check::world(self);
            }
        }
        self.assert_quiescent();
    }

    fn end_break(&mut self, file: FileKey, holder: Holder, sent: u32, ack: bool) {
        if ack {
            let (result, woken) = match holder {
                Holder::Oplock(id) => {
                    self.oplocks
                        .ack_oplock(file, id, caching::oplock_level(sent))
                }
                Holder::Lease(id) => self
                    .oplocks
                    .ack_lease(id, sent)
                    .unwrap_or_else(|| panic!("lease {id:?} breaking on {file:?} is unknown")),
            };
            assert!(
                result.is_ok(),
                "acknowledging what {holder:?} was told ({sent:#x}) refused: {result:?}"
            );
            return self.run(woken);
        }
        let t = self
            .oplocks
            .timers
            .iter()
            .position(|t| t.file == file && t.holder == holder && self.oplocks.live(t))
            .unwrap_or_else(|| panic!("break of {holder:?} on {file:?} has no timer"));
        let t = self.oplocks.timers.remove(t);
        self.fire(t);
    }

    fn assert_quiescent(&self) {
        assert!(self.opens.is_empty(), "handles left: {:?}", self.opens);
        assert!(
            self.outstanding.is_empty(),
            "requests never answered: {:?} (waiting: {:?})",
            self.outstanding,
            self.waiters()
        );
        assert!(
            self.oplocks.files.is_empty(),
            "caching state left: {:?}",
            self.oplocks.files
        );
        assert!(
            self.oplocks.lease_files.is_empty(),
            "leases left: {:?}",
            self.oplocks.lease_files
        );
        assert!(
            self.locks.files.is_empty(),
            "locks left: {:?}",
            self.locks.files
        );
        for file in 0..FILES {
            for generation in 0..=self.generation[file] {
                let key = FileKey {
                    dev: 1,
                    ino: file as u64,
                    gen: generation,
                };
                let rec = self.shares.record(key).expect("memory store");
                assert!(rec.opens.is_empty(), "share modes left on {key:?}: {rec:?}");
            }
        }
    }
}
